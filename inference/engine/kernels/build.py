"""Building, caching and loading the native kernel library (one shared object for all ``*.c`` files here).

The sources are compiled with the system C compiler on first use (``-march=native``: the instructions of the CPU
that builds them) and loaded with ctypes. Nothing needs Python or torch headers, so a build takes a few seconds (the
sources compile side by side). The shared object is cached under ``INFERENCE_KERNEL_DIR`` (default
``~/.cache/chatsite/kernels``), named by a hash of everything that decides its machine code (:func:`build_key`):

* the sources and headers, the flags and the link line;
* the compiler's path **and version** (another GCC may vectorise differently, or not know a flag);
* **this CPU's feature flags** (``/proc/cpuinfo``), because ``-march=native`` compiles for exactly them: a kernel
  folder shared by hosts with different CPUs (a network volume, a baked image) must never hand one host an object
  built for another, which would die with SIGILL on the first AVX-512 or AMX instruction;
* the OpenMP runtime it links (the libgomp torch already loaded, so the kernels' parallel regions run on torch's
  own threads and ``torch.set_num_threads`` applies).

Each object has a JSON manifest beside it recording the CPU flags and compiler version it was built for; an object
whose manifest is missing or names another CPU or compiler is rebuilt in place, never loaded (so a file copied or
renamed by hand is caught too). Objects and manifests are written atomically: concurrent builds by several
processes are safe (their copies are identical). The same idea as llama.cpp's CPU backend variants, each built for
a feature level and chosen by what the host reports (``ggml/src/ggml-backend-reg.cpp``).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

from ..threads import torch_libgomp_path

logger = logging.getLogger(__name__)

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "decode_attention.c",
        "linear_rows.c",
        "linear_blocks.c",
        "linear_amx.c",
        "linear_vnni.c",
        "linear_fma.c",
        "linear_fma_pack.c",
        "elementwise.c",
        "sampling.c",
        "rope_cache.c",
        "prefill_attention.c",
        "prefill_attention_bf16.c",
    )
)
# -ffast-math at compile time only (vectorised expf from glibc's libmvec, reassociated sums); the link step
# does not get it, so no crtfastmath constructor changes the process's denormal handling.
# -mprefer-vector-width=512: GCC's tuning for most Intel AVX-512 CPUs (and for any CPU it does not know, which
# -march=native then tunes as the nearest older model) auto-vectorises with 256-bit registers even where 512-bit
# ones exist; on a 2-vCPU Xeon with AMX (tuned as rocketlake) that made silu_mul 0.49 ms instead of 0.28 for
# 512x1536 bf16. Without AVX-512 the flag changes nothing.
CFLAGS = [
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


@cache
def cpu_flags() -> tuple[str, ...]:
    """This CPU's feature flags, sorted: the ``flags`` (x86) or ``Features`` (Arm) line of ``/proc/cpuinfo``, with the
    machine name first (``x86_64``, ``aarch64``). Only the machine name where the file cannot be read."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                flags = set(value.split())
                break
    except OSError:
        pass
    return (platform.machine(), *sorted(flags))


def compiler_version(cc: str) -> str:
    """``cc --version``'s first line (e.g. ``gcc (Debian 12.2.0-14+deb12u1) 12.2.0``) and its target triple.

    Raises:
        RuntimeError: the compiler does not run.
    """
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
        machine = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"{cc} does not run: {exc}") from exc
    if version.returncode != 0:
        raise RuntimeError(f"{cc} --version failed: {version.stderr.strip()[-500:]}")
    first = version.stdout.strip().splitlines()[0] if version.stdout.strip() else ""
    return f"{first} [{machine.stdout.strip()}]"


def build_key(
    *, content: bytes, cc: str, cc_version: str, cpu: tuple[str, ...], link: list[str], gomp: Path
) -> dict[str, object]:
    """What decides the built object's machine code, as the manifest records it (``content``: the sources' and
    headers' bytes, hashed)."""
    return {
        "sources_sha256": hashlib.sha256(content).hexdigest(),
        "cc": cc,
        "cc_version": cc_version,
        "cflags": CFLAGS,
        "link": link,
        "gomp": str(gomp),
        "cpu_flags": list(cpu),
    }


def _run_compiler(cmd: list[str]) -> None:
    """Run one compiler command.

    Raises:
        RuntimeError: it failed (its output in the message).
    """
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")


def _manifest_matches(manifest: Path, key: dict[str, object]) -> bool:
    try:
        return json.loads(manifest.read_text()) == key
    except (OSError, ValueError):
        return False


def build(
    sources: tuple[Path, ...], gomp: Path, out_dir: Path, *, cpu: tuple[str, ...] | None = None
) -> Path:
    """Compile ``sources`` into one shared object in ``out_dir`` for the CPU with flags ``cpu`` (default: this one,
    :func:`cpu_flags`), or return the cached one built for exactly that key; returns its path.

    An object at the key's path whose manifest does not match the key (missing, another CPU's flags, another
    compiler version) is rebuilt over, never returned.

    Raises:
        RuntimeError: no C compiler, or the build failed (the compiler's output in the message).
    """
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    link = ["-shared", f"-L{gomp.parent}", f"-l:{gomp.name}", "-lmvec", "-lm", f"-Wl,-rpath,{gomp.parent}"]
    headers = sorted(sources[0].parent.glob("*.h"))
    content = b"".join(path.read_bytes() for path in (*sources, *headers))
    key = build_key(
        content=content, cc=cc, cc_version=compiler_version(cc), cpu=cpu or cpu_flags(), link=link, gomp=gomp
    )
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    target = out_dir / f"engine-kernels-{digest}.so"
    manifest = target.with_suffix(".json")
    if target.exists() and _manifest_matches(manifest, key):
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        objects = [Path(tmp) / f"{source.stem}.o" for source in sources]
        lib = Path(tmp) / "k.so"
        compiles = [
            [cc, *CFLAGS, "-c", str(src), "-o", str(obj)] for src, obj in zip(sources, objects, strict=True)
        ]
        # The sources compile side by side (one process each; ~5 -> ~3 s on 2 cores), then link.
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(_run_compiler, compiles))  # re-raises the first failure
        _run_compiler([cc, *map(str, objects), "-o", str(lib), *link])
        written = Path(tmp) / "k.json"
        written.write_text(json.dumps(key, sort_keys=True))
        os.replace(lib, target)  # atomic: a concurrent builder's copy is identical
        os.replace(written, manifest)  # after the object: a manifest never vouches for an older object
    return target


@cache
def library() -> ctypes.CDLL | None:
    """The kernel library built for this CPU and loaded (once per process); ``None`` with a warning when it cannot be
    had (not Linux, no libgomp in the process, no compiler, a failed build)."""
    if not sys.platform.startswith("linux"):
        return None
    path = torch_libgomp_path()  # torch's runtime, not another wheel's copy (threads.py)
    gomp = Path(path) if path else None
    if gomp is None:
        logger.warning("native kernels off: this process has no libgomp loaded (torch uses another runtime)")
        return None
    try:
        return ctypes.CDLL(str(build(SOURCES, gomp, kernel_dir())))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        logger.warning("native kernels off, using torch's SDPA and oneDNN: %s", exc)
        return None
