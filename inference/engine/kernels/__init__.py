"""Native CPU kernels of the engine, compiled on first use with the system C compiler and loaded with ctypes.

:func:`decode_attention` (``decode_attention.c``: attention of one query token per decoding sequence over the
slot KV cache) and :func:`linear_rows` (``linear_rows.c``: ``x @ W.T`` for a few rows, streaming the weights at memory
bandwidth; the engine uses it for one-sequence decode steps), :func:`linear_blocks` (``linear_blocks.c``: the
same for the rows of a decode step with the weight in GGUF Q4_1/Q8_0 block form, see :mod:`inference.engine.block_quant`),
:func:`linear_vnni` (``linear_vnni.c``: bf16 ``x @ W.T`` for any number of rows on AVX512-BF16 CPUs, the weight packed
for vdpbf16ps, optionally with LlamaMLP's SiLU-and-multiply as its epilogue), :func:`linear_fma` (``linear_fma.c``:
its float32 twin for AVX2/FMA CPUs)
and :func:`elementwise` (``elementwise.c``: a layer's RMSNorm and SiLU-and-multiply in one call each, and the greedy
argmax) and
:func:`rope_cache` (``rope_cache.c``: RoPE of the queries and keys with the keys and values written into the cache)
and :func:`prefill_attention` (``prefill_attention.c``: causal attention of a step's prefill chunks, tiled). Nothing here needs Python or torch headers, so a build takes a couple of seconds (the sources compile side by side);
the shared object is cached under ``INFERENCE_KERNEL_DIR`` (default ``~/.cache/chatsite/kernels``), named by
a hash of the source, the flags and the OpenMP runtime it links, and written atomically (concurrent builds by
several processes are safe). The object links the libgomp torch already loaded, so the kernel's parallel
region runs on torch's own OpenMP threads (``torch.set_num_threads`` applies) instead of a second pool.

When a kernel cannot be had (no compiler, not Linux, no libgomp in the process, a failed build) the loader
returns ``None`` once with a warning and the engine keeps torch's SDPA; the output is the same up to float
rounding either way.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import torch

from ..threads import loaded_libgomp_paths
from .linear import LinearAmx, LinearBlocks, LinearFma, LinearRows, LinearVnni, TiledBlocks

__all__ = [
    "DecodeAttention",
    "Elementwise",
    "LinearBlocks",
    "LinearFma",
    "LinearRows",
    "LinearAmx",
    "LinearVnni",
    "PrefillAttention",
    "RopeCache",
    "TiledBlocks",
]

logger = logging.getLogger(__name__)

_SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "decode_attention.c",
        "linear_rows.c",
        "linear_blocks.c",
        "linear_amx.c",
        "linear_vnni.c",
        "linear_fma.c",
        "elementwise.c",
        "rope_cache.c",
        "prefill_attention.c",
    )
)
# -ffast-math at compile time only (vectorised expf from glibc's libmvec, reassociated sums); the link step
# does not get it, so no crtfastmath constructor changes the process's denormal handling.
# -mprefer-vector-width=512: GCC's tuning for most Intel AVX-512 CPUs (and for any CPU it does not know, which
# -march=native then tunes as the nearest older model) auto-vectorises with 256-bit registers even where 512-bit
# ones exist; on a 2-vCPU Xeon with AMX (tuned as rocketlake) that made silu_mul 0.49 ms instead of 0.28 for
# 512x1536 bf16. Without AVX-512 the flag changes nothing.
_CFLAGS = [
    "-O3",
    "-march=native",
    "-mprefer-vector-width=512",
    "-fopenmp",
    "-ffast-math",
    "-fPIC",
    "-std=gnu11",
]


def kernel_dir() -> Path:
    """Where built kernels are cached: ``$INFERENCE_KERNEL_DIR`` or ``~/.cache/chatsite/kernels``."""
    configured = os.environ.get("INFERENCE_KERNEL_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "chatsite" / "kernels"


def _run_compiler(cmd: list[str]) -> None:
    """Run one compiler command.

    Raises:
        RuntimeError: it failed (its output in the message).
    """
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")


def _build(sources: tuple[Path, ...], gomp: Path, out_dir: Path) -> Path:
    """Compile ``sources`` into one shared object in ``out_dir`` (cached by content); returns its path.

    Raises:
        RuntimeError: no C compiler, or the build failed (the compiler's output in the message).
    """
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    link = ["-shared", f"-L{gomp.parent}", f"-l:{gomp.name}", "-lmvec", "-lm", f"-Wl,-rpath,{gomp.parent}"]
    headers = sorted(sources[0].parent.glob("*.h"))
    content = b"".join(path.read_bytes() for path in (*sources, *headers))
    digest = hashlib.sha256(content + repr((cc, _CFLAGS, link, str(gomp))).encode()).hexdigest()[:16]
    target = out_dir / f"engine-kernels-{digest}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        objects = [Path(tmp) / f"{source.stem}.o" for source in sources]
        lib = Path(tmp) / "k.so"
        compiles = [
            [cc, *_CFLAGS, "-c", str(src), "-o", str(obj)] for src, obj in zip(sources, objects, strict=True)
        ]
        # The sources compile side by side (one process each; ~5 -> ~3 s on 2 cores), then link.
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(_run_compiler, compiles))  # re-raises the first failure
        _run_compiler([cc, *map(str, objects), "-o", str(lib), *link])
        os.replace(lib, target)  # atomic: a concurrent builder's copy is identical
    return target


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


class PrefillAttention(_AttentionKernel):
    """``prefill_attention.c`` bound with ctypes: causal attention of a step's prefill chunks over the slot KV cache
    (tiled with an online softmax, FlashAttention-2; blocks of keys after a query block are skipped).

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


@cache
def _library() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    paths = loaded_libgomp_paths()
    gomp = Path(paths[0]) if paths else None
    if gomp is None:
        logger.warning("native kernels off: this process has no libgomp loaded (torch uses another runtime)")
        return None
    try:
        return ctypes.CDLL(str(_build(_SOURCES, gomp, kernel_dir())))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        logger.warning("native kernels off, using torch's SDPA and oneDNN: %s", exc)
        return None


def _bind(kind):
    """``kind(lib)`` over the built library, or ``None`` when it cannot be had."""
    lib = _library()
    return kind(lib) if lib is not None else None


def _bind_available(kind):
    """:func:`_bind` for a kernel built only for some CPUs: ``None`` also when this build refuses every call
    (``kind.available`` false)."""
    kernel = _bind(kind)
    return kernel if kernel is not None and kernel.available else None


def decode_attention() -> DecodeAttention | None:
    """The native decode-attention kernel, built on first use; ``None`` (warned once) when it cannot be had."""
    return _bind(DecodeAttention)


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


def elementwise() -> Elementwise | None:
    """The native RMSNorm / SiLU-and-multiply kernels, built on first use; ``None`` (warned once) when they cannot be
    had."""
    return _bind(Elementwise)


def linear_rows() -> LinearRows | None:
    """The native few-rows linear kernel, built on first use; ``None`` (warned once) when it cannot be had."""
    return _bind(LinearRows)


def rope_cache() -> RopeCache | None:
    """The native RoPE + KV-cache-write kernel, built on first use; ``None`` (warned once) when it cannot be had."""
    return _bind(RopeCache)


def prefill_attention() -> PrefillAttention | None:
    """The native prefill-attention kernel, built on first use; ``None`` (warned once) when it cannot be had."""
    return _bind(PrefillAttention)
