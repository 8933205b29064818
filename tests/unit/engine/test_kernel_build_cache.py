"""The native-kernel build cache (inference/engine/kernels/build.py): an object is keyed by this CPU's feature flags
and the compiler's version as well as the sources and flags, so a kernel folder shared by hosts with different CPUs
never hands one host an object built for another (it would die with SIGILL on the first instruction its CPU lacks)."""

import ctypes
import json
import shutil
from pathlib import Path

from inference.engine.kernels import build
from inference.engine.threads import loaded_libgomp_paths
from tests.unit.engine.helpers import needs_gcc

pytestmark = needs_gcc

SOURCE = """
#include <omp.h>
int kernel_probe(void) { return 42; }
"""


def tiny_sources(tmp_path: Path) -> tuple[Path, ...]:
    """One small source of our own (the whole library takes seconds to build; the cache logic is the same)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "probe.c").write_text(SOURCE)
    return (src / "probe.c",)


def gomp() -> Path:
    return Path(loaded_libgomp_paths()[0])


def another_cpu() -> tuple[str, ...]:
    """This CPU's flags without its widest vector extensions: what an older CPU of the same family reports."""
    return tuple(f for f in build.cpu_flags() if not f.startswith(("avx512", "amx"))) + ("other-cpu",)


def test_the_cache_key_holds_this_cpus_flags_and_the_compilers_version(tmp_path):
    built = build.build(tiny_sources(tmp_path), gomp(), tmp_path / "cache")
    key = json.loads(built.with_suffix(".json").read_text())
    assert key["cpu_flags"] == list(build.cpu_flags()) and key["cpu_flags"][0]  # the machine name first
    cc = shutil.which("gcc")
    assert key["cc_version"] == build.compiler_version(cc) and key["cc_version"].startswith("gcc")
    assert ctypes.CDLL(str(built)).kernel_probe() == 42


def test_an_object_keyed_for_another_cpu_is_not_loaded_here(tmp_path):
    sources, cache = tiny_sources(tmp_path), tmp_path / "cache"
    theirs = build.build(sources, gomp(), cache, cpu=another_cpu())  # written by a host with another CPU
    ours = build.build(sources, gomp(), cache)
    assert ours != theirs and theirs.exists()  # a separate object, built here; theirs left for its host
    assert json.loads(ours.with_suffix(".json").read_text())["cpu_flags"] == list(build.cpu_flags())
    assert ctypes.CDLL(str(ours)).kernel_probe() == 42


def test_an_object_under_our_name_whose_manifest_names_another_cpu_is_rebuilt(tmp_path):
    # A file copied or renamed by hand (or written by an older release without the CPU in its key) at the path this
    # host's key gives: its manifest decides, and a mismatch means a rebuild, never a load. (Nothing is loaded here
    # until the end: a loaded object must not be overwritten in place.)
    sources, cache = tiny_sources(tmp_path), tmp_path / "cache"
    ours = build.build(sources, gomp(), cache)
    manifest = ours.with_suffix(".json")
    foreign = json.loads(manifest.read_text()) | {"cpu_flags": list(another_cpu())}
    manifest.write_text(json.dumps(foreign, sort_keys=True))
    ours.write_bytes(b"not an object built for this CPU")  # what returning it unchecked would hand the loader
    assert build.build(sources, gomp(), cache) == ours
    assert ours.read_bytes()[:4] == b"\x7fELF"  # rebuilt
    assert json.loads(manifest.read_text())["cpu_flags"] == list(build.cpu_flags())
    manifest.unlink()  # no manifest at all: rebuilt too
    ours.write_bytes(b"garbage")
    assert build.build(sources, gomp(), cache) == ours and ours.read_bytes()[:4] == b"\x7fELF"
    assert ctypes.CDLL(str(ours)).kernel_probe() == 42


def test_another_compiler_version_is_another_key():
    common = {"content": b"x", "cc": "/usr/bin/gcc", "cpu": build.cpu_flags(), "link": [], "gomp": Path("g")}
    assert build.build_key(cc_version="gcc 12.2.0", **common) != build.build_key(
        cc_version="gcc 13.1.0", **common
    )
