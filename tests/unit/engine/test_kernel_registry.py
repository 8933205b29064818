"""The kernel registry (inference/engine/kernels/registry.py): every registered implementation this CPU can run
against its op's reference, with the ones it cannot run reported as skipped with the reason (``pytest -rs`` lists
them: the AMX kernels on a CPU without AMX, the float32 kernels for bf16 ...); and the choice it makes per CPU kind,
batch shape and memory setting."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.engine import kernels
from inference.engine.block_quant import recover
from inference.engine.kernels import registry
from inference.engine.kernels.table import KERNELS
from inference.engine.runner_linear import GatedUp, Linear, Natives
from tests.unit.engine.helpers import gguf_roundtrip

F32, BF16 = torch.float32, torch.bfloat16
CASES = [(entry, dtype) for entry in KERNELS for dtype in entry.dtypes]
TOL = {F32: 1e-4, BF16: 3e-2}


def rows_for(entry, dtype) -> list[int]:
    limit = entry.rows_limit(dtype)
    return [r for r in (1, 3, 8, 40, 64, 70) if limit is None or r <= limit]


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOL[dtype]
    torch.testing.assert_close(
        got.float(), want.float(), rtol=tol, atol=tol * float(want.abs().max().clamp(min=1))
    )


def block_weight(n: int, k: int, seed: int):
    """An ``[n, k]`` float32 weight that is exactly GGUF Q4_1 values, and its blocks."""
    w = gguf_roundtrip(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)), "q4_1")
    return w, recover(w)


def run_linear(entry, dtype):
    w32, bw = block_weight(64, 96, 1)
    bias = None if entry.op == "gated_up" else torch.randn(64).to(dtype)
    w = w32.to(dtype)  # bf16: the blocks are the float32 checkpoint's, as the loader gives them
    natives = Natives.load(native=True)
    if entry.op == "gated_up":
        holder = GatedUp(w, None, 32, block_weight=bw, natives=natives)
    else:
        holder = Linear(w, bias, block_weight=bw, natives=natives)
    fn = holder._build(entry)
    assert fn is not None, f"{entry.name} does not take a weight its table entry says it takes"
    for m in rows_for(entry, dtype):
        x = torch.randn(m, 96, generator=torch.Generator().manual_seed(m)).to(dtype)
        # The reference in float32 from the weights each form holds (bf16: the float32 blocks for block forms).
        ref_w = w32 if entry.form == "blocks" else w.float()
        y = F.linear(x.float(), ref_w, None if bias is None else bias.float())
        want = F.silu(y[:, :32]) * y[:, 32:] if entry.op == "gated_up" else y
        close(fn(x), want, dtype)


def attention_reference(q, k_cache, v_cache, table, rep):
    """Per chunk ``(slot, start, n, row)``: softmax(q k^T / sqrt(hd)) v over positions ``0..start+i``, float64."""
    nkv, hd = k_cache.shape[1], k_cache.shape[3]
    outs = []
    for slot, start, n, row in table:
        qq = q[row : row + n].double().reshape(n, nkv, rep, hd)
        kk, vv = k_cache[slot, :, : start + n].double(), v_cache[slot, :, : start + n].double()
        scores = torch.einsum("nhrd,hpd->nhrp", qq, kk) * hd**-0.5
        keep = torch.arange(start + n)[None, :] <= (start + torch.arange(n))[:, None]
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        outs.append(torch.einsum("nhrp,hpd->nhrd", scores.softmax(-1), vv).reshape(n, -1))
    return torch.cat(outs)


def run_attention(entry, dtype):
    nkv, rep, hd = 2, 3, 64
    gen = torch.Generator().manual_seed(7)
    k_cache = torch.randn(3, nkv, 128, hd, generator=gen).to(dtype)
    v_cache = torch.randn(3, nkv, 128, hd, generator=gen).to(dtype)
    if entry.op == "decode_attention":
        table = [(2, 40, 1, 0), (0, 0, 1, 1), (1, 99, 1, 2)]  # one query each, after 41, 1 and 100 positions
    else:
        table = [(1, 0, 37, 0), (2, 20, 40, 37)]  # a fresh prompt, a chunk after 20 cached positions
    tokens = sum(t[2] for t in table)
    q = torch.randn(tokens, nkv * rep * hd, generator=gen).to(dtype)
    want = attention_reference(q, k_cache, v_cache, table, rep)
    if entry.name == "decode_attention":
        slots, lens = torch.tensor([t[0] for t in table]), torch.tensor([t[1] + 1 for t in table])
        q4 = q.view(tokens, nkv, rep, hd)
        got = kernels.decode_attention()(q4, k_cache, v_cache, slots, lens, hd**-0.5).reshape(tokens, -1)
    elif entry.name.startswith("prefill_attention"):
        kernel = kernels.prefill_attention()
        if entry.name == "prefill_attention_amx" and not kernel.uses_amx(hd):
            pytest.skip("the OS does not grant this process the AMX tiles")
        got = kernel(q, k_cache, v_cache, torch.tensor(table), rep, hd**-0.5)
    else:  # torch's SDPA as the runner calls it: each chunk alone, K/V of its slot, the GQA heads grouped
        outs = []
        for slot, start, n, row in table:
            qq = q[row : row + n].view(1, n, nkv * rep, hd).transpose(1, 2)
            keep = torch.arange(start + n)[None, :] <= (start + torch.arange(n))[:, None]
            out = F.scaled_dot_product_attention(
                qq,
                k_cache[slot : slot + 1, :, : start + n],
                v_cache[slot : slot + 1, :, : start + n],
                attn_mask=keep,
                scale=hd**-0.5,
                enable_gqa=True,
            )
            outs.append(out.transpose(1, 2).reshape(n, -1))
        got = torch.cat(outs)
    close(got, want, dtype)


def run_pointwise(entry, dtype):
    el = kernels.elementwise() if entry.name != "torch" else None
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(5, 64, generator=gen).to(dtype), torch.randn(64, generator=gen).to(dtype)
    eps = 1e-5

    def rms(v):
        return w.double() * (v.double() * torch.rsqrt(v.double().pow(2).mean(-1, keepdim=True) + eps))

    if entry.op == "rms_norm":
        got = el.rms_norm(x, w, eps) if el else w * F.rms_norm(x.float(), (64,), eps=eps).to(dtype)
        close(got, rms(x), dtype)
    elif entry.op == "add_rms_norm":
        delta, summed = torch.randn(3, 64, generator=gen).to(dtype), x.clone()
        summed[:3] += delta
        y = x.clone()
        got = el.add_rms_norm(y, delta, w, eps) if el else w * F.rms_norm(y.float(), (64,), eps=eps).to(dtype)
        if not el:
            y[:3].add_(delta)
            got = w * F.rms_norm(y.float(), (64,), eps=eps).to(dtype)
        close(y, summed, dtype)
        close(got, rms(summed), dtype)
    elif entry.op == "silu_mul":
        gu = torch.randn(5, 64, generator=gen).to(dtype)
        got = el.silu_mul(gu) if el else F.silu(gu[:, :32]) * gu[:, 32:]
        close(got, F.silu(gu[:, :32].double()) * gu[:, 32:].double(), dtype)
    elif entry.op == "argmax":
        logits = torch.randn(4, 1000, generator=gen).to(dtype)
        got = el.argmax(logits) if el else logits.argmax(-1)
        assert torch.equal(got, logits.float().argmax(-1))
    else:  # rope_cache: the queries rotated (HF's rotate_half) and the rotated keys and the values in the cache
        nh, nkv, hd, t = 4, 2, 16, 5
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        emb = torch.cat([torch.arange(32.0)[:, None] * inv] * 2, dim=-1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        sin_signed = torch.cat((-sin[:, : hd // 2], sin[:, hd // 2 :]), dim=-1)
        qkv = torch.randn(t, (nh + 2 * nkv) * hd, generator=gen).to(dtype)
        pos, slots = torch.tensor([0, 3, 9, 4, 31]), torch.tensor([1, 0, 1, 2, 0])
        k_cache, v_cache = torch.zeros(3, nkv, 32, hd, dtype=dtype), torch.zeros(3, nkv, 32, hd, dtype=dtype)
        x = qkv[:, : (nh + nkv) * hd].view(t, nh + nkv, hd).double()
        c, s = cos[pos].double().unsqueeze(1), sin[pos].double().unsqueeze(1)
        want = x * c + torch.cat((-x[..., hd // 2 :], x[..., : hd // 2]), dim=-1) * s
        if el is None:  # the reference is the formula itself: nothing more to compare
            return
        got = kernels.rope_cache()(qkv, cos, sin_signed, pos, slots, k_cache, v_cache, nh, nkv)
        close(got, want[:, :nh], dtype)
        close(k_cache[slots, :, pos], want[:, nh:], dtype)
        close(v_cache[slots, :, pos], qkv[:, (nh + nkv) * hd :].view(t, nkv, hd), dtype)


@pytest.mark.parametrize(
    ("entry", "dtype"), CASES, ids=[f"{e.op}-{e.name}-{str(d).removeprefix('torch.')}" for e, d in CASES]
)
def test_every_kernel_this_cpu_runs_matches_its_reference(entry, dtype):
    reason = registry.unavailable(entry, dtype)
    if reason is not None:
        pytest.skip(f"{entry.op}/{entry.name} ({dtype}) not run on this CPU: {reason}")
    if entry.op in ("linear", "gated_up"):
        run_linear(entry, dtype)
    elif entry.op in ("decode_attention", "prefill_attention"):
        run_attention(entry, dtype)
    else:
        run_pointwise(entry, dtype)


def test_every_op_has_a_torch_reference_and_every_kernel_names_one_of_its_op():
    for op in {e.op for e in KERNELS}:
        names = {e.name for e in registry.kernels_of(op)}
        assert "torch" in names and len(names) == len(registry.kernels_of(op))
        assert all(e.reference in names for e in registry.kernels_of(op))


def names(op, dtype, lo, hi, **kw):
    return [k.name for k in registry.order(op, dtype, lo, hi, **kw)]


def test_on_an_avx2_cpu_float32_takes_the_measured_faster_float_panels_unless_memory_is_low():
    # Zen 3 (AVX2), default model, N=32: GGUF block panels 123 tok/s against float panels 150-165 (kernels/table.py).
    assert names("linear", F32, 9, None, kind="x86-avx2")[0] == "linear_fma"
    assert names("gated_up", F32, 9, None, kind="x86-avx2")[0] == "linear_fma_swiglu"
    assert names("linear", F32, 9, None, kind="x86-avx2", memory="low")[0] == "linear_fma_blocks"
    # A few rows stay on the block kernel that reads the weights once at memory bandwidth, either way.
    assert names("linear", F32, 2, 8, kind="x86-avx2")[0] == "linear_blocks"
    # Where nothing says otherwise (here: Zen 5, AVX-512) the blocks, which hold ~5 bits a weight, come first.
    assert names("linear", F32, 9, None, kind="x86-avx512-bf16")[0] == "linear_fma_blocks"


def test_a_tie_goes_to_the_form_with_fewer_bytes():
    from inference.engine.kernels.table import Measurement

    figures = {"linear_fma": 100.0, "linear_fma_blocks": 103.0}  # within registry.TIE: the blocks win
    tie = (Measurement("x86-avx2", F32, "linear", (9, None), figures, "a tie"),)
    assert names("linear", F32, 9, None, kind="x86-avx2", measured=tie)[0] == "linear_fma_blocks"
    apart = (Measurement("x86-avx2", F32, "linear", (9, None), figures | {"linear_fma_blocks": 120.0}, ""),)
    assert names("linear", F32, 9, None, kind="x86-avx2", measured=apart)[0] == "linear_fma"


def test_on_amx_bf16_prefill_chunks_of_32_tokens_or_more_leave_the_kernel_unless_it_uses_the_tiles():
    assert registry.boundaries("prefill_attention", BF16, "x86-avx512-amx") == [31]
    assert names("prefill_attention", BF16, 1, 31, kind="x86-avx512-amx")[0] == "prefill_attention"
    assert names("prefill_attention", BF16, 32, None, kind="x86-avx512-amx")[:2] == [
        "prefill_attention_amx",
        "sdpa_gqa",
    ]
    assert registry.boundaries("prefill_attention", BF16, "x86-avx512-bf16") == []


def test_the_vnni_kernel_is_avoided_where_amx_tiles_serve_onednn():
    entry = registry.kernel("linear", "linear_vnni")
    amx_cpu = ("x86_64", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
    assert registry.unavailable(entry, BF16, flags=amx_cpu).startswith("not used on a CPU with amx_tile")
    assert registry.unavailable(entry, F32, flags=amx_cpu) == "takes bfloat16 only"
    assert registry.cpu_kind(amx_cpu) == "x86-avx512-amx" and registry.cpu_kind(("avx2", "fma")) == "x86-avx2"


def test_choose_builds_only_what_a_band_uses_and_merges_neighbours():
    built = []

    def build(entry):
        built.append(entry.name)
        return None if entry.form == "blocks" else (lambda x: x)  # a weight without GGUF blocks

    bands = registry.choose("linear", F32, build, kind="x86-avx2")
    if registry.unavailable(registry.kernel("linear", "linear_fma"), F32) is None:
        assert [(upto, k.name) for upto, k, _ in bands] == [(1, "linear_rows"), (None, "linear_fma")]
        assert "onednn" not in built and "torch" not in built  # never reached: nothing packed for them
