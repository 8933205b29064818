"""``python -m devtools.bench.decode_probe N THREADS [STEPS] [--neighbour]``: decode speed of N running requests.

A small probe of the CPU-contention behaviour: it prefills N 128-token prompts, then times ``STEPS`` decode steps
of our engine driven from this thread with a fixed ``THREADS`` intra-op threads (no adaptation), and prints one
JSON line: step time (ms), decode tok/s and the CPU time this process got per wall second. Run it with
``OMP_WAIT_POLICY=PASSIVE`` or ``GOMP_SPINCOUNT=...`` in the environment to compare libgomp's waiting modes, and
with ``--neighbour`` to add a CPU-bound process (``python -c 'while True: pass'``) for the timed steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.decode_probe")
    p.add_argument("n", type=int)
    p.add_argument("threads", type=int)
    p.add_argument("steps", type=int, nargs="?", default=32)
    p.add_argument("--neighbour", action="store_true")
    p.add_argument("--torch", action="store_true", help="torch's SDPA and oneDNN only (no native kernels)")
    p.add_argument("--cache-dir", default="var/models")
    args = p.parse_args(argv)

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
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.neighbour else None
    try:
        for _ in range(2):
            engine.step()
        t, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            engine.step()
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    result = {
        "n": args.n,
        "threads": args.threads,
        "kernels": "torch" if args.torch else "native",
        "neighbour": args.neighbour,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", ""),
        "step_ms": round(wall / args.steps * 1e3, 1),
        "decode_tok_s": round(args.n * args.steps / wall, 1),
        "cpu_per_wall": round(cpu / wall, 2),
    }
    print(json.dumps(result))
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
