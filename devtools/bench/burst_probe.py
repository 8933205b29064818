"""``python -m devtools.bench.burst_probe [--checkouts A,B] [--neighbour before|during] [--rounds 3] [--bursts 6]
[--prompts 30] [--length 40]``: how long a burst's prefill takes when a neighbour process changes what the engine's
CPUs are free for around it, with the engine's adaptive thread count (``AdaptiveThreads``) as a GPU worker runs it.

The default model (from ``$MODEL_CACHE_DIR``, else ``var/models``, as ``manage.py prepare_model`` leaves it) in its
native dtype (bfloat16 on a CPU with AVX-512 BF16) on the CPUs this process may use, started as the worker starts it
(the loop thread, adaptive threads, no prefix cache). A burst is ``--prompts``
distinct prompts of ``--length`` tokens submitted together, one new token each, timed from the submissions until
every one has its token: on the default step budget that is one prefill step. Around each burst, after 1.5 s of
idle:

* ``before``: a neighbour process spins one core for 0.4 s and exits just before the burst is submitted, as a web
  process does while it admits a burst's sends; the engine's last contention window saw it busy;
* ``during``: the burst is submitted on an idle box and a neighbour that spins one core for 1.5 s starts 20 ms
  later, as another process waking during the prefill.

Each round is one engine in a process of its own (``--checkouts``: each checkout's code, alternated round by round,
``devtools.checkouts.checkout_runs``) and reports its bursts' median; printed: ms per burst, median [min-max] over
the rounds, and the thread count the bursts' prefill steps ended on. The figures depend on the CPU; say which one
gave them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

NEIGHBOURS = ("before", "during")
_SPIN = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass"


def measure(during: int, prompts: int, length: int, bursts: int) -> dict:
    """One round in this process: ``{"ms": median ms per burst, "threads": [the prefill steps' final counts]}``."""
    from inference.engine import EngineConfig, LLMEngine, SamplingParams, load_model
    from inference.engine.config import DEFAULT_MODEL_SPEC

    loaded = load_model(DEFAULT_MODEL_SPEC, os.environ.get("MODEL_CACHE_DIR", "var/models"), device="cpu")
    engine = LLMEngine(
        loaded, EngineConfig(max_num_seqs=max(32, prompts), prefix_cache_tokens=0), owns_model=True
    )
    steps: list[tuple[int, int]] = []
    engine.add_step_listener(lambda s: steps.append((s.num_prefill_tokens, s.num_threads)))
    engine.start()
    params = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)
    engine.submit(list(range(1000, 1000 + length)), params).result(timeout=120)  # warm-up
    times, threads = [], []
    try:
        for b in range(bursts):
            time.sleep(1.5)
            if not during:
                subprocess.run([sys.executable, "-c", _SPIN.format(s=0.4)], check=True)
            steps.clear()
            started = time.perf_counter()
            handles = [
                engine.submit([3000 + b * 131 + i * 17 + j for j in range(length)], params)
                for i in range(prompts)
            ]
            neighbour = None
            if during:
                time.sleep(0.02)
                neighbour = subprocess.Popen([sys.executable, "-c", _SPIN.format(s=1.5)])
            for handle in handles:
                handle.result(timeout=120)
            times.append((time.perf_counter() - started) * 1000)
            threads += [n for tokens, n in steps if tokens]
            if neighbour is not None:
                neighbour.wait()
    finally:
        engine.shutdown()
    return {"ms": statistics.median(times), "threads": threads}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.burst_probe")
    p.add_argument("--checkouts", default="", help="comma-separated checkout directories, alternated")
    p.add_argument("--neighbour", choices=NEIGHBOURS, default="before")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bursts", type=int, default=6, help="bursts per round (one engine)")
    p.add_argument("--prompts", type=int, default=30)
    p.add_argument("--length", type=int, default=40, help="tokens per prompt")
    args = p.parse_args(argv)
    for name in ("rounds", "bursts", "prompts", "length"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    from devtools.checkouts import checkout_runs

    during = NEIGHBOURS.index(args.neighbour)
    runs = checkout_runs(
        __file__,
        measure,
        [during, args.prompts, args.length, args.bursts],
        checkouts=args.checkouts,
        rounds=args.rounds,
    )
    print(
        f"burst_probe: neighbour {args.neighbour}, {args.rounds} rounds x {args.bursts} bursts of {args.prompts} "
        f"prompts x {args.length} tokens, {len(os.sched_getaffinity(0))} CPUs; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print("| checkout | ms per burst (all first tokens) | prefill steps ended on, threads |")
    print("|---|---|---|")
    for checkout, rows in runs.items():
        ms = [r["ms"] for r in rows]
        counts = sorted({n for r in rows for n in r["threads"]})
        shares = ", ".join(f"{n}: {sum(r['threads'].count(n) for r in rows)}" for n in counts)
        print(f"| {checkout} | {statistics.median(ms):.1f} [{min(ms):.1f}-{max(ms):.1f}] | {shares} |")
    return 0


if __name__ == "__main__":
    # A --checkouts run: measure()'s four arguments.
    if len(sys.argv) == 5 and all(a.isdigit() for a in sys.argv[1:]):
        sys.path[0] = os.getcwd()  # the checkout measured (the working directory), not this file's directory
        print(json.dumps(measure(*map(int, sys.argv[1:]))))
    else:
        sys.exit(main())
