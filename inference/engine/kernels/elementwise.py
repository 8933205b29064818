"""The element-wise kernels' ctypes binding: :class:`Elementwise` (``elementwise.c``: RMSNorm alone or after the
residual add, SiLU-and-multiply, the greedy argmax). Built and loaded with the other kernels by
:mod:`inference.engine.kernels.build`.
"""

from __future__ import annotations

import ctypes

import torch


class Elementwise:
    """``elementwise.c`` bound with ctypes: a Llama layer's RMSNorm (alone or after the residual add) and
    SiLU-and-multiply, one call each, and the row-wise argmax of greedy decoding.

    Both take contiguous CPU tensors of one dtype (float32 or bfloat16) and return new ones; the math and the
    rounding points are torch's (``LlamaRMSNorm``, ``F.silu(gate) * up``), the mean of squares summed in another
    order.

    Raises:
        ValueError: a dtype, shape or layout the kernels do not take.
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._norm = {torch.float32: lib.rms_norm_f32, torch.bfloat16: lib.rms_norm_bf16}
        self._add_norm = {torch.float32: lib.add_rms_norm_f32, torch.bfloat16: lib.add_rms_norm_bf16}
        for fn in self._add_norm.values():
            fn.restype = None
            fn.argtypes = (
                [ctypes.c_void_p] * 2 + [ctypes.c_int64] + [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
            )
            fn.argtypes += [ctypes.c_float]
        self._silu_mul = {torch.float32: lib.silu_mul_f32, torch.bfloat16: lib.silu_mul_bf16}
        for fn in self._norm.values():
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float]
        for fn in self._silu_mul.values():
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
        self._argmax = {torch.float32: lib.argmax_f32, torch.bfloat16: lib.argmax_bf16}
        for fn in self._argmax.values():
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``weight * (x * rsqrt(mean(x**2, -1) + eps))`` for ``x`` ``[rows, dim]`` and ``weight`` ``[dim]``."""
        fn = self._norm.get(x.dtype)
        if (
            fn is None
            or x.dim() != 2
            or weight.shape != (x.shape[1],)
            or weight.dtype != x.dtype
            or not (x.is_contiguous() and weight.is_contiguous())
            or x.device.type != "cpu"
        ):
            raise ValueError("rms_norm: unsupported dtype, shape or layout")
        y = torch.empty_like(x)
        fn(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], eps)
        return y

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """The residual add and the next RMSNorm in one pass: ``x[:d] += delta`` in place (``delta`` ``[d, dim]``,
        ``d <= rows``, rounded to the dtype as ``add_``), then returns :meth:`rms_norm` of all of ``x``
        ``[rows, dim]``."""
        fn = self._add_norm.get(x.dtype)
        if (
            fn is None
            or x.dim() != 2
            or delta.dim() != 2
            or delta.shape[1] != x.shape[1]
            or delta.shape[0] > x.shape[0]
            or weight.shape != (x.shape[1],)
            or not (x.dtype == delta.dtype == weight.dtype)
            or not (x.is_contiguous() and delta.is_contiguous() and weight.is_contiguous())
            or x.device.type != "cpu"
        ):
            raise ValueError("add_rms_norm: unsupported dtype, shape or layout")
        y = torch.empty_like(x)
        fn(x.data_ptr(), delta.data_ptr(), delta.shape[0], weight.data_ptr(), y.data_ptr(), *x.shape, eps)
        return y

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate_up[:, :I]) * gate_up[:, I:]`` for ``gate_up`` ``[rows, 2 * I]``; returns ``[rows, I]``."""
        fn = self._silu_mul.get(gate_up.dtype)
        if fn is None or gate_up.dim() != 2 or gate_up.shape[1] % 2 or not gate_up.is_contiguous():
            raise ValueError("silu_mul: unsupported dtype, shape or layout")
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        y = torch.empty((rows, inter), dtype=gate_up.dtype)
        fn(gate_up.data_ptr(), y.data_ptr(), rows, inter)
        return y

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """``x.argmax(-1)`` for ``x`` ``[rows, n]`` (``n >= 1``): int64 ``[rows]``, the first index of each row's
        maximum, a NaN counting as the maximum, as torch's."""
        fn = self._argmax.get(x.dtype)
        if fn is None or x.dim() != 2 or x.shape[1] < 1 or not x.is_contiguous() or x.device.type != "cpu":
            raise ValueError("argmax: unsupported dtype, shape or layout")
        out = torch.empty(x.shape[0], dtype=torch.int64)
        fn(x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1])
        return out
