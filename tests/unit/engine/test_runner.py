"""Low-level checks of the hand-written forward against the transformers modules it replaces."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from inference.engine.kernels import registry
from inference.engine.kv_cache import KVCache
from inference.engine.runner import ModelRunner, StepBatch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("native", [False, True])
def test_runner_matches_hf_modules(tiny_loaded, dtype, native):
    """RMSNorm and RoPE are bit-identical to LlamaRMSNorm / apply_rotary_pos_emb; the native RMSNorm
    (kernels/elementwise.c) sums the squares in another order, so it is equal up to that rounding."""
    model = tiny_loaded.model
    cfg = model.config
    kv = KVCache(
        cfg.num_hidden_layers, cfg.num_key_value_heads, 16, 2, 64, 128, torch.float32, torch.device("cpu")
    )
    runner = ModelRunner(model, kv, max_positions=64, native_kernels=native)
    assert (runner.elementwise is not None) is native
    gen = torch.Generator().manual_seed(0)

    norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
    norm.weight.data = torch.randn(cfg.hidden_size, generator=gen)
    norm = norm.to(dtype)
    x = (torch.randn(7, cfg.hidden_size, generator=gen) * 3).to(dtype)
    with torch.no_grad():
        want = norm(x)
    if native:
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
        torch.testing.assert_close(runner._rms_norm(x, norm.weight.data), want, rtol=tol, atol=tol)
    else:
        assert torch.equal(runner._rms_norm(x, norm.weight.data), want)

    pos = torch.tensor([0, 1, 5, 17, 63])
    q = torch.randn(5, 4, 16, generator=gen).to(dtype)
    k = torch.randn(5, 2, 16, generator=gen).to(dtype)
    cos_hf, sin_hf = model.model.rotary_emb(q, pos.unsqueeze(0))
    q_hf, k_hf = apply_rotary_pos_emb(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), cos_hf.to(dtype), sin_hf.to(dtype)
    )
    cos = runner.cos[pos].unsqueeze(1).to(dtype)
    sin = runner.sin_signed[pos].unsqueeze(1).to(dtype)
    assert torch.equal(runner._rope(q, cos, sin), q_hf[0].transpose(0, 1))
    assert torch.equal(runner._rope(k, cos, sin), k_hf[0].transpose(0, 1))


def test_prefill_logits_match_hf_forward(tiny_loaded):
    """One prefill through the runner (split in two chunks) vs. the HF forward pass."""
    model = tiny_loaded.model
    cfg = model.config
    kv = KVCache(
        cfg.num_hidden_layers, cfg.num_key_value_heads, 16, 2, 64, 128, torch.float32, torch.device("cpu")
    )
    runner = ModelRunner(model, kv, max_positions=64)
    tokens = list(range(300, 340))
    with torch.inference_mode():
        want = model(torch.tensor([tokens])).logits[0]
    got = []
    for start, n in ((0, 25), (25, 15)):
        batch = StepBatch(
            token_ids=tokens[start : start + n],
            positions=list(range(start, start + n)),
            slots=[1] * n,
            prefills=[(1, start, n)],
            logit_rows=list(range(n)),
        )
        got.append(runner.forward(batch))
    got = torch.cat(got)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_packed_linear_pads_large_row_counts_to_a_bucket(monkeypatch):
    # oneDNN keeps a primitive per row count: above ROW_BUCKET rows the packed path only ever sees multiples of it,
    # and the padding rows never reach the caller.
    from inference.engine import runner_linear

    weight, bias = torch.randn(64, 32), torch.randn(64)
    linear = runner_linear.Linear(weight, bias, natives=runner_linear.Natives.load(native=False))
    if not linear.packed:
        pytest.skip("oneDNN weight packing is not available in this torch build")
    seen: list[int] = []
    real = runner_linear.onednn_linear

    def spy(x, packed, b):
        seen.append(x.shape[0])
        return real(x, packed, b)

    monkeypatch.setattr(runner_linear, "onednn_linear", spy)
    for m in (1, 7, 32, 33, 45, 64, 65, 200):
        x = torch.randn(m, 32)
        y = linear(x)
        assert y.shape == (m, 64)
        torch.testing.assert_close(y, F.linear(x, weight, bias), rtol=1e-4, atol=1e-4)
    assert seen == [1, 7, 32, 64, 64, 64, 96, 224]


def test_gated_up_fuses_the_activation_into_the_matmuls_for_bf16_only(tiny_loaded):
    from inference.engine import runner_linear

    model = tiny_loaded.model
    cfg = model.config
    inter = cfg.intermediate_size
    weight = torch.randn(2 * inter, cfg.hidden_size, generator=torch.Generator().manual_seed(1)).bfloat16()
    gated = runner_linear.onednn_gated(weight, inter)
    if gated is None:
        pytest.skip("oneDNN's packed linear with post-ops is not available in this torch build")
    for m in (1, 33, 70):  # one row, and row counts the bucketing pads
        x = torch.randn(m, cfg.hidden_size).bfloat16()
        gu = F.linear(x.float(), weight.float())
        want = F.silu(gu[:, :inter]) * gu[:, inter:]
        got = gated(x)
        assert got.shape == (m, inter) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))

    def build(dtype):
        kv = KVCache(
            cfg.num_hidden_layers, cfg.num_key_value_heads, 16, 2, 64, 128, dtype, torch.device("cpu")
        )
        return ModelRunner(copy.deepcopy(model).to(dtype), kv, max_positions=64)

    # float32 never takes oneDNN's gated form: the native float32 kernel's (test_linear_fma_kernel.py) or none
    f32 = build(torch.float32)
    assert all(k.name != "onednn_swiglu" for layer in f32.layers for _, k, _ in layer.gate_up.bands)
    bf16 = build(torch.bfloat16)
    # (the gated form is the VNNI kernel's on CPUs with AVX512-BF16 and no AMX: test_linear_vnni_kernel.py)
    assert all(layer.gate_up.kernel_for(40) != "unfused" for layer in bf16.layers)
    assert all(
        layer.gate_up.linear is None for layer in bf16.layers
    )  # no [2I]-wide copy besides the gated one
    # The bf16 runner through the gated form against the float32 model's logits.
    tokens = list(range(300, 340))
    batch = StepBatch(
        token_ids=tokens, positions=list(range(40)), slots=[1] * 40, prefills=[(1, 0, 40)], logit_rows=[39]
    )
    with torch.inference_mode():
        want = model(torch.tensor([tokens])).logits[0, -1]
        got = bf16.forward(batch)[0].float()
    assert torch.nn.functional.cosine_similarity(got, want, dim=0) > 0.99


def test_warm_up_runs_every_bucketed_row_count_through_the_onednn_projections(tiny_loaded):
    # Every multiple of ROW_BUCKET from two buckets up to the step budget, once per projection shape; nothing when no
    # projection is on oneDNN (native kernels off here: every projection has a packed oneDNN copy).
    model = copy.deepcopy(tiny_loaded.model)
    cfg = model.config
    kv = KVCache(
        cfg.num_hidden_layers, cfg.num_key_value_heads, 16, 2, 64, 128, torch.float32, torch.device("cpu")
    )
    runner = ModelRunner(model, kv, max_positions=64, native_kernels=False)
    lw = runner.layers[0]
    assert lw.qkv.packed
    seen: list[int] = []

    def recording(fn):
        return lambda x: seen.append(x.shape[0]) or fn(x)

    lw.qkv.bands = [(upto, k, recording(fn)) for upto, k, fn in lw.qkv.bands]
    assert runner.warm_up(170) > 0
    assert seen == [64, 96, 128, 160]
    for layer in runner.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            op = getattr(layer, name)
            op.bands = [(None, registry.kernel(op.bands[0][1].op, "torch"), op.bands[-1][2])]
    assert runner.warm_up(170) == 0.0
