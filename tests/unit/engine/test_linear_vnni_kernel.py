"""The VNNI-packed bf16 linear kernel (inference/engine/kernels/linear_vnni.c): its packing is the layout it claims,
it matches F.linear (and LlamaMLP's SiLU-and-multiply) for every row count and the widths its blocks do not divide,
it refuses what it does not take, and a bf16 runner on such a CPU uses it in place of oneDNN."""

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from inference.engine import EngineConfig, LLMEngine, SamplingParams
from inference.engine.kernels import linear_vnni
from inference.engine.kv_cache import KVCache
from inference.engine.loader import cpu_has_amx
from inference.engine.runner import ModelRunner, StepBatch
from tests.unit.engine.helpers import collect, needs_gcc

pytestmark = needs_gcc


@pytest.fixture(scope="module")
def kernel():
    found = linear_vnni()
    if found is None:
        pytest.skip("this CPU has no AVX512-BF16")
    return found


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    # bf16 inputs, float32 sums, one bf16 rounding of the output: within a few bf16 ulps of the float result.
    torch.testing.assert_close(
        got.float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max().clamp(min=1.0))
    )


def test_packing_is_the_vnni_panel_layout(kernel):
    n, k = 96, 40
    w = torch.randn(n, k).bfloat16()
    assert torch.equal(kernel.pack(w), w.view(n // 16, 16, k // 2, 2).transpose(1, 2).reshape(n, k))
    # swiglu: gate panel j, then up panel j
    gate, up = w[: n // 2], w[n // 2 :]
    interleaved = torch.stack([gate.view(n // 32, 16, k), up.view(n // 32, 16, k)], 1).reshape(n, k)
    want = interleaved.view(n // 16, 16, k // 2, 2).transpose(1, 2).reshape(n, k)
    assert torch.equal(kernel.pack(w, swiglu=True), want)


# n: 960 = 20 blocks of 48 columns; 80 and 16 leave a last block of 2 and 1 panels. m: every row-block tail.
@pytest.mark.parametrize(("n", "k"), [(960, 576), (80, 1536), (16, 2)])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 32, 45, 130])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_f_linear(kernel, n, k, m, with_bias):
    gen = torch.Generator().manual_seed(n + m)
    w = torch.randn(n, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None
    x = torch.randn(m, k, generator=gen).bfloat16()

    got = kernel(x, kernel.pack(w), bias)

    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    close(got, F.linear(x.float(), w.float(), None if bias is None else bias.float()))


def test_no_rows_give_no_rows(kernel):
    # A step whose prefill chunks all stop short of their prompt's end asks the lm_head for no logits.
    w = torch.randn(32, 64).bfloat16()
    assert kernel(torch.empty(0, 64, dtype=torch.bfloat16), kernel.pack(w), None).shape == (0, 32)


def test_a_bf16_engine_prefills_a_prompt_over_several_steps(kernel, tiny_loaded):
    # Steps of 16 tokens: the first two need no logits (the bench's mixed workload found this case).
    model = copy.deepcopy(tiny_loaded.model).to(torch.bfloat16)
    loaded = replace(tiny_loaded, model=model, dtype=torch.bfloat16)
    engine = LLMEngine(loaded, EngineConfig(device="cpu", max_num_seqs=4, max_num_batched_tokens=16))
    try:
        handle = engine.submit(
            list(range(300, 340)), SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
        )
        engine.run_until_idle()
        events, finish = collect(handle)
        assert finish.finish_reason == "length" and sum(len(e.token_ids) for e in events) == 4
    finally:
        engine.shutdown()


@pytest.mark.parametrize(("inter", "k"), [(1536, 576), (48, 64)])
@pytest.mark.parametrize("m", [1, 7, 32, 70])
def test_swiglu_epilogue_matches_silu_times_up(kernel, inter, k, m):
    gen = torch.Generator().manual_seed(inter + m)
    w = (torch.randn(2 * inter, k, generator=gen) * 0.1).bfloat16()
    x = torch.randn(m, k, generator=gen).bfloat16()

    got = kernel(x, kernel.pack(w, swiglu=True), None, swiglu=True)

    gu = F.linear(x.float(), w.float())
    assert got.shape == (m, inter) and got.dtype == torch.bfloat16
    close(got, F.silu(gu[:, :inter]) * gu[:, inter:])


def test_swiglu_of_a_very_negative_gate_is_zero_not_nan(kernel):
    # exp(-g) overflows for g < -88; silu(g) * u must still be silu's limit, 0, for any finite up value.
    w = torch.zeros(64, 32).bfloat16()
    w[:32, 0] = 1.0  # gate = x[:, 0]
    w[32:, 1] = 1.0  # up = x[:, 1]
    x = torch.zeros(3, 32).bfloat16()
    x[:, 0] = torch.tensor([-100.0, -3e38, -87.0])
    x[:, 1] = torch.tensor([5.0, -3e38, 1e30])
    got = kernel(x, kernel.pack(w, swiglu=True), None, swiglu=True).float()
    want = F.silu(x[:, :1].float()) * x[:, 1:2].float()
    assert torch.isfinite(got).all() and torch.equal(got[:2], torch.zeros(2, 32))
    torch.testing.assert_close(got[2], want[2].expand(32), rtol=2e-2, atol=0)


def test_refuses_what_it_does_not_take(kernel):
    w = torch.randn(32, 64).bfloat16()
    packed = kernel.pack(w)
    with pytest.raises(ValueError):
        kernel.pack(torch.randn(40, 64).bfloat16())  # out-features not a multiple of 16
    with pytest.raises(ValueError):
        kernel.pack(torch.randn(32, 63).bfloat16())  # odd in-features
    with pytest.raises(ValueError):
        kernel.pack(torch.randn(48, 64).bfloat16(), swiglu=True)  # gate/up not whole panels each
    with pytest.raises(ValueError):
        kernel.pack(torch.randn(32, 64))  # float32
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 64), packed, None)  # float32 input
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 48).bfloat16(), packed, None)  # in-features differ
    with pytest.raises(ValueError):
        kernel(
            torch.randn(2, 64).bfloat16(), packed, torch.randn(32).bfloat16(), swiglu=True
        )  # no bias there
    with pytest.raises(ValueError):
        kernel(torch.randn(2, 64).bfloat16(), packed, torch.randn(16).bfloat16())  # bias of the wrong width


def test_a_bf16_runner_takes_every_large_step_through_the_kernel(kernel, tiny_loaded):
    if cpu_has_amx():
        pytest.skip("on AMX CPUs the runner keeps oneDNN")
    model = tiny_loaded.model
    cfg = model.config
    kv = KVCache(
        cfg.num_hidden_layers, cfg.num_key_value_heads, 16, 2, 64, 128, torch.bfloat16, torch.device("cpu")
    )
    runner = ModelRunner(copy.deepcopy(model).to(torch.bfloat16), kv, max_positions=64)
    linears = [runner.lm_head, *(getattr(lw, p) for lw in runner.layers for p in ("qkv", "o", "down"))]
    assert all(linear.kernel_for(40) == "linear_vnni" and not linear.packed for linear in linears)
    assert all(lw.gate_up.kernel_for(40) == "linear_vnni_swiglu" for lw in runner.layers)
    assert all(lw.gate_up.linear is None for lw in runner.layers)  # no [2I]-wide copy besides the gated one

    tokens = list(range(300, 340))
    batch = StepBatch(
        token_ids=tokens, positions=list(range(40)), slots=[1] * 40, prefills=[(1, 0, 40)], logit_rows=[39]
    )
    with torch.inference_mode():
        got = runner.forward(batch)[
            0
        ].float()  # 40 prompt rows: through the kernel, prefill and lm_head alike
        want = model(torch.tensor([tokens])).logits[0, -1]  # the float32 model
    assert F.cosine_similarity(got, want, dim=0) > 0.99
