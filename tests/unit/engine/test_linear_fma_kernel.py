"""The panel-packed float32 linear kernel (inference/engine/kernels/linear_fma.c): its packing is the layout it
claims, it matches F.linear (and LlamaMLP's SiLU-and-multiply) for every row-block and row-chunk tail and the widths
its blocks do not divide, it refuses what it does not take, and a float32 runner on such a CPU uses it in place of
oneDNN for every step past the few-rows kernels."""

import copy

import pytest
import torch
import torch.nn.functional as F

from inference.engine import block_quant
from inference.engine import runner as runner_module
from inference.engine.kernels import linear_fma
from inference.engine.kv_cache import KVCache
from inference.engine.loader import cpu_has_avx512
from inference.engine.runner import ModelRunner, StepBatch
from tests.unit.engine.helpers import gguf_roundtrip, needs_gcc

pytestmark = needs_gcc


@pytest.fixture(scope="module")
def kernel():
    found = linear_fma()
    if found is None:
        pytest.skip("this CPU has no AVX2 and FMA")
    return found


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    # float32 sums in another order than MKL's: a few float32 ulps of the largest output apart.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max().clamp(min=1.0)))


def test_packing_is_the_panel_layout(kernel):
    n, k = 48, 40
    w = torch.randn(n, k)
    assert torch.equal(kernel.pack(w), w.view(n // 8, 8, k).transpose(1, 2).reshape(n, k))
    # swiglu: gate panel j, then up panel j
    gate, up = w[: n // 2], w[n // 2 :]
    interleaved = torch.stack([gate.view(n // 16, 8, k), up.view(n // 16, 8, k)], 1).reshape(n, k)
    want = interleaved.view(n // 8, 8, k).transpose(1, 2).reshape(n, k)
    assert torch.equal(kernel.pack(w, swiglu=True), want)


# n: 960 = 60 blocks of 16 columns; 72 leaves a last block of one panel, 8 is that panel alone. k: any width.
# m: every row-block tail (blocks of 6), and past one chunk of 96 rows (97, 200).
@pytest.mark.parametrize(("n", "k"), [(960, 576), (72, 1536), (8, 3)])
@pytest.mark.parametrize("m", [1, 5, 6, 7, 32, 97, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_f_linear(kernel, n, k, m, with_bias):
    gen = torch.Generator().manual_seed(n + m)
    w = torch.randn(n, k, generator=gen)
    bias = torch.randn(n, generator=gen) if with_bias else None
    x = torch.randn(m, k, generator=gen)

    got = kernel(x, kernel.pack(w), bias)

    assert got.shape == (m, n) and got.dtype == torch.float32
    close(got, F.linear(x, w, bias))


def test_no_rows_give_no_rows(kernel):
    w = torch.randn(32, 64)
    assert kernel(torch.empty(0, 64), kernel.pack(w), None).shape == (0, 32)


@pytest.mark.parametrize(("inter", "k"), [(1536, 576), (24, 64)])
@pytest.mark.parametrize("m", [1, 7, 32, 100])
def test_swiglu_epilogue_matches_silu_times_up(kernel, inter, k, m):
    gen = torch.Generator().manual_seed(inter + m)
    w = torch.randn(2 * inter, k, generator=gen) * 0.1
    x = torch.randn(m, k, generator=gen)

    got = kernel(x, kernel.pack(w, swiglu=True), None, swiglu=True)

    gu = F.linear(x, w)
    assert got.shape == (m, inter) and got.dtype == torch.float32
    close(got, F.silu(gu[:, :inter]) * gu[:, inter:])


def test_swiglu_of_a_very_negative_gate_is_zero_not_nan(kernel):
    # exp(-g) overflows for g < -88; silu(g) * u must still be silu's limit, 0, for any finite up value.
    w = torch.zeros(32, 16)
    w[:16, 0] = 1.0  # gate = x[:, 0]
    w[16:, 1] = 1.0  # up = x[:, 1]
    x = torch.zeros(3, 16)
    x[:, 0] = torch.tensor([-100.0, -3e38, -87.0])
    x[:, 1] = torch.tensor([5.0, -3e38, 1e30])
    got = kernel(x, kernel.pack(w, swiglu=True), None, swiglu=True)
    want = F.silu(x[:, :1]) * x[:, 1:2]
    assert torch.isfinite(got).all() and torch.equal(got[:2], torch.zeros(2, 16))
    torch.testing.assert_close(got[2], want[2].expand(16), rtol=1e-4, atol=0)


def test_refuses_what_it_does_not_take(kernel):
    w = torch.randn(32, 64)
    packed = kernel.pack(w)
    with pytest.raises(ValueError):
        kernel.pack(torch.randn(36, 64))  # out-features not a multiple of 8
    with pytest.raises(ValueError):
        kernel.pack(torch.randn(24, 64), swiglu=True)  # gate/up not whole panels each
    with pytest.raises(ValueError):
        kernel.pack(torch.randn(32, 64).bfloat16())  # bf16
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 64).bfloat16(), packed, None)  # bf16 input
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 48), packed, None)  # in-features differ
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 64), packed, torch.randn(32), swiglu=True)  # no bias there
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 64), packed, torch.randn(16))  # bias of the wrong width


def float32_runner(model) -> ModelRunner:
    cfg = model.config
    kv = KVCache(
        cfg.num_hidden_layers, cfg.num_key_value_heads, 16, 2, 64, 128, torch.float32, torch.device("cpu")
    )
    return ModelRunner(copy.deepcopy(model), kv, max_positions=64)


def test_a_float32_runner_takes_every_large_step_through_the_kernel(kernel, tiny_loaded):
    if cpu_has_avx512():
        pytest.skip("on AVX-512 CPUs the runner keeps oneDNN's float32 GEMM")
    model = tiny_loaded.model
    runner = float32_runner(model)
    linears = [runner.lm_head, *(getattr(lw, p) for lw in runner.layers for p in ("qkv", "o", "down"))]
    assert all(linear.tiled_weight is not None and linear.packed is None for linear in linears)
    assert all(type(lw.gated).__name__ == "_TiledGatedUp" for lw in runner.layers)
    assert all(lw.gate_up.tiled_weight is None and lw.gate_up.packed is None for lw in runner.layers)

    tokens = list(range(300, 340))
    batch = StepBatch(
        token_ids=tokens, positions=list(range(40)), slots=[1] * 40, prefills=[(1, 0, 40)], logit_rows=[39]
    )
    with torch.inference_mode():
        got = runner.forward(batch)[0]  # 40 prompt rows: through the kernel, prefill and lm_head alike
        want = model(torch.tensor([tokens])).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))


def test_on_an_avx512_cpu_the_float32_runner_keeps_onednn(kernel, tiny_loaded, monkeypatch):
    # There oneDNN's GEMM is 512 bits wide, the kernel 256: the runner must not pick the kernel.
    monkeypatch.setattr(runner_module, "cpu_has_avx512", lambda: True)
    runner = float32_runner(tiny_loaded.model)
    linears = [
        runner.lm_head,
        *(getattr(lw, p) for lw in runner.layers for p in ("qkv", "o", "gate_up", "down")),
    ]
    assert all(linear.tiled_weight is None and linear.packed is not None for linear in linears)
    assert all(lw.gated is None for lw in runner.layers)


def q8_weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, block_quant.BlockWeight]:
    """A float32 ``[n, k]`` weight that is exactly Q8_0 values (as the loader's checkpoint of a GGUF) and its blocks."""
    w = gguf_roundtrip(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)), "q8_0")
    blocks = block_quant.recover(w)
    assert blocks is not None and blocks.kind == "q8_0"
    return w, blocks


def test_q8_packing_is_the_panel_layout(kernel):
    n, k = 48, 64
    _, blocks = q8_weight(n, k, 1)
    qp, dp = kernel.pack_q8(blocks)
    assert torch.equal(qp, blocks.qs.view(n // 8, 8, k).transpose(1, 2).reshape(n, k))
    assert torch.equal(dp, blocks.d.view(n // 8, 8, k // 32).transpose(1, 2).reshape(n, k // 32))


# n: 72 leaves a last column block of one panel, 8 is that panel alone; m: row-block tails and past a 96-row chunk.
@pytest.mark.parametrize(("n", "k"), [(960, 576), (72, 1536), (8, 32)])
@pytest.mark.parametrize("m", [1, 5, 7, 32, 97])
@pytest.mark.parametrize("with_bias", [False, True])
def test_q8_linear_is_bit_for_bit_the_float_panels_of_the_same_weight(kernel, n, k, m, with_bias):
    w, blocks = q8_weight(n, k, n + m)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen)
    bias = torch.randn(n, generator=gen) if with_bias else None

    got = kernel.call_q8(x, kernel.pack_q8(blocks), bias)

    assert got.shape == (m, n) and got.dtype == torch.float32
    assert torch.equal(got, kernel(x, kernel.pack(w), bias))  # same weights, same order of sums
    close(got, F.linear(x, w, bias))


def test_q8_linear_refuses_what_it_does_not_take(kernel):
    _, q8 = q8_weight(32, 64, 2)
    q4 = block_quant.recover(gguf_roundtrip(torch.randn(32, 64), "q4_1"))
    assert not kernel.supports_q8(q4) and not kernel.supports_q8(None)
    with pytest.raises(ValueError):
        kernel.pack_q8(q4)
    packed = kernel.pack_q8(q8)
    assert kernel.call_q8(torch.randn(0, 64), packed, None).shape == (0, 32)  # zero rows in, zero rows out
    with pytest.raises(ValueError):
        kernel.call_q8(torch.randn(2, 32), packed, None)  # in-features differ
    with pytest.raises(ValueError):
        kernel.call_q8(torch.randn(2, 64).bfloat16(), packed, None)
    with pytest.raises(ValueError):
        kernel.call_q8(torch.randn(2, 64), packed, torch.randn(16))  # bias of the wrong width


def test_a_float32_runner_reads_a_q8_lm_head_from_its_blocks(kernel, tiny_loaded):
    if cpu_has_avx512():
        pytest.skip("on AVX-512 CPUs the runner keeps oneDNN's float32 GEMM")
    model = copy.deepcopy(tiny_loaded.model)
    with torch.no_grad():
        head = model.lm_head.weight
        head.copy_(gguf_roundtrip(head[:, : head.shape[1] // 32 * 32], "q8_0"))  # tiny model: 64 inputs
    runner = float32_runner(model)
    assert runner.lm_head.tiled_q8 is not None and runner.lm_head.tiled_weight is None
    assert all(lw.qkv.tiled_q8 is None for lw in runner.layers)  # random float weights: no blocks to read

    tokens = list(range(300, 340))
    batch = StepBatch(
        token_ids=tokens,
        positions=list(range(40)),
        slots=[1] * 40,
        prefills=[(1, 0, 40)],
        logit_rows=list(range(40)),
    )
    with torch.inference_mode():
        got = runner.forward(batch)  # 40 rows of logits: past the few-rows kernels, through the Q8 panels
        want = model(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))
