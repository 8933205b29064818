"""The runner's projections: :class:`Linear` (``x @ W.T + b``) and :class:`GatedUp` (LlamaMLP's
``silu(x @ Wg.T) * (x @ Wu.T)``), each bound once at load time to the implementations the kernel registry
(:mod:`inference.engine.kernels.registry`) chooses for this CPU, dtype and every band of row counts.

Each implementation's builder below takes the layer's weights, packs them as that kernel wants (GGUF blocks in panel
order, VNNI or FMA panels, oneDNN's reordered copy), or returns ``None`` when the weights do not fit it; the
registry calls it only for kernels it would choose, so no copy is packed that no band uses. A call then picks its
band by row count: one comparison per band, no chain of fallbacks (vLLM's ``CustomOp.dispatch_forward``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from . import block_quant, kernels
from .kernels import registry
from .kernels.registry import Band, KernelMemory

#: oneDNN builds and caches a primitive (with its own buffers) per matmul row count, so a long-lived engine that
#: has served many prompt lengths grew by ~415 MB over 212 lengths (952 -> 1367 MB resident, bf16, 2026-11-24).
#: Steps of more rows than this are padded to a multiple of it: about 50 shapes at most (1-32, then
#: multiples of 32 up to the step budget), +53 MB over the same lengths; no measurable cost (a 512-row prefill step
#: is already a multiple, a 1500-token prompt's last 476-row chunk becomes 480 rows).
ROW_BUCKET = 32

#: The oneDNN implementations, which build a primitive per row count (``ModelRunner.warm_up`` builds them early).
ONEDNN = frozenset({"onednn", "onednn_swiglu"})


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + b`` with ``W`` pre-packed by ``torch.ops.mkldnn._reorder_linear_weight``; ``x`` ``[m, k]``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def bucket_rows(m: int) -> int:
    """``m`` rounded up to a multiple of ``ROW_BUCKET`` when over it (the row count :func:`bucketed` runs), else ``m``."""
    return m if m <= ROW_BUCKET or m % ROW_BUCKET == 0 else m + ROW_BUCKET - m % ROW_BUCKET


def bucketed(x: torch.Tensor, matmul: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``matmul(x)`` with ``x`` ``[m, k]`` padded with zero rows to a multiple of ``ROW_BUCKET`` when ``m`` is over it
    (each output row depends on its own input row only, so the padding's rows are dropped)."""
    m = x.shape[0]
    if bucket_rows(m) == m:
        return matmul(x.contiguous())
    return matmul(F.pad(x, (0, 0, 0, bucket_rows(m) - m)))[:m]


def onednn_pack(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``weight`` reordered once for oneDNN (what TorchInductor's CPU freezing pass does), or ``None`` when the private
    op is missing or disagrees with ``F.linear`` on a probe.

    ``F.linear`` on CPU re-lays-out the weight for oneDNN on every call; for the small-M matmuls of decoding this
    costs 30-45% extra (measured on AVX-512-BF16: gate/up [32x576]x[576x3072] 0.93 -> 0.66 ms, lm_head 16 -> 10.7 ms).
    """
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        got = onednn_linear(probe, packed, bias).float()
        want = F.linear(probe, weight, bias).float()
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    tol = 1e-2 if weight.dtype != torch.float32 else 1e-4
    if not torch.allclose(got, want, rtol=tol, atol=tol * float(want.abs().max().clamp(min=1.0))):
        return None
    return packed


def onednn_gated(weight: torch.Tensor, inter: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``silu(x @ Wg.T) * (x @ Wu.T)`` from the fused ``[2I, k]`` bf16 weight as two oneDNN matmuls, the gate's with
    SiLU as its post-op (``swish``), the up projection's with the product as a binary post-op (``mul``): the epilogue
    fusion TorchInductor's CPU backend does with the same ops. ``None`` when the ops are missing or disagree with
    ``F.silu(x @ Wg.T) * (x @ Wu.T)`` on a probe.

    The fused matmul writes ``[m, 2I]`` and ``silu_mul`` reads it back: at 2048 rows 12.6 MB out and in per layer,
    memory-bound; here only the ``[m, I]`` activation is written in between (2-vCPU Xeon, one layer of the default
    model: 2048 rows 3.9 -> 3.0 ms, 32 rows 0.153 -> 0.124 ms). The SiLU and product are taken on the float32
    accumulators, without the bf16 roundings torch's ops make between them (outputs differ by bf16 rounding).
    """
    try:
        gate = torch.ops.mkldnn._reorder_linear_weight(weight[:inter].contiguous(), None)
        up = torch.ops.mkldnn._reorder_linear_weight(weight[inter:].contiguous(), None)

        def matmuls(rows: torch.Tensor) -> torch.Tensor:
            act = torch.ops.mkldnn._linear_pointwise(rows, gate, None, "swish", [], "")
            return torch.ops.mkldnn._linear_pointwise.binary(rows, act, up, None, "mul")

        probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        got = matmuls(probe).float()
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    gu = F.linear(probe.float(), weight.float())
    want = F.silu(gu[:, :inter]) * gu[:, inter:]
    if not torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max().clamp(min=1.0))):
        return None
    return lambda x: bucketed(x, matmuls)


@dataclass(frozen=True)
class Natives:
    """The native kernel bindings a runner builds from (each ``None`` where it cannot be had: no library, or a CPU or
    OS without the instructions), and the registry's settings."""

    rows: kernels.LinearRows | None = None
    blocks: kernels.LinearBlocks | None = None
    amx: kernels.LinearAmx | None = None
    fma: kernels.LinearFma | None = None
    vnni: kernels.LinearVnni | None = None
    elementwise: kernels.Elementwise | None = None
    native: bool = False
    memory: KernelMemory = "fast"

    @classmethod
    def load(cls, *, native: bool, memory: KernelMemory = "fast") -> Natives:
        """The bindings (built on first use) when ``native``, else none."""
        if not native:
            return cls(memory=memory)
        return cls(
            rows=kernels.linear_rows(),
            blocks=kernels.linear_blocks(),
            amx=kernels.linear_amx(),
            fma=kernels.linear_fma(),
            vnni=kernels.linear_vnni(),
            elementwise=kernels.elementwise(),
            native=True,
            memory=memory,
        )

    def silu_mul(self, inter: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """``silu(gu[:, :I]) * gu[:, I:]``: the native kernel's or torch's (LlamaMLP's order)."""
        if self.elementwise is not None:
            return self.elementwise.silu_mul

        def torch_silu_mul(gu: torch.Tensor) -> torch.Tensor:
            act = F.silu(gu[:, :inter])
            return act.mul_(gu[:, inter:])

        return torch_silu_mul


class _Banded:
    """What :class:`Linear` and :class:`GatedUp` share: the weights, the bands chosen at load, the call by row count."""

    bands: list[Band]
    weight: torch.Tensor | None
    block_weight: block_quant.BlockWeight | None

    def _blocks(self) -> block_quant.BlockWeight | None:
        """The weight's GGUF blocks, as given or recovered from a float32 weight (once), when they fit its shape."""
        if self._recovered is None:
            bw = self.block_weight if self.block_weight is not None else block_quant.recover(self.weight)
            w = self.weight
            fits = (
                bw is not None
                and bw.d.shape[0] == w.shape[0]
                and bw.d.shape[1] * block_quant.QK == w.shape[1]
            )
            self._recovered = (bw if fits else None,)
        return self._recovered[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        if m == 0:  # e.g. the lm_head of a step whose prefill chunks all end before their prompts do
            return self.bands[-1][2](x)
        for upto, _, fn in self.bands:
            if upto is None or m <= upto:
                return fn(x)
        raise AssertionError("the last band takes any number of rows")

    def kernel_for(self, rows: int) -> str:
        """The name of the implementation a call of ``rows`` rows runs."""
        return next(k.name for upto, k, _ in self.bands if upto is None or rows <= upto)

    def rows_upto(self, name: str) -> int:
        """The most rows the implementation ``name`` serves here (0: none)."""
        return max((upto or 1 << 30 for upto, k, _ in self.bands if k.name == name), default=0)

    def release_weight(self) -> None:
        """Drop the reference to the float weight (once :attr:`covered`: no band reads it)."""
        self.weight = None

    @property
    def covered(self) -> bool:
        """Whether no row count reads the float weight and some read the GGUF blocks, so the float weight may go."""
        forms = {k.form for _, k, _ in self.bands}
        return "float" not in forms and "blocks" in forms


class Linear(_Banded):
    """``y = x @ W.T + b``, ``[m, k] -> [m, n]``, through the implementations the registry chose for each band of row
    counts (op ``"linear"``): GGUF blocks for a few rows, the float weight streamed for one, AMX tiles from blocks,
    register-tile panels (FMA, VNNI, from blocks or float), or oneDNN's packed copy; ``F.linear`` where nothing else
    takes the weight.

    Args:
        weight: ``[n, k]`` (float32 or bfloat16).
        bias: ``[n]`` or ``None``.
        block_weight: The weight's GGUF blocks from the loader (a bf16 weight is rounded, so only the float32
            checkpoint gives them); ``None``: recovered from a float32 weight where it is exactly block values.
        natives: The native bindings and settings (:meth:`Natives.load`).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        block_weight: block_quant.BlockWeight | None = None,
        natives: Natives,
    ) -> None:
        self.weight, self.bias, self.block_weight = weight, bias, block_weight
        self._natives, self._recovered = natives, None
        self.bands = registry.choose(
            "linear", weight.dtype, self._build, native=natives.native, memory=natives.memory
        )
        self.block_weight = self._recovered[0] if self._recovered else None

    def _build(self, entry: registry.Kernel) -> Callable[[torch.Tensor], torch.Tensor] | None:
        n, w, b = self._natives, self.weight, self.bias
        name = entry.name
        if name == "linear_blocks" and n.blocks is not None and (bw := self._blocks()) is not None:
            return lambda x: n.blocks(x.contiguous(), bw, b)
        if name == "linear_rows" and n.rows is not None and n.rows.supports(w):
            return lambda x: n.rows(x.contiguous(), w, b)
        if (
            name == "linear_amx"
            and n.amx is not None
            and n.blocks is not None
            and (bw := self._blocks()) is not None
        ):
            return (lambda x: n.amx(x.contiguous(), bw, b)) if n.amx.supports(bw) else None
        if name == "linear_fma_blocks" and n.fma is not None and n.blocks is not None and n.fma.supports(w):
            bw = self._blocks()
            if n.fma.supports_blocks(bw):
                tiles = n.fma.pack_blocks(bw)
                return lambda x: n.fma.call_blocks(x.contiguous(), tiles, b)
        if name in ("linear_fma", "linear_vnni"):
            tiled = n.fma if name == "linear_fma" else n.vnni
            if tiled is not None and tiled.supports(w):
                packed = tiled.pack(w)
                return lambda x: tiled(x.contiguous(), packed, b)
        if name == "onednn" and w.dtype in (torch.float32, torch.bfloat16) and w.device.type == "cpu":
            packed = onednn_pack(w, b)
            return None if packed is None else (lambda x: bucketed(x, lambda r: onednn_linear(r, packed, b)))
        if name == "torch":
            return lambda x: F.linear(x, w, b)
        return None

    @property
    def packed(self) -> bool:
        """Whether some band runs on oneDNN's packed copy."""
        return any(k.name == "onednn" for _, k, _ in self.bands)


class GatedUp(_Banded):
    """LlamaMLP's ``silu(x @ Wg.T) * (x @ Wu.T)``, ``[m, k] -> [m, I]``, from the fused ``[gate; up]`` weight, through
    the implementations the registry chose for each band of row counts (op ``"gated_up"``): the few-rows linear
    kernels then ``silu_mul``; one pass of a register-tile kernel with the activation as its epilogue (VNNI in bf16,
    FMA in float32, from Q4_1 blocks or float panels; 2-vCPU Zen 5, bf16, one layer of the default model, 32 rows:
    oneDNN's gated form 0.23 ms, a VNNI matmul then ``silu_mul`` 0.17, fused 0.14-0.16); AMX tiles from blocks; oneDNN
    with post-ops; or the linear op's choice then ``silu_mul`` (``unfused``).

    Args:
        weight: The fused ``[2I, k]`` weight; ``bias`` ``[2I]`` or ``None`` (then only the unfused forms).
        inter: ``I``.
        block_weight: The fused weight's GGUF blocks (``[gate; up]``), as for :class:`Linear`.
        natives: The native bindings and settings.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        inter: int,
        *,
        block_weight: block_quant.BlockWeight | None = None,
        natives: Natives,
    ) -> None:
        self.weight, self.bias, self.block_weight, self.inter = weight, bias, block_weight, inter
        self._natives, self._recovered = natives, None
        self._silu_mul = natives.silu_mul(inter)
        #: The ``[2I]``-wide projection of the ``unfused`` band, when one was chosen.
        self.linear: Linear | None = None
        self.bands = registry.choose(
            "gated_up", weight.dtype, self._build, native=natives.native, memory=natives.memory
        )
        self.block_weight = self._recovered[0] if self._recovered else None

    def _build(self, entry: registry.Kernel) -> Callable[[torch.Tensor], torch.Tensor] | None:
        n, w, b, act = self._natives, self.weight, self.bias, self._silu_mul
        name, inter = entry.name, self.inter
        fused = b is None and w.shape[0] == 2 * inter
        if name == "blocks_silu_mul" and n.blocks is not None and (bw := self._blocks()) is not None:
            return lambda x: act(n.blocks(x.contiguous(), bw, b))
        if name == "rows_silu_mul" and n.rows is not None and n.rows.supports(w):
            return lambda x: act(n.rows(x.contiguous(), w, b))
        if name == "linear_amx_swiglu" and fused and n.amx is not None and n.blocks is not None:
            bw = self._blocks()
            if bw is not None and n.amx.supports(bw, swiglu=True):
                return lambda x: n.amx(x.contiguous(), bw, None, swiglu=True)
        if (
            name == "linear_fma_blocks_swiglu"
            and fused
            and n.fma is not None
            and n.fma.supports(w, swiglu=True)
        ):
            bw = self._blocks() if n.blocks is not None else None
            if n.fma.supports_blocks(bw, swiglu=True):
                tiles = n.fma.pack_blocks(bw, swiglu=True)
                return lambda x: n.fma.call_blocks(x.contiguous(), tiles, None)
        if name in ("linear_fma_swiglu", "linear_vnni_swiglu") and fused:
            tiled = n.fma if name == "linear_fma_swiglu" else n.vnni
            if tiled is not None and tiled.supports(w, swiglu=True):
                packed = tiled.pack(w, swiglu=True)
                return lambda x: tiled(x.contiguous(), packed, None, swiglu=True)
        if name == "onednn_swiglu" and fused and w.device.type == "cpu":
            return onednn_gated(w, inter)
        if name == "unfused":
            self.linear = Linear(w, b, block_weight=self.block_weight, natives=n)
            linear = self.linear
            return lambda x: act(linear(x))
        if name == "torch":
            return lambda x: (
                F.silu(F.linear(x, w[:inter], None if b is None else b[:inter]))
                * F.linear(x, w[inter:], None if b is None else b[inter:])
            )
        return None

    def kernel_for(self, rows: int) -> str:
        """The implementation a call of ``rows`` rows runs (``unfused/<linear's>`` through the linear op)."""
        name = super().kernel_for(rows)
        return f"unfused/{self.linear.kernel_for(rows)}" if name == "unfused" and self.linear else name

    def release_weight(self) -> None:
        super().release_weight()
        if self.linear is not None:
            self.linear.release_weight()

    @property
    def covered(self) -> bool:
        if any(k.name == "unfused" for _, k, _ in self.bands):
            others = {k.form for _, k, _ in self.bands if k.name != "unfused"}
            return self.linear is not None and self.linear.covered and "float" not in others
        return super().covered


def uses_onednn(op: Any, rows: int) -> bool:
    """Whether a call of ``rows`` rows of ``op`` (a :class:`Linear` or :class:`GatedUp`) runs on oneDNN."""
    return op.kernel_for(rows).split("/")[-1] in ONEDNN
