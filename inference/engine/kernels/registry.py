"""The kernel registry: for each operation the runner performs, a table of implementations, and the choice among them
for this CPU, dtype and batch shape, made once at load time.

Two sources for the shape of this module:

* vLLM's ``vllm/model_executor/custom_op.py``: each op has a ``forward_native`` (plain torch, the reference the
  others are tested against) and per-platform forwards, and ``dispatch_forward()`` picks one when the op is built,
  not on every call. Here every :class:`Kernel` names its ``reference`` (the op's ``torch`` entry), and the runner
  asks :func:`choose` once per layer (``runner_linear.Linear``, ``runner_linear.GatedUp``) and keeps bound callables.
* llama.cpp's ``ggml/src/ggml-backend-reg.cpp``: a registry of backends, each reporting what the device supports
  (``ggml_backend_dev_supports_op``) and a score by which the best CPU variant is loaded. Here each kernel declares the
  CPU feature flags (``/proc/cpuinfo`` names), dtypes and shapes it needs and a ``priority``; what this CPU lacks is
  said by :func:`unavailable`.

The priorities order the kernels where nothing was measured. Where the implementations of an op were timed against
each other on a CPU kind (:data:`MEASURED`: the default model's shapes, the batch rows that matter), the fastest one
for the batch shape wins instead, and a tie (within :data:`TIE`) goes to the one that holds the weights in fewer bytes.
Memory is a setting, not a hidden trade (``EngineConfig.kernel_memory``, ``INFERENCE_KERNEL_MEMORY``):

* ``"fast"`` (default): the measured choice, even where it holds the float32 weights in panels (on an AVX2 CPU the
  default model's layers as float panels: ~540 MB instead of ~100 MB of GGUF blocks);
* ``"low"``: a kernel that reads the GGUF blocks for every row count wins wherever the weight has blocks, whatever was
  measured.

``docs/engine-kernels.md`` lists the choice per CPU kind and the figures behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..config import KernelMemory
from .build import cpu_flags
from .table import FORMS, KERNELS, MEASURED, Kernel, Measurement

#: Two measured implementations within this fraction of each other are a tie (the run-to-run noise of the 2-vCPU
#: machines they were measured on); the one holding fewer weight bytes wins it.
TIE = 0.05
#: The CPU flags torch's oneDNN wants for a bf16 matmul (``avx_ne_convert`` does instead).
_ONEDNN_BF16 = frozenset({"avx512bw", "avx512vl", "avx512dq"})


def kernels_of(op: str) -> tuple[Kernel, ...]:
    """The op's implementations, highest priority first (the reference last)."""
    found = tuple(sorted((k for k in KERNELS if k.op == op), key=lambda k: -k.priority))
    if not found:
        raise KeyError(f"no kernels registered for op {op!r}")
    return found


def kernel(op: str, name: str) -> Kernel:
    """The registered implementation ``name`` of ``op``.

    Raises:
        KeyError: none of that name.
    """
    for entry in KERNELS:
        if entry.op == op and entry.name == name:
            return entry
    raise KeyError(f"no kernel {name!r} for op {op!r}")


def cpu_kind(flags: Iterable[str] | None = None) -> str:
    """The CPU kind the measured table is keyed by, from feature flags (default: this CPU's, :func:`cpu_flags`):
    ``"x86-avx512-amx"`` (Sapphire Rapids and later), ``"x86-avx512-bf16"`` (Zen 4, Zen 5, Cooper Lake),
    ``"x86-avx512"`` (Skylake-X, Ice Lake), ``"x86-avx2"`` (Haswell to Zen 3), else ``"other"``."""
    have = set(cpu_flags() if flags is None else flags)
    if {"amx_tile", "amx_bf16", "avx512_bf16"} <= have:
        return "x86-avx512-amx"
    if {"avx512f", "avx512_bf16"} <= have:
        return "x86-avx512-bf16"
    if "avx512f" in have:
        return "x86-avx512"
    if {"avx2", "fma"} <= have:
        return "x86-avx2"
    return "other"


def _library_built() -> bool:
    from .build import library  # built (or found in the cache) on first use, once per process

    return library() is not None


def unavailable(
    entry: Kernel, dtype: torch.dtype, *, native: bool = True, flags: Iterable[str] | None = None
) -> str | None:
    """Why ``entry`` cannot run here for a ``dtype`` model (``None``: it can, shapes permitting): the dtype, a CPU
    feature this CPU lacks (``flags``, default this CPU's), the native kernels switched off (``native`` false), oneDNN
    missing from this torch, or the native library not built."""
    if dtype not in entry.dtypes:
        return f"takes {', '.join(str(d).removeprefix('torch.') for d in entry.dtypes)} only"
    have = set(cpu_flags() if flags is None else flags)
    missing = [f for f in entry.features if f not in have]
    if missing:
        return f"needs {' '.join(missing)} (this CPU: {cpu_kind(have)})"
    if any(f in have for f in entry.avoid):
        return f"not used on a CPU with {' '.join(f for f in entry.avoid if f in have)}: {entry.why_avoided}"
    if entry.native and not native:
        return "native kernels switched off"
    if "mkldnn" in entry.source and not torch.backends.mkldnn.is_available():
        return "this torch has no oneDNN"
    if (
        "mkldnn" in entry.source
        and dtype == torch.bfloat16
        and not _ONEDNN_BF16 <= have
        and "avx_ne_convert" not in have
    ):
        # torch's mkldnn_reorder_linear_weight refuses bf16 without them (an AVX2 Zen 3, say)
        return "oneDNN's bf16 matmul needs avx512bw, avx512vl and avx512dq, or avx_ne_convert"
    if entry.library and not _library_built():
        return "the native kernel library could not be built"
    return None


def _measured_order(
    op: str, dtype: torch.dtype, kind: str, lo: int, hi: int | None, measured: tuple[Measurement, ...]
) -> list[str]:
    """The op's implementations measured for (kind, dtype) over a band holding ``lo..hi`` (``None``: unbounded),
    fastest first, ties (within :data:`TIE`) to the fewer weight bytes; ``[]``: nothing measured there."""
    for m in measured:
        first, last = m.rows
        covers = first <= lo and (last is None or (hi is not None and hi <= last))
        if (m.kind, m.dtype, m.op) == (kind, dtype, op) and covers:
            best = min(m.ms.values())

            def rank(name: str, m: Measurement = m, best: float = best) -> tuple[int, int, float]:
                tied = m.ms[name] <= best * (1 + TIE)
                return (0 if tied else 1, FORMS.index(kernel(op, name).form) if tied else 0, m.ms[name])

            return sorted(m.ms, key=rank)
    return []


def order(
    op: str,
    dtype: torch.dtype,
    lo: int,
    hi: int | None,
    *,
    memory: KernelMemory = "fast",
    kind: str | None = None,
    measured: tuple[Measurement, ...] = MEASURED,
) -> list[Kernel]:
    """The op's implementations that may serve every row count from ``lo`` to ``hi`` (``None``: unbounded) in
    ``dtype``, best first: the ones measured over that band on the CPU kind (``kind``, default this CPU's) by speed,
    then the rest by priority (``measured``: the table, :data:`MEASURED`). With ``memory="low"`` the ones that read
    GGUF blocks for any row count go before the other any-row ones. Availability is not checked here (:func:`unavailable`)."""
    fits = [
        k
        for k in kernels_of(op)
        if dtype in k.dtypes
        and (k.rows_limit(dtype) is None or (hi is not None and k.rows_limit(dtype) >= hi))
    ]
    fastest = _measured_order(op, dtype, kind or cpu_kind(), lo, hi, measured)
    ranked = sorted(
        fits, key=lambda k: (fastest.index(k.name) if k.name in fastest else len(fastest), -k.priority)
    )
    if memory == "low":
        unbounded = [i for i, k in enumerate(ranked) if k.rows_limit(dtype) is None]
        reordered = sorted((ranked[i] for i in unbounded), key=lambda k: k.form != "blocks")
        for i, k in zip(unbounded, reordered, strict=True):
            ranked[i] = k
    return ranked


def boundaries(op: str, dtype: torch.dtype, kind: str | None = None) -> list[int]:
    """The row counts where the op's choice may change, ascending: its kernels' ``max_rows`` for ``dtype`` and the
    edges of the bands measured on the CPU kind (``kind``, default this CPU's)."""
    edges = {limit for k in kernels_of(op) if (limit := k.rows_limit(dtype)) is not None}
    for m in MEASURED:
        if (m.kind, m.dtype, m.op) == (kind or cpu_kind(), dtype, op):
            edges.update(e for e in (m.rows[0] - 1, m.rows[1]) if e)
    return sorted(edges)


Built = Callable[..., Any]
#: One band of a choice: up to how many rows (``None``: any number), the kernel, and the callable bound to the layer.
Band = tuple[int | None, Kernel, Built]


def choose(
    op: str,
    dtype: torch.dtype,
    build: Callable[[Kernel], Built | None],
    *,
    native: bool = True,
    memory: KernelMemory = "fast",
    kind: str | None = None,
) -> list[Band]:
    """Choose the op's implementation for every row count, once: returns bands ``(up to rows, kernel, callable)`` in
    ascending order, the last one for any number of rows (``None``). ``build(kernel)`` binds one implementation to
    the layer's weights (packing them as it needs) or returns ``None`` when they do not fit it; it is called only for
    kernels that can run here (:func:`unavailable`), at most once each, and only until one is found for a band, so
    nothing is packed that no band uses.

    Raises:
        LookupError: no implementation took a band (the op's ``torch`` entry always should).
    """
    built: dict[str, Built | None] = {}
    bands: list[Band] = []
    lo = 1
    for upto in [*boundaries(op, dtype, kind), None]:
        for entry in order(op, dtype, lo, upto, memory=memory, kind=kind):
            if unavailable(entry, dtype, native=native) is not None:
                continue
            if entry.name not in built:
                built[entry.name] = build(entry)
            fn = built[entry.name]
            if fn is not None:
                if bands and bands[-1][1] is entry:  # the same kernel as the band below: one band
                    bands[-1] = (upto, entry, fn)
                else:
                    bands.append((upto, entry, fn))
                break
        else:
            raise LookupError(f"no implementation of {op} takes {dtype} from {lo} to {upto} rows")
        lo = (upto or 0) + 1
    return bands
