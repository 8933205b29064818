"""The few-rows and block-quantized linear kernels' ctypes bindings: :class:`LinearRows` (``linear_rows.c``),
:class:`LinearBlocks` (``linear_blocks.c``) and :class:`LinearAmx` (``linear_amx.c``); the packed register-tile ones are
in :mod:`.linear_tiled`. Built and loaded with the other kernels by :mod:`inference.engine.kernels.build`, and returned
bound to the library by :mod:`inference.engine.kernels`' factories (``linear_rows()`` ...).
"""

from __future__ import annotations

import ctypes

import torch

from ..block_quant import QK, BlockWeight


def _bias_fits(bias: torch.Tensor | None, dtype: torch.dtype, n: int) -> bool:
    """Whether ``bias`` is absent or a contiguous ``[n]`` tensor of ``dtype`` (what the linear kernels take)."""
    return bias is None or (bias.dtype == dtype and bias.shape == (n,) and bias.is_contiguous())


class LinearRows:
    """``linear_rows.c`` bound with ctypes: ``y = x @ weight.T (+ bias)`` for 1 to ``MAX_ROWS`` rows of ``x``.

    For a decode step of one sequence oneDNN's packed kernel reads the weights well below memory bandwidth;
    this kernel streams each weight row once (float32 sums). Call with ``x`` ``[m, k]``, ``weight`` ``[n, k]``
    and ``bias`` ``[n]`` or ``None``, all contiguous and of one dtype (bfloat16 or float32); returns
    ``[m, n]``.

    Raises:
        ValueError: a dtype, shape or row count the kernel does not take.
    """

    #: Rows the kernel takes (``MAX_M`` in linear_rows.c).
    MAX_ROWS = 8

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fns = {torch.bfloat16: lib.linear_rows_bf16, torch.float32: lib.linear_rows_f32}
        for fn in self._fns.values():
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_void_p]

    def supports(self, weight: torch.Tensor) -> bool:
        """Whether the kernel takes this weight (dtype, contiguous, in-features a multiple of 16, on CPU)."""
        return (
            weight.dtype in self._fns
            and weight.dim() == 2
            and weight.is_contiguous()
            and weight.shape[1] % 16 == 0
            and weight.device.type == "cpu"
        )

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        m, k = x.shape
        n = weight.shape[0]
        if (
            not 1 <= m <= self.MAX_ROWS
            or not self.supports(weight)
            or x.dtype != weight.dtype
            or weight.shape[1] != k
            or not x.is_contiguous()
            or not _bias_fits(bias, x.dtype, n)
        ):
            raise ValueError("linear_rows: unsupported dtype, shape or row count")
        y = torch.empty((m, n), dtype=x.dtype)
        scratch = torch.empty(m * k, dtype=torch.float32)
        code = self._fns[x.dtype](
            x.data_ptr(),
            weight.data_ptr(),
            None if bias is None else bias.data_ptr(),
            y.data_ptr(),
            m,
            n,
            k,
            scratch.data_ptr(),
        )
        if code:
            raise ValueError(f"linear_rows: kernel refused the call (code {code})")
        return y


class LinearBlocks:
    """``linear_blocks.c`` bound with ctypes: ``y = x @ W.T (+ bias)`` for 1 to ``MAX_ROWS`` rows of ``x``, with ``W``
    in GGUF block form (:class:`~inference.engine.block_quant.BlockWeight`, Q4_1 or Q8_0).

    A one-sequence decode step is bound by the bytes of weights it reads; the default model's weights are
    block-quantized values, which this kernel reads at ~5 (Q4_1) or ~8.5 (Q8_0) bits each instead of the 32 of
    float32, computing in float32 with exactly those values (llama.cpp's dot-product factoring, activations not
    quantized). Call with ``x`` ``[m, k]`` (float32 or bfloat16, contiguous), the weight's ``BlockWeight`` and
    ``bias`` ``[n]`` (``x``'s dtype) or ``None``; returns ``[m, n]`` in ``x``'s dtype.

    Raises:
        ValueError: a dtype, shape or row count the kernel does not take.
    """

    #: Rows the binding takes (the kernel itself goes through any number, 8 at a time: ``MAX_M``).
    MAX_ROWS = 64

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fns = {
            ("q4_1", torch.float32): lib.linear_q4_1_f32,
            ("q4_1", torch.bfloat16): lib.linear_q4_1_bf16,
            ("q8_0", torch.float32): lib.linear_q8_0_f32,
            ("q8_0", torch.bfloat16): lib.linear_q8_0_bf16,
        }
        for fn in self._fns.values():
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 3 + [ctypes.c_void_p]

    def __call__(self, x: torch.Tensor, weight: BlockWeight, bias: torch.Tensor | None) -> torch.Tensor:
        m, k = x.shape
        n, nb = weight.d.shape
        fn = self._fns.get((weight.kind, x.dtype))
        if (
            fn is None
            or not 1 <= m <= self.MAX_ROWS
            or nb * QK != k
            or not x.is_contiguous()
            or x.device.type != "cpu"
            or not _bias_fits(bias, x.dtype, n)
        ):
            raise ValueError("linear_blocks: unsupported dtype, shape or row count")
        y = torch.empty((m, n), dtype=x.dtype)
        scratch = torch.empty(m * k + m * nb, dtype=torch.float32)
        code = fn(
            x.data_ptr(),
            weight.qs.data_ptr(),
            weight.d.data_ptr(),
            None if weight.mn is None else weight.mn.data_ptr(),
            None if bias is None else bias.data_ptr(),
            y.data_ptr(),
            m,
            n,
            k,
            scratch.data_ptr(),
        )
        if code:
            raise ValueError(f"linear_blocks: kernel refused the call (code {code})")
        return y


class LinearAmx:
    """``linear_amx.c`` bound with ctypes: bf16 ``y = x @ W.T (+ bias)`` for any number of rows with ``W`` in GGUF block
    form (:class:`~inference.engine.block_quant.BlockWeight`, Q4_1 or Q8_0), dequantized to bf16 in cache and
    multiplied on Intel AMX tiles; or, with ``swiglu`` and the fused ``[gate; up]`` weight, LlamaMLP's
    ``silu(x @ Wg.T) * (x @ Wu.T)``, ``[m, n / 2]``.

    A bf16 decode step of many sequences is bound by the weight bytes it reads; this reads ~5 (Q4_1) or ~8.5 (Q8_0)
    bits per weight instead of 16, and multiplies exactly the bf16 weights (the float32 dequantized values rounded
    to nearest even) with float32 sums (the file's header has the layout and sources). Only for CPUs with AMX
    under a kernel that grants it: :func:`inference.engine.kernels.linear_amx` is ``None`` elsewhere.

    Call with ``x`` ``[m, k]`` bf16 (contiguous, ``m >= 0``), the weight's ``BlockWeight`` (``[n, k]``) and ``bias``
    ``[n]`` bf16 or ``None`` (``None`` with ``swiglu``).

    Raises:
        ValueError: a dtype, shape or layout the kernel does not take (:meth:`supports`).
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fns = {"q4_1": lib.linear_amx_q4_1, "q8_0": lib.linear_amx_q8_0}
        for kind, fn in self._fns.items():
            fn.restype = ctypes.c_int
            scales = 2 if kind == "q4_1" else 1  # d (and mn)
            fn.argtypes = (
                [ctypes.c_void_p] * (4 + scales) + [ctypes.c_int64] * 3 + [ctypes.c_int, ctypes.c_void_p]
            )
        self._available = lib.linear_amx_available
        self._available.restype = ctypes.c_int
        self._available.argtypes = []

    @property
    def available(self) -> bool:
        """Whether this build has the AMX instructions and the OS lets this process use the tiles."""
        return bool(self._available())

    @staticmethod
    def supports(weight: BlockWeight, swiglu: bool = False) -> bool:
        """Whether the kernel takes ``weight``: ``n`` a multiple of 16 (32 with ``swiglu``), ``k`` of 32."""
        n, nb = weight.d.shape
        return n > 0 and nb > 0 and n % (32 if swiglu else 16) == 0

    def __call__(
        self, x: torch.Tensor, weight: BlockWeight, bias: torch.Tensor | None, swiglu: bool = False
    ) -> torch.Tensor:
        m, k = x.shape
        n, nb = weight.d.shape
        if (
            x.dtype != torch.bfloat16
            or nb * QK != k
            or not self.supports(weight, swiglu)
            or not x.is_contiguous()
            or x.device.type != "cpu"
            or not _bias_fits(bias, x.dtype, n)
            or (swiglu and bias is not None)
        ):
            raise ValueError("linear_amx: unsupported dtype, shape or layout")
        y = torch.empty((m, n // 2 if swiglu else n), dtype=x.dtype)
        if m == 0:
            return y
        xpack = torch.empty(-(-m // 16) * 16 * k, dtype=torch.bfloat16)
        scales = [weight.d.data_ptr()] + ([weight.mn.data_ptr()] if weight.mn is not None else [])
        code = self._fns[weight.kind](
            x.data_ptr(),
            weight.qs.data_ptr(),
            *scales,
            None if bias is None else bias.data_ptr(),
            y.data_ptr(),
            m,
            n,
            k,
            int(swiglu),
            xpack.data_ptr(),
        )
        if code:
            raise ValueError(f"linear_amx: kernel refused the call (code {code})")
        return y
