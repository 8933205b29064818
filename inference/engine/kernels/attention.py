"""The attention kernels' ctypes bindings: :class:`DecodeAttention` (``decode_attention.c``), :class:`PrefillAttention`
(``prefill_attention.c`` and ``prefill_attention_bf16.c``) and :class:`RopeCache` (``rope_cache.c``: RoPE with the
K/V cache writes). Built and loaded with the other kernels by :mod:`inference.engine.kernels.build`;
:mod:`inference.engine.kernels` returns them bound.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch


class _AttentionKernel:
    """What the attention kernels share: per-dtype entry points (``_fns``) and the geometry they take."""

    _fns: dict[torch.dtype, Any]

    def supports(self, dtype: torch.dtype, *, head_dim: int, n_rep: int) -> bool:
        """Whether the kernel takes a model with this dtype, head dimension and query heads per KV head."""
        return dtype in self._fns and head_dim % 16 == 0 and 0 < head_dim <= 256 and 1 <= n_rep <= 8


class DecodeAttention(_AttentionKernel):
    """``decode_attention.c`` bound with ctypes: attention of one query token per decoding sequence.

    Call with ``q`` ``[nd, nkv, rep, hd]`` (contiguous), the layer's ``k_cache``/``v_cache``
    ``[slots, nkv, slot_len, hd]`` (contiguous, same dtype: bfloat16 or float32), ``slots`` and ``lens``
    (int64 ``[nd]``: each row's slot and the positions ``0..len-1`` it attends to) and ``scale``; returns
    ``[nd, nkv, rep, hd]``. Math in float32, as torch's flash-attention CPU kernel does for bf16.

    Raises:
        ValueError: a dtype, layout or length the kernel does not take (the caller uses SDPA instead).
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fns = {torch.bfloat16: lib.decode_attention_bf16, torch.float32: lib.decode_attention_f32}
        for fn in self._fns.values():
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float]

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        nd, nkv, rep, hd = q.shape
        fn = self._fns.get(q.dtype)
        if (
            fn is None
            or not (q.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous())
            or k_cache.dtype != q.dtype
            or v_cache.dtype != q.dtype
            or k_cache.shape[1] != nkv
            or k_cache.shape[3] != hd
            or v_cache.shape != k_cache.shape
            or slots.dtype != torch.int64
            or lens.dtype != torch.int64
            or slots.shape != (nd,)
            or lens.shape != (nd,)
            or q.device.type != "cpu"
        ):
            raise ValueError("decode_attention: unsupported dtype, layout or device")
        out = torch.empty_like(q)
        code = fn(
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            slots.data_ptr(),
            lens.data_ptr(),
            out.data_ptr(),
            nd,
            nkv,
            rep,
            hd,
            k_cache.shape[0],
            k_cache.shape[2],
            scale,
        )
        if code:
            raise ValueError(f"decode_attention: kernel refused the call (code {code})")
        return out


class PrefillAttention(_AttentionKernel):
    """``prefill_attention.c`` (bf16 on AVX512-BF16 and AMX: ``prefill_attention_bf16.c``) bound with ctypes: causal
    attention of a step's prefill chunks over the slot KV cache (tiled with an online softmax, FlashAttention-2; blocks
    of keys after a query block are skipped).

    Call with ``q`` ``[tokens, nkv * rep * hd]`` or ``[tokens, nkv * rep, hd]`` (contiguous: the step's rotated
    queries), the layer's ``k_cache`` / ``v_cache`` ``[S, nkv, L, hd]`` (already holding the chunks' own keys and
    values), ``chunks`` (int64 ``[C, 4]``: slot, start position, length and first row in ``q`` of each chunk),
    ``n_rep`` and ``scale``; returns ``[sum of lengths, nkv * rep * hd]``, the chunks' rows in order. Math in float32
    (as torch's flash-attention CPU kernel for bf16), rounded to the dtype (bfloat16 or float32).

    Raises:
        ValueError: a dtype, shape or layout the kernel does not take, or a chunk outside the cache or ``q``.
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fns = {torch.bfloat16: lib.prefill_attention_bf16, torch.float32: lib.prefill_attention_f32}
        self._amx = lib.prefill_attention_amx
        self._amx.restype = ctypes.c_int
        self._amx.argtypes = [ctypes.c_int64]
        for fn in self._fns.values():
            fn.restype = ctypes.c_int
            fn.argtypes = (
                [ctypes.c_void_p] * 4
                + [ctypes.c_int64, ctypes.c_void_p]
                + [ctypes.c_int64] * 6
                + [ctypes.c_float]
            )

    def uses_amx(self, head_dim: int) -> bool:
        """Whether bf16 chunks of this head size run on AMX tiles (a CPU with AMX that the OS grants; head size 64):
        on a 2-vCPU Xeon a 1500-token prompt's attention takes 3.5 ms a layer there against 5.0 in torch's SDPA
        and 15.7 with the AVX-512 dot products."""
        return bool(self._amx(head_dim))

    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        chunks: torch.Tensor,
        n_rep: int,
        scale: float,
    ) -> torch.Tensor:
        tokens = q.shape[0]
        fn = self._fns.get(q.dtype)
        if (
            fn is None
            or k_cache.dim() != 4
            or k_cache.shape != v_cache.shape
            or q.numel() != tokens * k_cache.shape[1] * n_rep * k_cache.shape[3]
            or any(
                t.dtype != q.dtype or not t.is_contiguous() or t.device.type != "cpu"
                for t in (q, k_cache, v_cache)
            )
            or chunks.dtype != torch.int64
            or chunks.dim() != 2
            or chunks.shape[1] != 4
            or not chunks.is_contiguous()
        ):
            raise ValueError("prefill_attention: unsupported dtype, shape or layout")
        slots, nkv, slot_len, hd = k_cache.shape
        out = torch.empty((tokens, nkv * n_rep * hd), dtype=q.dtype)
        code = fn(
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            chunks.data_ptr(),
            chunks.shape[0],
            out.data_ptr(),
            tokens,
            nkv,
            n_rep,
            hd,
            slots,
            slot_len,
            scale,
        )
        if code:
            raise ValueError(f"prefill_attention: kernel refused the call (code {code})")
        rows, lengths = chunks[:, 3].tolist(), chunks[:, 2].tolist()
        if all(rows[i + 1] == rows[i] + lengths[i] for i in range(len(rows) - 1)):  # the runner's layout
            return out[rows[0] : rows[0] + sum(lengths)] if rows else out[:0]
        return torch.cat([out[r : r + n] for r, n in zip(rows, lengths, strict=True)])


class RopeCache:
    """``rope_cache.c`` bound with ctypes: rotary embedding of a step's queries and keys, the keys and values
    written into the slot KV cache in the same pass (vLLM's ``rotary_embedding`` + ``reshape_and_cache``).

    Call with ``qkv`` ``[T, (nh + 2 nkv) * hd]`` (the fused projection's output), the ``cos`` / ``sin_signed``
    tables ``[P, hd]`` (HF's cos and sin, the first half of sin negated), ``pos`` and ``slots`` (int64 ``[T]``),
    the layer's ``k_cache`` / ``v_cache`` ``[S, nkv, L, hd]`` and the head counts; returns the rotated queries
    ``[T, nh, hd]``. All tensors contiguous, on CPU, of one dtype (float32 or bfloat16) but ``pos``/``slots``.
    Bit for bit torch's ``x * cos + rotate_half(x) * sin`` and ``index_copy_`` (tested).

    Raises:
        ValueError: a dtype, shape or layout the kernel does not take, or a position or slot out of range
            (then nothing is written).
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fns = {torch.float32: lib.rope_kv_write_f32, torch.bfloat16: lib.rope_kv_write_bf16}
        for fn in self._fns.values():
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_int64] * 7

    def __call__(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        pos: torch.Tensor,
        slots: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
    ) -> torch.Tensor:
        tokens = qkv.shape[0]
        fn = self._fns.get(qkv.dtype)
        hd = cos.shape[-1]
        tensors = (qkv, cos, sin_signed, k_cache, v_cache)
        if (
            fn is None
            or hd % 2
            or qkv.dim() != 2
            or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * hd
            or any(t.dtype != qkv.dtype or not t.is_contiguous() or t.device.type != "cpu" for t in tensors)
            or sin_signed.shape != cos.shape
            or k_cache.dim() != 4
            or k_cache.shape != v_cache.shape
            or k_cache.shape[1] != num_kv_heads
            or k_cache.shape[3] != hd
            or pos.dtype != torch.int64
            or slots.dtype != torch.int64
            or pos.shape != (tokens,)
            or slots.shape != (tokens,)
            or not (pos.is_contiguous() and slots.is_contiguous())
        ):
            raise ValueError("rope_cache: unsupported dtype, shape or layout")
        q = torch.empty((tokens, num_heads, hd), dtype=qkv.dtype)
        code = fn(
            qkv.data_ptr(),
            cos.data_ptr(),
            sin_signed.data_ptr(),
            pos.data_ptr(),
            slots.data_ptr(),
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            tokens,
            num_heads,
            num_kv_heads,
            hd,
            cos.shape[0],
            k_cache.shape[0],
            k_cache.shape[2],
        )
        if code:
            raise ValueError("rope_cache: a position or slot is out of range")
        return q
