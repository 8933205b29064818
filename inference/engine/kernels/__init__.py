"""Native CPU kernels of the engine, compiled on first use with the system C compiler and loaded with ctypes.

* :func:`decode_attention` (``decode_attention.c``): attention of one query token per decoding sequence over the
  slot KV cache; :func:`prefill_attention` (``prefill_attention.c``, its bf16 paths in ``prefill_attention_bf16.c``):
  causal attention of a step's prefill chunks, tiled; :func:`rope_cache` (``rope_cache.c``): RoPE of the queries and
  keys with the keys and values written into the cache (:mod:`.attention`).
* :func:`linear_rows` (``linear_rows.c``: ``x @ W.T`` for a few rows at memory bandwidth), :func:`linear_blocks`
  (``linear_blocks.c``: the same with the weight in GGUF Q4_1/Q8_0 block form, :mod:`inference.engine.block_quant`),
  :func:`linear_amx` (``linear_amx.c``: bf16 from GGUF blocks on AMX tiles) (:mod:`.linear`); :func:`linear_vnni`
  (``linear_vnni.c``: bf16 for any rows on AVX512-BF16) and :func:`linear_fma` (``linear_fma.c``, packed by
  ``linear_fma_pack.c``: its float32 twin for AVX2/FMA, also from GGUF blocks), both optionally with LlamaMLP's
  SiLU-and-multiply as their epilogue (:mod:`.linear_tiled`).
* :func:`elementwise` (``elementwise.c``): a layer's RMSNorm (with the residual add) and SiLU-and-multiply in one call
  each, and the greedy argmax (:mod:`.elementwise`); :func:`top_p_sampler` (``sampling.c``): temperature, top-k and
  top-p sampling of one token per logits row (:mod:`.top_p`).

How the library is built and cached (keyed by this CPU's feature flags and the compiler version) is in
:mod:`.build`; which of these kernels (or torch's own ops) each operation of the runner uses, on which CPU, dtype
and batch shape, is in :mod:`.registry`. When the library cannot be had (no compiler, not Linux, no libgomp in the
process, a failed build) each factory returns ``None`` (warned once) and the engine keeps torch's SDPA and oneDNN;
the output is the same up to float rounding either way.
"""

from __future__ import annotations

from typing import Any

from . import build
from .attention import DecodeAttention, PrefillAttention, RopeCache
from .elementwise import Elementwise
from .linear import LinearAmx, LinearBlocks, LinearRows
from .linear_tiled import LinearFma, LinearVnni, TiledBlocks
from .top_p import TopPSampler

__all__ = [
    "DecodeAttention",
    "Elementwise",
    "LinearAmx",
    "LinearBlocks",
    "LinearFma",
    "LinearRows",
    "LinearVnni",
    "PrefillAttention",
    "RopeCache",
    "TiledBlocks",
    "TopPSampler",
]


def _bind(kind: Any) -> Any:
    """``kind(lib)`` over the built library, or ``None`` when it cannot be had."""
    lib = build.library()
    return kind(lib) if lib is not None else None


def _bind_available(kind: Any) -> Any:
    """:func:`_bind` for a kernel built only for some CPUs: ``None`` also when this build refuses every call
    (``kind.available`` false)."""
    kernel = _bind(kind)
    return kernel if kernel is not None and kernel.available else None


def decode_attention() -> DecodeAttention | None:
    """The native decode-attention kernel, built on first use; ``None`` (warned once) when it cannot be had."""
    return _bind(DecodeAttention)


def prefill_attention() -> PrefillAttention | None:
    """The native prefill-attention kernel, built on first use; ``None`` (warned once) when it cannot be had."""
    return _bind(PrefillAttention)


def rope_cache() -> RopeCache | None:
    """The native RoPE + KV-cache-write kernel, built on first use; ``None`` (warned once) when it cannot be had."""
    return _bind(RopeCache)


def elementwise() -> Elementwise | None:
    """The native RMSNorm / SiLU-and-multiply / argmax kernels, built on first use; ``None`` (warned once) when they
    cannot be had."""
    return _bind(Elementwise)


def top_p_sampler() -> TopPSampler | None:
    """The native top-k / top-p sampling kernel, built on first use; ``None`` (warned once) when it cannot be had."""
    return _bind(TopPSampler)


def linear_rows() -> LinearRows | None:
    """The native few-rows linear kernel, built on first use; ``None`` (warned once) when it cannot be had."""
    return _bind(LinearRows)


def linear_blocks() -> LinearBlocks | None:
    """The native block-quantized linear kernel, built on first use; ``None`` (warned once) when it cannot be had."""
    return _bind(LinearBlocks)


def linear_amx() -> LinearAmx | None:
    """The native block-quantized bf16 linear kernel on AMX tiles, built on first use; ``None`` when it cannot be had
    (warned once), or this CPU or OS gives no AMX."""
    return _bind_available(LinearAmx)


def linear_vnni() -> LinearVnni | None:
    """The native VNNI-packed bf16 linear kernel, built on first use; ``None`` when it cannot be had (warned once) or
    this CPU has no AVX512-BF16."""
    return _bind_available(LinearVnni)


def linear_fma() -> LinearFma | None:
    """The native panel-packed float32 linear kernel, built on first use; ``None`` when it cannot be had (warned once)
    or this CPU has no AVX2 and FMA."""
    return _bind_available(LinearFma)
