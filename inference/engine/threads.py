"""CPU threading hygiene for running torch in the engine's background thread.

Two OpenMP (libgomp, as bundled with PyTorch wheels) behaviours bite when the forward pass runs in
a thread other than the one that loaded the model:

* ``torch.set_num_threads`` sets the OpenMP thread count of the *calling* thread only; a new thread
  starts with the default (all cores), so the loop thread must set it again.
* Every thread that ever ran a parallel region keeps its own pool of OpenMP workers. When the
  pools together hold more threads than there are CPUs, libgomp throttles its spin-waiting and
  parks workers on a futex after ~100 spins, so each of the ~200 parallel regions of a decode
  step pays a wake-up. On a 2-core box that made the threaded engine 15-20% slower than calling
  ``step()`` from the main thread. Releasing the idle pool of the thread that loaded the model
  (``omp_pause_resource_all``, OpenMP 5.0) before the loop thread starts removes the penalty.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

logger = logging.getLogger(__name__)

_OMP_PAUSE_SOFT = 1


def _libgomp() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line and "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(lib, "omp_pause_resource_all"):
            return lib
    return None


def release_calling_thread_openmp_pool() -> bool:
    """Free the OpenMP worker pool of the calling thread (recreated on its next parallel region).

    Returns ``True`` if libgomp was found and accepted the request. Never raises.
    """
    try:
        lib = _libgomp()
        if lib is None:
            return False
        lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
        lib.omp_pause_resource_all.restype = ctypes.c_int
        return lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0
    except Exception:  # best effort only: a performance tweak must never break the engine
        logger.debug("omp_pause_resource_all failed", exc_info=True)
        return False


def default_num_threads() -> int:
    """Intra-op threads for the engine when ``EngineConfig.num_threads`` is ``None``: the number of CPUs
    this process may run on (``os.sched_getaffinity``, which honours ``taskset``/cgroup cpusets), not
    torch's default (physical cores of the whole machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
