"""``python -m devtools.bench.decode_probe N THREADS [STEPS] [--neighbour | --duty D --duty-in thread|process]``:
decode speed of N running requests.

A small probe of the CPU-contention behaviour: it prefills N 128-token prompts, then times ``STEPS`` decode steps
of our engine driven from this thread with a fixed ``THREADS`` intra-op threads (no adaptation), and prints one
JSON line: step time (ms), decode tok/s and the CPU time this process got per wall second. Run it with
``OMP_WAIT_POLICY=PASSIVE`` or ``GOMP_SPINCOUNT=...`` in the environment to compare libgomp's waiting modes, and
with ``--neighbour`` to add a CPU-bound process (``python -c 'while True: pass'``) for the timed steps.

``--duty D --duty-in thread|process`` adds instead a neighbour that runs pure-Python bursts of ``--burst-ms`` (0.5)
for a share ``D`` of the wall time and sleeps in between: in a thread of this process it holds the GIL through each
burst, as the GPU worker's Celery consumer and reply threads do beside its engine loop; in a process of its own it
takes the same CPU without touching the GIL. The two, side by side, tell how much of a neighbour's cost is the shared
GIL and how much the shared CPU (docs/overhead-levers.md, round 39). ``--neighbour-cpu C`` holds that process to CPU
``C``; with ``OMP_PLACES="{0},{1}" OMP_PROC_BIND=close`` in the environment the engine's thread runs on CPU 0 and
its OpenMP worker on CPU 1, so a neighbour can be put beside either (round 43).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time


def _duty_loop(duty: float, burst_s: float, stop=None) -> None:
    """Pure-Python busy bursts of ``burst_s`` seconds for a share ``duty`` of the wall time, sleeping in between,
    until ``stop()`` is true (never, when None: a spawned process is terminated)."""
    period = burst_s / duty
    while stop is None or not stop():
        end = time.perf_counter() + burst_s
        while time.perf_counter() < end:
            pass
        time.sleep(max(0.0, period - burst_s))


def _pinned_duty_loop(cpu: int, duty: float, burst_s: float) -> None:
    """:func:`_duty_loop` in a process held to one CPU (``os.sched_setaffinity``)."""
    os.sched_setaffinity(0, {cpu})
    _duty_loop(duty, burst_s)


def _start_neighbour(args):
    """The neighbour for the timed steps: ``(stop, kind)``; ``stop()`` ends it. ``kind`` names it in the output."""
    if args.neighbour:
        proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return (lambda: (proc.kill(), proc.wait())), "busy process"
    if args.duty:
        burst_s = args.burst_ms / 1000
        if args.duty_in == "process":
            spawn = multiprocessing.get_context("spawn")
            if args.neighbour_cpu is None:
                proc = spawn.Process(target=_duty_loop, args=(args.duty, burst_s))
            else:
                proc = spawn.Process(target=_pinned_duty_loop, args=(args.neighbour_cpu, args.duty, burst_s))
            proc.start()
            where = "" if args.neighbour_cpu is None else f" on CPU {args.neighbour_cpu}"
            return (lambda: (proc.terminate(), proc.join())), f"process at duty {args.duty}{where}"
        done = threading.Event()
        thread = threading.Thread(target=_duty_loop, args=(args.duty, burst_s, done.is_set), daemon=True)
        thread.start()
        return (lambda: (done.set(), thread.join())), f"thread at duty {args.duty}"
    return (lambda: None), ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.decode_probe")
    p.add_argument("n", type=int)
    p.add_argument("threads", type=int)
    p.add_argument("steps", type=int, nargs="?", default=32)
    p.add_argument("--neighbour", action="store_true")
    p.add_argument(
        "--duty", type=float, default=0.0, help="share of wall time the duty neighbour is busy (0-1)"
    )
    p.add_argument("--duty-in", choices=["thread", "process"], default="thread")
    p.add_argument("--neighbour-cpu", type=int, default=None, help="hold the duty process to this CPU")
    p.add_argument(
        "--burst-ms", type=float, default=0.5, help="length of each of the duty neighbour's bursts"
    )
    p.add_argument("--torch", action="store_true", help="torch's SDPA and oneDNN only (no native kernels)")
    p.add_argument("--cache-dir", default="var/models")
    args = p.parse_args(argv)
    if not 0 <= args.duty < 1 or args.burst_ms <= 0:
        p.error("--duty must be in [0, 1) and --burst-ms above 0")
    if args.neighbour and args.duty:
        p.error("one neighbour at a time: --neighbour or --duty, not both")
    if args.neighbour_cpu is not None and not (args.duty and args.duty_in == "process"):
        p.error("--neighbour-cpu holds a duty process: give --duty D --duty-in process with it")
    if args.neighbour_cpu is not None and args.neighbour_cpu not in os.sched_getaffinity(0):
        p.error(f"--neighbour-cpu {args.neighbour_cpu}: not a CPU this process may run on")

    from inference.engine import EngineConfig, LLMEngine, SamplingParams, load_model
    from inference.engine.config import DEFAULT_MODEL_SPEC

    loaded = load_model(DEFAULT_MODEL_SPEC, args.cache_dir, device="cpu", num_threads=args.threads)
    config = EngineConfig(
        max_num_seqs=max(32, args.n),
        device="cpu",
        num_threads=args.threads,
        prefix_cache_tokens=0,
        native_kernels=not args.torch,
    )
    engine = LLMEngine(loaded, config, owns_model=True)  # as the worker does (LLMEngine.from_spec)
    prompt = list(range(1000, 1128))
    engine.submit(prompt, SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True))
    engine.run_until_idle()  # warm-up
    params = SamplingParams(temperature=0, max_new_tokens=args.steps + 8, ignore_eos=True)
    for _ in range(args.n):
        engine.submit(prompt, params)
    while engine.load().pending_prefill_tokens:
        engine.step()
    stop, neighbour = _start_neighbour(args)
    try:
        for _ in range(2):
            engine.step()
        t, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            engine.step()
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    finally:
        stop()
    result = {
        "n": args.n,
        "threads": args.threads,
        "kernels": "torch" if args.torch else "native",
        "neighbour": neighbour,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", ""),
        "omp_places": os.environ.get("OMP_PLACES", ""),
        "step_ms": round(wall / args.steps * 1e3, 1),
        "decode_tok_s": round(args.n * args.steps / wall, 1),
        "cpu_per_wall": round(cpu / wall, 2),
    }
    print(json.dumps(result))
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
