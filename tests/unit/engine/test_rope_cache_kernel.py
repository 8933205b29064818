"""The native RoPE + KV-cache-write kernel (``rope_cache.c``) against the torch ops it replaces."""

from __future__ import annotations

import pytest
import torch

from inference.engine.kernels import rope_cache


def _tables(positions, hd, dtype):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin().to(dtype)
    half = hd // 2
    return emb.cos().to(dtype), torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)


def _torch_rope_and_write(qkv, cos, sin_signed, pos, slots, k_cache, v_cache, nh, nkv):
    """What ModelRunner.forward does without the kernel (runner._rope and two index_copy_)."""
    t, hd, slot_len = qkv.shape[0], cos.shape[1], k_cache.shape[2]
    c = cos.index_select(0, pos).unsqueeze(1)
    s = sin_signed.index_select(0, pos).unsqueeze(1)
    x = qkv[:, : (nh + nkv) * hd].view(t, nh + nkv, hd)
    swapped = x.unflatten(-1, (2, hd // 2)).flip(-2).flatten(-2)
    qk = (x * c) + (swapped * s)
    rows = (
        (slots.unsqueeze(1) * nkv + torch.arange(nkv).unsqueeze(0)) * slot_len + pos.unsqueeze(1)
    ).flatten()
    k_cache.view(-1, hd).index_copy_(0, rows, qk[:, nh:].reshape(t * nkv, hd))
    v_cache.view(-1, hd).index_copy_(0, rows, qkv[:, (nh + nkv) * hd :].reshape(t * nkv, hd))
    return qk[:, :nh]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("tokens", "nh", "nkv", "hd"), [(5, 9, 3, 64), (700, 9, 3, 64), (3, 4, 2, 16)])
def test_kernel_is_bit_for_bit_torchs_rope_and_cache_write(dtype, tokens, nh, nkv, hd):
    kernel = rope_cache()
    assert kernel is not None
    gen = torch.Generator().manual_seed(tokens)
    slots_n, slot_len = 6, 1024
    qkv = (torch.randn(tokens, (nh + 2 * nkv) * hd, generator=gen) * 3).to(dtype)
    cos, sin_signed = _tables(2048, hd, dtype)
    # distinct (slot, position) pairs in shuffled order, as a step's decode rows and prefill chunks give
    cells = torch.randperm(slots_n * slot_len, generator=gen)[:tokens]
    slots, pos = cells // slot_len, cells % slot_len
    shape = (slots_n, nkv, slot_len, hd)
    k_want, v_want = torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)
    k_got, v_got = k_want.clone(), v_want.clone()

    q_want = _torch_rope_and_write(qkv, cos, sin_signed, pos, slots, k_want, v_want, nh, nkv)
    q_got = kernel(qkv, cos, sin_signed, pos, slots, k_got, v_got, nh, nkv)

    assert q_got.shape == (tokens, nh, hd) and q_got.dtype == dtype
    assert torch.equal(q_got, q_want)
    assert torch.equal(k_got, k_want)  # written cells rotated, every other cell untouched
    assert torch.equal(v_got, v_want)


def test_kernel_refuses_bad_input_and_writes_nothing():
    kernel = rope_cache()
    assert kernel is not None
    nh, nkv, hd = 4, 2, 16
    qkv = torch.randn(2, (nh + 2 * nkv) * hd)
    cos, sin_signed = _tables(64, hd, torch.float32)
    k_cache, v_cache = torch.zeros(3, nkv, 32, hd), torch.zeros(3, nkv, 32, hd)
    ok = torch.tensor([0, 1])

    for pos, slots in ((torch.tensor([0, 32]), ok), (ok, torch.tensor([0, 3])), (torch.tensor([-1, 0]), ok)):
        with pytest.raises(ValueError, match="out of range"):
            kernel(qkv, cos, sin_signed, pos, slots, k_cache, v_cache, nh, nkv)
    assert not k_cache.any() and not v_cache.any()
    with pytest.raises(ValueError):
        kernel(qkv.bfloat16(), cos, sin_signed, ok, ok, k_cache, v_cache, nh, nkv)  # mixed dtypes
    with pytest.raises(ValueError):
        kernel(qkv, cos, sin_signed, ok.int(), ok, k_cache, v_cache, nh, nkv)  # int32 positions
    with pytest.raises(ValueError):
        kernel(qkv[:, :-hd], cos, sin_signed, ok, ok, k_cache, v_cache, nh, nkv)  # width of other head counts
