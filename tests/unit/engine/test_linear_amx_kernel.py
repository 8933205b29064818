"""The block-quantized bf16 linear kernel on AMX tiles (inference/engine/kernels/linear_amx.c): it multiplies exactly
the bf16 weights (the GGUF blocks' float32 values rounded to nearest even), matches F.linear on them for every row
and feature tail, computes LlamaMLP's SiLU-and-multiply, refuses what it does not take, leaves oneDNN's tiles
working, and a bf16 runner on such a CPU takes its 2-64-row steps through it."""

import copy

import pytest
import torch
import torch.nn.functional as F

from inference.engine import block_quant
from inference.engine.block_quant import BlockWeight
from inference.engine.kernels import LinearAmx, linear_amx
from inference.engine.kv_cache import KVCache
from inference.engine.loader import checkpoint_blocks
from inference.engine.runner import ModelRunner, StepBatch
from tests.unit.engine.helpers import gguf_roundtrip, needs_gcc, record_calls

pytestmark = needs_gcc


@pytest.fixture(scope="module")
def kernel():
    found = linear_amx()
    if found is None:
        pytest.skip("this CPU (or kernel) gives no AMX tiles")
    return found


def blocks_of(n: int, k: int, kind: str, seed: int) -> tuple[BlockWeight, torch.Tensor]:
    """A GGUF round-tripped ``[n, k]`` weight in block form and as the bf16 weight the engine would hold."""
    weight = gguf_roundtrip(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05, kind)
    block = block_quant.recover(weight)
    assert block is not None and block.kind == kind
    return block, weight.bfloat16()


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    # exact bf16 products summed in float32 in another order, then one bf16 rounding of the output
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2 * float(want.abs().max()))


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_it_multiplies_exactly_the_bf16_weights(kernel, kind):
    block, wb = blocks_of(48, 96, kind, seed=1)
    picks = torch.tensor([0, 5, 31, 32, 63, 95, 17])
    x = torch.zeros(len(picks), 96, dtype=torch.bfloat16)
    x[torch.arange(len(picks)), picks] = 1.0  # row i picks input picks[i]: y[i] = W[:, picks[i]]

    assert torch.equal(kernel(x, block, None), wb[:, picks].T)


# n: 960 = 30 blocks of 32 features; 48 ends in a block of one A tile. m: row tiles of 16, passes of 32 rows.
@pytest.mark.parametrize(("n", "k", "kind"), [(960, 576, "q4_1"), (48, 1536, "q4_1"), (80, 64, "q8_0")])
@pytest.mark.parametrize("m", [1, 2, 15, 16, 17, 32, 33, 70])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_f_linear_on_the_bf16_weights(kernel, n, k, kind, m, with_bias):
    block, wb = blocks_of(n, k, kind, seed=n + m)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None

    got = kernel(x, block, bias)

    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    close(got, F.linear(x.float(), wb.float(), None if bias is None else bias.float()))


@pytest.mark.parametrize("m", [1, 7, 32, 40])
def test_swiglu_matches_silu_of_gate_times_up(kernel, m):
    inter, k = 64, 576
    block, wb = blocks_of(2 * inter, k, "q4_1", seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()

    got = kernel(x, block, None, swiglu=True)

    gu = F.linear(x.float(), wb.float())
    assert got.shape == (m, inter)
    close(got, F.silu(gu[:, :inter]) * gu[:, inter:])


def test_swiglu_of_a_very_negative_gate_is_zero_not_nan(kernel):
    # gate = -127 * d * x0 for every feature; with x0 large the gate is far below -88, where exp(-g) overflows.
    n, k = 64, 32
    qs = torch.zeros(n, k, dtype=torch.int8)
    qs[: n // 2, 0] = -127
    qs[n // 2 :, 1] = 1
    block = BlockWeight("q8_0", qs, torch.ones(n, 1), None)
    x = torch.zeros(2, k, dtype=torch.bfloat16)
    x[:, 0] = torch.tensor([1.0, 1e30])
    x[:, 1] = torch.tensor([3.0, 1e30])

    got = kernel(x, block, None, swiglu=True).float()

    assert torch.isfinite(got).all() and torch.equal(got[1], torch.zeros(n // 2))
    torch.testing.assert_close(got[0], (F.silu(torch.tensor(-127.0)) * 3.0).expand(n // 2), rtol=1e-2, atol=0)


def test_no_rows_give_no_rows(kernel):
    block, _ = blocks_of(32, 64, "q4_1", seed=0)
    assert kernel(torch.empty(0, 64, dtype=torch.bfloat16), block, None).shape == (0, 32)


def test_refuses_what_it_does_not_take(kernel):
    block, _ = blocks_of(48, 64, "q4_1", seed=0)
    x = torch.randn(2, 64).bfloat16()
    with pytest.raises(ValueError):
        kernel(x.float(), block, None)  # float32 input
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 96).bfloat16(), block, None)  # in-features differ from the blocks'
    with pytest.raises(ValueError):
        kernel(x, block, torch.randn(16).bfloat16())  # bias of the wrong width
    with pytest.raises(ValueError):
        kernel(x, block, None, swiglu=True)  # 48 features: gate and up not whole tiles of 16 each
    odd, _ = blocks_of(40, 64, "q4_1", seed=0)
    assert not LinearAmx.supports(odd)
    with pytest.raises(ValueError):
        kernel(x, odd, None)  # features not a multiple of 16
    pair, _ = blocks_of(64, 64, "q4_1", seed=0)
    with pytest.raises(ValueError):
        kernel(x, pair, torch.zeros(64).bfloat16(), swiglu=True)  # no bias there


def test_onednn_bf16_matmuls_still_work_after_it(kernel):
    # The kernel loads its own tile configuration and restores the thread's one after: oneDNN's AMX matmuls
    # (which may keep theirs loaded between calls) must give the same results before and after.
    gen = torch.Generator().manual_seed(0)
    a, w = torch.randn(512, 576, generator=gen).bfloat16(), torch.randn(960, 576, generator=gen).bfloat16()
    before = F.linear(a, w)
    block, _ = blocks_of(960, 576, "q4_1", seed=3)
    kernel(torch.randn(32, 576).bfloat16(), block, None)
    assert torch.equal(F.linear(a, w), before)


def bf16_runner(loaded, tmp_path) -> ModelRunner:
    """A bf16 runner of the GGUF tiny model with the float32 checkpoint's blocks (as the loader gives them)."""
    loaded.model.save_pretrained(tmp_path)
    cfg = loaded.model.config
    kv = KVCache(
        cfg.num_hidden_layers, cfg.num_key_value_heads, 16, 2, 64, 128, torch.bfloat16, torch.device("cpu")
    )
    model = copy.deepcopy(loaded.model).to(torch.bfloat16)
    return ModelRunner(model, kv, max_positions=64, block_weights=checkpoint_blocks(tmp_path))


def test_a_bf16_runner_takes_its_2_to_64_row_steps_through_the_kernel(kernel, gguf_tiny_loaded, tmp_path):
    runner = bf16_runner(gguf_tiny_loaded, tmp_path)
    linears = [
        runner.lm_head,
        *(getattr(lw, p) for lw in runner.layers for p in ("qkv", "o", "gate_up", "down")),
    ]
    assert all(op.kernel_for(2) == op.kernel_for(64) for op in linears)
    assert all(op.kernel_for(64) in ("linear_amx", "linear_amx_swiglu") for op in linears)
    assert all(lw.gate_up.kernel_for(65) == "onednn_swiglu" for lw in runner.layers)

    calls = []
    for lw in runner.layers:
        record_calls(lw.qkv, "linear_amx", calls)
    tokens = list(range(300, 340))
    batch = StepBatch(
        token_ids=tokens, positions=list(range(40)), slots=[1] * 40, prefills=[(1, 0, 40)], logit_rows=[39]
    )
    with torch.inference_mode():
        got = runner.forward(batch)[0].float()
        want = gguf_tiny_loaded.model(torch.tensor([tokens])).logits[0, -1]
    assert calls == [40] * len(runner.layers)  # 40 prompt rows: through the kernel
    torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2 * float(want.abs().max()))
