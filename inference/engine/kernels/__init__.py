"""Native CPU kernels of the engine, compiled on first use with the system C compiler and loaded with ctypes.

Only :func:`decode_attention` so far (``decode_attention.c``: attention of one query token per decoding
sequence over the slot KV cache). Nothing here needs Python or torch headers, so a build takes about a second;
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
from functools import cache
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("decode_attention.c")
# -ffast-math at compile time only (vectorised expf from glibc's libmvec, reassociated sums); the link step
# does not get it, so no crtfastmath constructor changes the process's denormal handling.
_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fPIC", "-std=gnu11"]


def _loaded_libgomp() -> Path | None:
    """Path of the libgomp this process has loaded (torch's), or ``None``."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libgomp" in line and "/" in line})
    except OSError:
        return None
    return Path(paths[0]) if paths else None


def kernel_dir() -> Path:
    """Where built kernels are cached: ``$INFERENCE_KERNEL_DIR`` or ``~/.cache/chatsite/kernels``."""
    configured = os.environ.get("INFERENCE_KERNEL_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "chatsite" / "kernels"


def _build(source: Path, gomp: Path, out_dir: Path) -> Path:
    """Compile ``source`` into a shared object in ``out_dir`` (cached by content); returns its path.

    Raises:
        RuntimeError: no C compiler, or the build failed (the compiler's output in the message).
    """
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    link = ["-shared", f"-L{gomp.parent}", f"-l:{gomp.name}", "-lmvec", "-lm", f"-Wl,-rpath,{gomp.parent}"]
    digest = hashlib.sha256(source.read_bytes() + repr((cc, _CFLAGS, link, str(gomp))).encode()).hexdigest()[
        :16
    ]
    target = out_dir / f"{source.stem}-{digest}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        obj, lib = Path(tmp) / "k.o", Path(tmp) / "k.so"
        for cmd in ([cc, *_CFLAGS, "-c", str(source), "-o", str(obj)], [cc, str(obj), "-o", str(lib), *link]):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
        os.replace(lib, target)  # atomic: a concurrent builder's copy is identical
    return target


class DecodeAttention:
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
            fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 5 + [ctypes.c_float]

    def supports(self, dtype: torch.dtype, *, head_dim: int, n_rep: int) -> bool:
        """Whether the kernel takes a model with this dtype, head dimension and query heads per KV head."""
        return dtype in self._fns and head_dim % 16 == 0 and 0 < head_dim <= 256 and 1 <= n_rep <= 8

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
        if nd and (int(slots.min()) < 0 or int(slots.max()) >= k_cache.shape[0]):
            raise ValueError("decode_attention: slot out of range")
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
            k_cache.shape[2],
            scale,
        )
        if code:
            raise ValueError(f"decode_attention: kernel refused the call (code {code})")
        return out


@cache
def decode_attention() -> DecodeAttention | None:
    """The native decode-attention kernel, built on first use; ``None`` (warned once) when it cannot be had."""
    if not sys.platform.startswith("linux"):
        return None
    gomp = _loaded_libgomp()
    if gomp is None:
        logger.warning(
            "native decode attention off: this process has no libgomp loaded (torch uses another runtime)"
        )
        return None
    try:
        return DecodeAttention(ctypes.CDLL(str(_build(_SOURCE, gomp, kernel_dir()))))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        logger.warning("native decode attention off, using torch SDPA: %s", exc)
        return None
