"""The packed register-tile linear kernels' ctypes bindings: :class:`LinearVnni` (``linear_vnni.c``, bf16) and
:class:`LinearFma` (``linear_fma.c``, packed by ``linear_fma_pack.c``; float32, also from GGUF blocks:
:class:`TiledBlocks`).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import torch

from ..block_quant import QK, BlockWeight
from .linear import _bias_fits


class _PackedLinear:
    """What the packed register-tile kernels (``linear_vnni.c``, ``linear_fma.c``) share: ``y = x @ W.T (+ bias)`` for
    any number of rows with ``W`` packed once in the kernel's panel layout (:meth:`pack`); or, packed with
    ``swiglu=True``, LlamaMLP's ``silu(x @ Wg.T) * (x @ Wu.T)`` from the fused ``[gate; up]`` weight in one pass.

    Both are the register-blocked micro-kernel of BLIS (Goto & van de Geijn, 2008; oneDNN's brgemm), reading each
    weight once from DRAM per call and prefetching the next column block while computing one. Subclasses name the
    dtype, the entry points and the shapes they take.

    Call with ``x`` ``[m, k]`` (the kernel's dtype, contiguous, ``m >= 0``), the packed weight (``[n, k]``, from
    :meth:`pack`) and ``bias`` ``[n]`` or ``None``; returns ``[m, n]``, or ``[m, n / 2]`` with ``swiglu``. Sums in
    float32.

    Raises:
        ValueError: a dtype, shape or layout the kernel does not take.
    """

    #: The dtype of x, the weight, the bias and y.
    dtype: torch.dtype
    #: Output columns per panel (``n`` must be a multiple; twice that with ``swiglu``); a kernel whose width depends on
    #: how the library was built sets it from the library.
    panel: int
    #: ``k`` must be a multiple of this.
    k_multiple: int
    #: Entry points in the library: the matmul and the packer.
    entry: str
    pack_entry: str

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = getattr(lib, self.entry)
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        self._pack = getattr(lib, self.pack_entry)
        self._pack.restype = None
        self._pack.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_int]

    @property
    def available(self) -> bool:
        """Whether the library was built with the instructions the kernel needs (``False``: every call is refused)."""
        probe = torch.zeros((1, 16), dtype=self.dtype)
        out = torch.empty((1, 16), dtype=self.dtype)
        return self._fn(probe.data_ptr(), probe.data_ptr(), None, out.data_ptr(), 1, 16, 16, 0) == 0

    def supports(self, weight: torch.Tensor, swiglu: bool = False) -> bool:
        """Whether :meth:`pack` takes ``weight``: ``[n, k]`` of the kernel's dtype on CPU, ``n`` a multiple of the
        panel width (twice that with ``swiglu``), ``k`` a multiple of ``k_multiple``."""
        return (
            weight.dtype == self.dtype
            and weight.dim() == 2
            and weight.device.type == "cpu"
            and weight.shape[0] % (2 * self.panel if swiglu else self.panel) == 0
            and weight.shape[0] > 0
            and weight.shape[1] % self.k_multiple == 0
            and weight.shape[1] > 0
        )

    def pack(self, weight: torch.Tensor, swiglu: bool = False) -> torch.Tensor:
        """``weight`` ``[n, k]`` in the kernel's layout (a new ``[n, k]`` tensor); with ``swiglu`` (``weight`` =
        ``[gate; up]``) gate and up panels alternate.

        Raises:
            ValueError: a weight :meth:`supports` refuses.
        """
        if not self.supports(weight, swiglu):
            raise ValueError(f"{self.entry}: unsupported weight dtype, shape or device")
        weight = weight.contiguous()
        out = torch.empty_like(weight)
        self._pack(weight.data_ptr(), out.data_ptr(), weight.shape[0], weight.shape[1], int(swiglu))
        return out

    def __call__(
        self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, swiglu: bool = False
    ) -> torch.Tensor:
        m, k = x.shape
        n = packed.shape[0]
        if (
            x.dtype != self.dtype
            or packed.dtype != self.dtype
            or packed.shape[1] != k
            or not (x.is_contiguous() and packed.is_contiguous())
            or x.device.type != "cpu"
            or not _bias_fits(bias, x.dtype, n)
            or (swiglu and bias is not None)
        ):
            raise ValueError(f"{self.entry}: unsupported dtype, shape or layout")
        y = torch.empty((m, n // 2 if swiglu else n), dtype=x.dtype)
        if m == 0:  # e.g. the lm_head of a step whose prefill chunks all end before their prompt does
            return y
        code = self._fn(
            x.data_ptr(),
            packed.data_ptr(),
            None if bias is None else bias.data_ptr(),
            y.data_ptr(),
            m,
            n,
            k,
            int(swiglu),
        )
        if code:
            raise ValueError(f"{self.entry}: kernel refused the call (code {code})")
        return y


class LinearVnni(_PackedLinear):
    """``linear_vnni.c`` bound with ctypes: the packed linear (:class:`_PackedLinear`) in bf16, the weight in
    vdpbf16ps's VNNI layout (panels of 16 output columns, each ``[k / 2, 16, 2]``).

    On a 2-vCPU Zen 5 (AVX512-BF16, no AMX) it runs the default model's projections at 32 rows in 10.2-11.9 ms against
    oneDNN's 16.2, and at 512 rows ~10 % faster (the file's header has the figures). Only for CPUs with AVX512-BF16:
    :func:`inference.engine.kernels.linear_vnni` is ``None`` elsewhere.
    """

    dtype = torch.bfloat16
    panel = 16
    k_multiple = 2
    entry = "linear_vnni_bf16"
    pack_entry = "vnni_pack_bf16"


class TiledBlocks(NamedTuple):
    """A weight's GGUF blocks in :class:`LinearFma`'s panel order (:meth:`LinearFma.pack_blocks`), for ``n`` output
    and ``k`` input features: ``qp`` the quants (Q8_0: int8 ``[n, k]``; Q4_1: uint8 ``[n, k / 2]``, two columns a
    byte), ``dp`` the scales and ``mp`` the Q4_1 minimums (float32 ``[n, k / 32]``; ``mp`` ``None`` for Q8_0), and
    whether gate and up panels alternate (``swiglu``)."""

    kind: str
    qp: torch.Tensor
    dp: torch.Tensor
    mp: torch.Tensor | None
    swiglu: bool

    @property
    def out_features(self) -> int:
        return self.dp.shape[0]


class LinearFma(_PackedLinear):
    """``linear_fma.c`` (its packing: ``linear_fma_pack.c``) bound with ctypes: the packed linear
    (:class:`_PackedLinear`) in float32 on AVX2/FMA CPUs, the weight in panels of :attr:`panel` output columns, each
    ``[k, panel]``: 8 with AVX2 (6 x 16 register tiles, BLIS's haswell sgemm shape), 16 on a CPU with AVX-512 (6 x 64
    tiles in 24 of the 32 zmm registers).

    On a 2-vCPU AVX2 EPYC the default model's projections at 32 rows take 59-79 ms against oneDNN's 75-87 (weights from
    DRAM), and 512 rows are level with oneDNN (the file's header; README, Performance, round 11); on a 2-vCPU Zen 5
    (AVX-512) 25 against 29 ms at 32 rows, 326 against 314 at 512 (round 14). Only for CPUs with AVX2 and FMA:
    :func:`inference.engine.kernels.linear_fma` is ``None`` elsewhere.

    A weight that is exactly GGUF Q8_0 or Q4_1 values can be read in that form (:meth:`pack_blocks`,
    :meth:`call_blocks`), each column block dequantized in cache into float panels: the same sums bit for bit at 8.5
    or 5 bits a weight instead of 32 (README, Performance, rounds 13 and 14).
    """

    dtype = torch.float32
    panel = 8
    k_multiple = 1
    entry = "linear_fma_f32"
    pack_entry = "fma_pack_f32"

    def __init__(self, lib: ctypes.CDLL) -> None:
        super().__init__(lib)
        lib.fma_panel.restype = ctypes.c_int
        lib.fma_panel.argtypes = []
        self.panel = int(lib.fma_panel())
        self._q8 = lib.linear_fma_q8
        self._q8.restype = ctypes.c_int
        self._q8.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3
        self._pack_q8 = lib.fma_pack_q8
        self._pack_q8.restype = None
        self._pack_q8.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2
        self._q4 = lib.linear_fma_q4_1
        self._q4.restype = ctypes.c_int
        self._q4.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        self._pack_q4 = lib.fma_pack_q4_1
        self._pack_q4.restype = None
        self._pack_q4.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 2 + [ctypes.c_int]

    def supports_blocks(self, weight: BlockWeight | None, swiglu: bool = False) -> bool:
        """Whether :meth:`pack_blocks` takes ``weight``: Q8_0 or Q4_1 blocks of an ``[n, k]`` weight, ``n`` a multiple
        of :attr:`panel` (twice that with ``swiglu``, which Q8_0 does not take)."""
        if weight is None or weight.kind not in ("q8_0", "q4_1") or (swiglu and weight.kind != "q4_1"):
            return False
        n = weight.d.shape[0]
        return n > 0 and n % (2 * self.panel if swiglu else self.panel) == 0

    def pack_blocks(self, weight: BlockWeight, swiglu: bool = False) -> TiledBlocks:
        """The blocks in the kernel's panel order (:class:`TiledBlocks`): 8.5 (Q8_0) or 5 (Q4_1) bits a weight against
        the float panels' 32. With ``swiglu`` (Q4_1 blocks of the fused ``[gate; up]`` weight) gate and up panels
        alternate, as :meth:`pack` does.

        Raises:
            ValueError: a weight :meth:`supports_blocks` refuses.
        """
        if not self.supports_blocks(weight, swiglu):
            raise ValueError(
                f"linear_fma: only Q8_0 or Q4_1 blocks of a weight with a multiple of {self.panel} rows "
                "(Q4_1 and twice that with swiglu)"
            )
        n, nb = weight.d.shape
        k = nb * QK
        qp, dp = torch.empty_like(weight.qs), torch.empty_like(weight.d)
        if weight.kind == "q8_0":
            self._pack_q8(weight.qs.data_ptr(), weight.d.data_ptr(), qp.data_ptr(), dp.data_ptr(), n, k)
            return TiledBlocks("q8_0", qp, dp, None, False)
        mp = torch.empty_like(weight.mn)
        self._pack_q4(
            weight.qs.data_ptr(),
            weight.d.data_ptr(),
            weight.mn.data_ptr(),
            qp.data_ptr(),
            dp.data_ptr(),
            mp.data_ptr(),
            n,
            k,
            int(swiglu),
        )
        return TiledBlocks("q4_1", qp, dp, mp, swiglu)

    def call_blocks(self, x: torch.Tensor, packed: TiledBlocks, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T (+ bias)``, or ``silu(x @ Wg.T) * (x @ Wu.T)`` for blocks packed with ``swiglu``, with ``W`` given
        as :meth:`pack_blocks`'s panels, each column block dequantized in cache (``x`` float32 ``[m, k]`` contiguous,
        ``m >= 0``; returns ``[m, n]``, ``[m, n / 2]`` with ``swiglu``). The sums are bit for bit those of the float
        panels of the same (dequantized) weight: same order, same weights.

        Raises:
            ValueError: a dtype, shape or layout the kernel does not take.
        """
        m, k = x.shape
        n = packed.out_features
        if (
            x.dtype != torch.float32
            or packed.dp.shape[1] * QK != k
            or not x.is_contiguous()
            or x.device.type != "cpu"
            or not _bias_fits(bias, x.dtype, n)
            or (packed.swiglu and bias is not None)
        ):
            raise ValueError("linear_fma: unsupported dtype, shape or layout for block panels")
        y = torch.empty((m, n // 2 if packed.swiglu else n), dtype=x.dtype)
        if m == 0:
            return y
        bias_ptr = None if bias is None else bias.data_ptr()
        if packed.kind == "q8_0":
            code = self._q8(
                x.data_ptr(), packed.qp.data_ptr(), packed.dp.data_ptr(), bias_ptr, y.data_ptr(), m, n, k
            )
        else:
            code = self._q4(
                x.data_ptr(),
                packed.qp.data_ptr(),
                packed.dp.data_ptr(),
                packed.mp.data_ptr(),
                bias_ptr,
                y.data_ptr(),
                m,
                n,
                k,
                int(packed.swiglu),
            )
        if code:
            raise ValueError(f"linear_fma ({packed.kind}): kernel refused the call (code {code})")
        return y
