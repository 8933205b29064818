"""The native prefill-attention kernel (``prefill_attention.c``, ``prefill_attention_bf16.c``) against torch's SDPA,
and in the engine."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.engine.kernels import prefill_attention

from .helpers import greedy_tokens


def _reference(q, k_cache, v_cache, table, rep):
    """Per chunk: SDPA in float32 with the causal mask offset by the chunk's start (what runner does without it)."""
    outs = []
    nkv, hd = k_cache.shape[1], k_cache.shape[3]
    for slot, start, n, row in table.tolist():
        qq = q[row : row + n].float().reshape(n, nkv, rep, hd).permute(1, 2, 0, 3)
        kk = k_cache[slot, :, : start + n].float().unsqueeze(1)
        vv = v_cache[slot, :, : start + n].float().unsqueeze(1)
        keep = torch.arange(start + n)[None, :] <= (start + torch.arange(n))[:, None]
        out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=keep, scale=hd**-0.5)
        outs.append(out.permute(2, 0, 1, 3).reshape(n, nkv * rep * hd))
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("nkv", "rep", "hd"), [(3, 3, 64), (2, 2, 16), (1, 4, 128), (2, 5, 48)])
def test_kernel_matches_sdpa_for_chunks_with_and_without_a_cached_prefix(dtype, nkv, rep, hd):
    kernel = prefill_attention()
    assert kernel is not None and kernel.supports(dtype, head_dim=hd, n_rep=rep)
    gen = torch.Generator().manual_seed(hd)
    slots, slot_len, decode_rows = 4, 512, 3
    k_cache = torch.randn(slots, nkv, slot_len, hd, generator=gen).to(dtype)
    v_cache = torch.randn(slots, nkv, slot_len, hd, generator=gen).to(dtype)
    # A fresh prompt, a chunk after 100 cached positions (longer than a 64-key tile, crossing tiles), one token.
    chunks = [(2, 0, 37), (0, 100, 130), (3, 5, 1)]
    table, row = [], decode_rows
    for slot, start, n in chunks:
        table.append((slot, start, n, row))
        row += n
    table = torch.tensor(table)
    q = torch.randn(row, nkv * rep, hd, generator=gen).to(dtype)

    got = kernel(q, k_cache, v_cache, table, rep, hd**-0.5)

    assert got.shape == (row - decode_rows, nkv * rep * hd) and got.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), _reference(q, k_cache, v_cache, table, rep), rtol=tol, atol=tol)


def test_kernel_refuses_chunks_outside_the_cache_or_the_queries():
    kernel = prefill_attention()
    assert kernel is not None
    k_cache = v_cache = torch.zeros(2, 1, 32, 16)
    q = torch.zeros(8, 2, 16)
    for chunk in ((2, 0, 4, 0), (0, 30, 4, 0), (0, 0, 4, 6), (0, 0, 0, 0), (-1, 0, 4, 0)):
        with pytest.raises(ValueError, match="refused"):
            kernel(q, k_cache, v_cache, torch.tensor([chunk]), 2, 0.25)
    with pytest.raises(ValueError, match="unsupported"):
        kernel(q.bfloat16(), k_cache, v_cache, torch.tensor([(0, 0, 4, 0)]), 2, 0.25)  # mixed dtypes
    with pytest.raises(ValueError, match="unsupported"):
        kernel(q, k_cache, v_cache, torch.tensor([(0, 0, 4, 0)], dtype=torch.int32), 2, 0.25)


def test_engine_greedy_output_is_the_same_with_the_kernel_and_with_sdpa(make_engine):
    # Long prompts in 24-token chunks: fresh chunks, chunks after a cached prefix, and decodes in the same steps.
    prompts = [[5 + i, 9, 11 + 2 * i, 40] * (6 + 5 * i) for i in range(4)]
    lengths = [8, 12, 6, 10]
    outputs = {}
    for native in (True, False):
        engine = make_engine(max_num_batched_tokens=24)
        if not native:
            engine._runner.prefill_kernel = None
        outputs[native] = greedy_tokens(engine, prompts, lengths)
    assert outputs[True] == outputs[False]


def test_long_chunks_can_go_to_sdpa_with_grouped_heads_and_the_output_does_not_change(make_engine):
    # What an AMX CPU does (the registry's measured table, kernels/table.py), forced on here: chunks of 16+ tokens through SDPA with
    # enable_gqa, shorter ones through the kernel, in one step; the same greedy tokens as the kernel alone.
    from inference.engine.runner import StepBatch

    prompts = [[5 + i, 9, 11 + 2 * i, 40] * (1 + 5 * i) for i in range(4)]  # 4 to 64 tokens
    lengths = [8, 12, 6, 10]
    outputs = {}
    for split in (False, True):
        engine = make_engine(max_num_batched_tokens=40)
        runner = engine._runner
        if split:
            runner.sdpa_prefill_from = 16
            batch = StepBatch(
                num_decode=2, prefills=[(0, 0, 4), (1, 0, 20), (5, 0, 20), (2, 8, 3), (3, 16, 2), (4, 8, 20)]
            )
            plan = runner._prefill_plan(batch)
            assert [segment[0] for segment in plan] == ["kernel", "gqa", "kernel", "gqa"]
            assert plan[0][1].tolist() == [[0, 0, 4, 2]]
            assert plan[1][1:5] == ([1, 5], 0, 20, 6) and plan[1][5] is None  # same shape: one batched call
            assert plan[2][1].tolist() == [[2, 8, 3, 46], [3, 16, 2, 49]]
            assert plan[3][1:5] == ([4], 8, 20, 51) and plan[3][5].shape == (20, 28)
        outputs[split] = greedy_tokens(engine, prompts, lengths)
    assert outputs[True] == outputs[False]


def test_sdpa_with_grouped_heads_matches_the_reference_after_a_cached_prefix(make_engine):
    engine = make_engine()
    runner = engine._runner
    nkv, rep, hd = runner.num_kv_heads, runner.n_rep, runner.head_dim
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.randn(2, nkv, 64, hd, generator=gen)
    v_cache = torch.randn(2, nkv, 64, hd, generator=gen)
    q = torch.randn(30, nkv * rep, hd, generator=gen)
    for start, n in ((0, 30), (17, 13)):
        mask = None if start == 0 else torch.ones(n, start + n, dtype=torch.bool).tril(start)
        got = runner._prefill_attention_gqa(q, k_cache, v_cache, [1], start, n, 0, mask)
        want = _reference(q, k_cache, v_cache, torch.tensor([(1, start, n, 0)]), rep)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # Two chunks of one shape in one call: chunk i reads its own slot.
    for start, n in ((0, 15), (20, 15)):
        mask = None if start == 0 else torch.ones(n, start + n, dtype=torch.bool).tril(start)
        got = runner._prefill_attention_gqa(q, k_cache, v_cache, [1, 0], start, n, 0, mask)
        want = _reference(q, k_cache, v_cache, torch.tensor([(1, start, n, 0), (0, start, n, n)]), rep)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_on_amx_tiles_long_chunks_match_sdpa_and_the_runner_keeps_them_on_the_kernel(make_engine):
    # On a CPU with AMX, bf16 chunks of head size 64 run on the tiles (item_amx): long prompts cross many key tiles,
    # the running max moves (scores grow along the keys), and the row count is no multiple of 16.
    kernel = prefill_attention()
    if kernel is None or not kernel.uses_amx(64):
        pytest.skip("no AMX tiles here")
    gen = torch.Generator().manual_seed(7)
    nkv, rep, hd = 3, 3, 64
    k_cache = torch.randn(2, nkv, 1024, hd, generator=gen)
    k_cache += torch.linspace(0, 3, 1024)[
        None, None, :, None
    ]  # later keys score higher: the max keeps rising
    k_cache, v_cache = k_cache.bfloat16(), torch.randn(2, nkv, 1024, hd, generator=gen).bfloat16()
    table = torch.tensor([(1, 0, 700, 0), (0, 301, 33, 700)])
    q = torch.randn(733, nkv * rep, hd, generator=gen).abs().bfloat16()

    got = kernel(q, k_cache, v_cache, table, rep, hd**-0.5)

    torch.testing.assert_close(got.float(), _reference(q, k_cache, v_cache, table, rep), rtol=2e-2, atol=2e-2)
    engine = make_engine()
    runner = engine._runner
    if runner.dtype == torch.bfloat16 and runner.head_dim == 64:
        assert runner.sdpa_prefill_from is None
