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
import time

logger = logging.getLogger(__name__)

_OMP_PAUSE_SOFT = 1


def loaded_libgomp_paths() -> list[str]:
    """Paths of the libgomp shared objects this process has loaded (torch's OpenMP runtime), sorted; empty
    when none is loaded or this is not Linux (``/proc/self/maps``)."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "libgomp" in line and "/" in line})
    except OSError:
        return []


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _libgomp_of(library: str) -> str | None:
    """Path of the shared object that defines ``omp_get_max_threads`` for ``library`` (already loaded): the
    OpenMP runtime that library's own calls resolve to (``dlsym`` on its handle searches it and its
    dependencies, ``dladdr`` names the object the symbol lives in). ``None`` when that cannot be told."""
    try:
        handle = ctypes.CDLL(library, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        address = ctypes.cast(handle.omp_get_max_threads, ctypes.c_void_p)
        info = _DlInfo()
        if not ctypes.CDLL(None).dladdr(address, ctypes.byref(info)) or not info.dli_fname:
            return None
        return os.path.realpath(info.dli_fname.decode())
    except (OSError, AttributeError, ValueError):
        return None


def torch_libgomp_path() -> str | None:
    """The libgomp torch's own kernels run on, of those this process has loaded (``None``: none is).

    Other wheels bring their own copy (scikit-learn's ``scikit_learn.libs/libgomp-<hash>.so``, loaded when the
    safety guard chain's classifier is imported), and the first path in sorted order may be theirs. The
    native kernels must link the runtime torch uses: with two runtimes in one process each keeps its own
    pool of spinning workers, so the kernels' parallel regions and torch's fight over the 2 cores (measured
    on the Zen 4 box: batch-1 decode at ~24 ms per token instead of ~11, ``docs/overhead.md``). Asks the
    dynamic linker which object serves ``libtorch_cpu``'s OpenMP calls; failing that, prefers a copy inside
    torch's package, then the first loaded."""
    paths = loaded_libgomp_paths()
    if len(paths) <= 1:
        return paths[0] if paths else None
    try:
        import torch

        torch_dir = os.path.dirname(os.path.realpath(torch.__file__))
    except ImportError:
        return paths[0]
    real = {os.path.realpath(p): p for p in paths}
    lib_dir = os.path.join(torch_dir, "lib")
    torch_cpu = (
        sorted(n for n in os.listdir(lib_dir) if n.startswith("libtorch_cpu.so"))
        if os.path.isdir(lib_dir)
        else []
    )
    if torch_cpu:
        resolved = _libgomp_of(os.path.join(lib_dir, torch_cpu[0]))
        if resolved in real:
            return real[resolved]
    inside = [
        p for p in paths if os.path.realpath(p).startswith((torch_dir + os.sep, torch_dir + ".libs" + os.sep))
    ]
    return (inside or paths)[0]


def _libgomp() -> ctypes.CDLL | None:
    path = torch_libgomp_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    return lib if hasattr(lib, "omp_pause_resource_all") else None


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


def _allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


class CpuShareMonitor:
    """How many of this process's CPUs other processes kept busy since the last sample.

    Reads ``/proc/stat`` (busy jiffies of the CPUs in our affinity set) and ``/proc/self/stat`` (our own
    user + system jiffies): ``other_cores = (busy - ours) / (elapsed * HZ)``. Linux only; elsewhere
    :meth:`sample` returns ``None``.
    """

    def __init__(self) -> None:
        self.cpus = _allowed_cpus()
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._read()
        #: Length in seconds of the window the last :meth:`sample` covered (0.0 before the first).
        self.last_window_s = 0.0

    def _read(self) -> tuple[float, int, int] | None:
        try:
            busy = 0
            with open("/proc/stat") as f:
                for line in f:
                    if not (line.startswith("cpu") and line[3].isdigit()):
                        continue
                    name, *vals = line.split()
                    if int(name[3:]) in self.cpus:
                        v = [int(x) for x in vals[:8]]
                        busy += sum(v) - v[3] - v[4]  # all but idle and iowait (guest is in user)
            with open("/proc/self/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ours = int(fields[11]) + int(fields[12])  # utime, stime
            return time.monotonic(), busy, ours
        except (OSError, ValueError, IndexError):
            return None

    def sample(self) -> float | None:
        """Cores used by other processes (on our CPUs) since the previous call; ``None`` if unknown."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None or now[0] - last[0] <= 0:
            self.last_window_s = 0.0
            return None
        self.last_window_s = now[0] - last[0]
        other = ((now[1] - last[1]) - (now[2] - last[2])) / self._hz / (now[0] - last[0])
        return max(0.0, other)


class AdaptiveThreads:
    """Intra-op thread count that follows CPU contention (``EngineConfig.adaptive_threads``, the default).

    Why: torch's CPU kernels run ~200 OpenMP parallel regions per decode step, each ending in a barrier.
    With as many threads as cores and another process busy on one of them, every barrier waits for the
    descheduled thread's next time slice (and libgomp's spin-waiting burns the slice of the thread that
    did run): measured on the 2-core box, batch-1 decode fell from ~45 to 0.3-6 tok/s and N=32 from
    ~360 to 13-70 tok/s, while one thread kept ~15-35 and ~150-330 tok/s. So the engine uses
    ``cpus - round(other_cores)`` threads (at least 1), where ``other_cores`` is what other processes used
    over the last ``interval_s``; it steps down at once and back up after ``calm_windows`` calm windows.

    The window is 0.25 s and one calm window steps back up (docs/overhead-levers.md, lever 43). With 0.5 s
    windows and two calm ones, a web process's burst of admissions (about a core for a few hundred ms) put the
    engine on one thread for the next 1-1.5 s, most of a 32-token reply's decode, which then ran at about 0.6
    of the two-thread speed: page-path waves of 32 replies made 393-442 tok/s against 457-493 now (Intel Xeon
    with AMX, 2 vCPUs, 2026-12-06). Beside a steady neighbour the count is what it was (same thresholds).

    Args:
        max_threads: Upper bound (the CPUs this process may use).
        interval_s: Sampling period in seconds.
        calm_windows: Consecutive windows that must ask for more threads before the count goes back up.
    """

    #: Shortest window (s) :meth:`resume` judges on its own; at 100 jiffies a second, 0.1 s is 10 per CPU.
    MIN_WINDOW_S = 0.1

    def __init__(self, max_threads: int, interval_s: float = 0.25, calm_windows: int = 1) -> None:
        self.max_threads = max(1, max_threads)
        self.interval_s = interval_s
        self.calm_windows = max(1, calm_windows)
        self.current = self.max_threads
        self._monitor = CpuShareMonitor()
        self._calm = 0
        self._idle_other: float | None = None
        self._step_started = float("inf")  # no step yet: poll_within_step() judges nothing
        #: When resume(), poll() or poll_within_step() last judged the contention; poll() waits interval_s from here.
        self._last_judged = time.monotonic()
        self.changes = 0

    def target(self, other_cores: float) -> int:
        """Thread count for ``other_cores`` busy elsewhere (pure function of the sample)."""
        return max(1, min(self.max_threads, self.max_threads - int(other_cores + 0.5)))

    def idle_tick(self) -> None:
        """Call every ``interval_s`` while the engine waits for work: samples the contention of that window, so
        that :meth:`resume` judges what other processes do now, not what they did over the whole idle spell."""
        self._idle_other = self._monitor.sample()

    def resume(self) -> int | None:
        """Call when the engine gets work after waiting idle. Returns the thread count to apply (``None``: keep
        the current one).

        The decision reads only the latest window: the one since the last :meth:`idle_tick`, or, when that is
        shorter than ``MIN_WINDOW_S`` (too few jiffies to tell), the full idle window before it. It applies at
        once in both directions:

        * a neighbour that is busy now is left its core *before* the first step. A step at all threads
          with a CPU-bound neighbour waits at every OpenMP barrier for the descheduled thread: measured on the
          2-core box (AMD EPYC Zen 5, bf16), a 128-token prefill took 2.4-3.3 s at 2 threads against 0.1 s at
          one, and the first 512-token chunk of an N=32 burst ~7 s;
        * a step-down taken before the idle spell is not kept for two more windows once the neighbour has gone,
          and a neighbour's burst that ended earlier in the idle spell is not held against the next request
          (round 5: a 128-token prefill at 1 thread instead of 2, 0.55 s against 0.35 s).
        """
        other = self._monitor.sample()
        window = self._monitor.last_window_s
        if (other is None or window < self.MIN_WINDOW_S) and self._idle_other is not None:
            other = self._idle_other
        self._idle_other = None
        self._last_judged = time.monotonic()
        self._calm = 0
        want = self.max_threads if other is None else self.target(other)
        if want == self.current:
            return None
        self.current = want
        self.changes += 1
        return want

    def poll(self) -> int | None:
        """Call between steps. Returns a new thread count to apply, or ``None`` to keep the current one."""
        now = time.monotonic()
        if now < self._last_judged + self.interval_s:
            return None
        return self._judge(now)

    def step_started(self) -> None:
        """Call as a step begins; :meth:`poll_within_step` measures the step's length from here."""
        self._step_started = time.monotonic()

    def poll_within_step(self) -> int | None:
        """Call between layers of a step. Returns a new thread count to apply now, or ``None``.

        Judges only a step that has already run ``MIN_WINDOW_S``, and then at most once per ``MIN_WINDOW_S``, each
        time on the window since the last sample (between steps :meth:`poll` waits ``interval_s``), with
        :meth:`poll`'s rule: down at once, up after ``calm_windows`` calm windows. A decode step of tens of
        milliseconds never samples here.

        Why: otherwise a step keeps the count it started with to its end. A 32-send burst's prefill starts as the web
        process finishes admitting the sends, on the one thread the burst left the engine, and runs 0.3 s on it
        beside neighbours gone quiet (30 prompts of 40 tokens alone: 255-279 ms at one thread, 167-183 at two); a
        CPU-bound neighbour that wakes during a long step at all threads costs it every barrier until it ends.
        ``python -m devtools.bench.burst_probe``, before/after: 281/234 ms and 853/378 ms for those two cases (Intel
        Xeon Emerald Rapids, bf16, 2 vCPUs, 2026-12-08; docs/overhead-levers.md, lever 63).
        """
        now = time.monotonic()
        if now - self._step_started < self.MIN_WINDOW_S or now < self._last_judged + self.MIN_WINDOW_S:
            return None
        return self._judge(now)

    def _judge(self, now: float) -> int | None:
        self._last_judged = now
        other = self._monitor.sample()
        if other is None:
            return None
        want = self.target(other)
        if want < self.current:
            self._calm = 0
        elif want > self.current:
            self._calm += 1
            if self._calm < self.calm_windows:
                return None
            self._calm = 0
        else:
            self._calm = 0
            return None
        self.current = want
        self.changes += 1
        return want
