"""``python -m devtools.bench.finish_probe [--checkouts A,B] [--rounds 5] [--finishes 30]``: what the engine's own
work for a finished request costs: keeping its full blocks in the prefix cache (``PrefixCache.insert``) and freeing
its slot, which moves the last active slot's K/V into it (``KVCache.release``).

Builds a KV cache of the default model's shape (30 layers, 3 KV heads of 64, bfloat16; 32 slots of 2048 positions)
and a prefix cache of 32768 tokens whose pool pages are already written, as in an engine that has served a while,
fills 32 slots with 100 positions each, then times ``--finishes`` finishes (insert, then release) one after another
on torch's ``--threads`` threads, ``--rounds`` times. With ``--checkouts A,B`` each checkout's engine code is timed in
a process of its own run in that checkout, alternated round by round (``devtools.checkouts.checkout_runs``). Prints
ms of wall time and of the process's CPU per finish, median [min-max] over the rounds. The figures depend on the
CPU; say which one gave them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

LAYERS, KV_HEADS, HEAD_DIM, SLOTS, SLOT_LEN = 30, 3, 64, 32, 2048
WRITTEN = 100  # positions each request has written when it finishes


class _Owner:
    """A request as the KV cache sees it."""

    def __init__(self) -> None:
        self.slot = -1
        self.num_cached = 0


def measure(finishes: int, threads: int) -> dict:
    """One round in this process: ``{"wall_ms": ..., "cpu_ms": ...}`` per finish."""
    import torch

    from inference.engine.kv_cache import KVCache
    from inference.engine.prefix_cache import PrefixCache

    torch.set_num_threads(threads)
    kv = KVCache(
        LAYERS, KV_HEADS, HEAD_DIM, SLOTS, SLOT_LEN, SLOTS * SLOT_LEN, torch.bfloat16, torch.device("cpu")
    )
    cache = PrefixCache(kv, block_size=16, capacity_tokens=32768)
    cache._pool.fill_(0)  # its pages written once, as after a while of serving
    owners = []
    for _ in range(SLOTS):
        owner = _Owner()
        assert kv.try_allocate(owner, WRITTEN + 20)
        owner.num_cached = WRITTEN
        owners.append(owner)
    for layer in range(LAYERS):
        kv.k[layer][:, :, :WRITTEN].fill_(0.5)
        kv.v[layer][:, :, :WRITTEN].fill_(0.25)
    wall, cpu = time.perf_counter(), time.process_time()
    for i, owner in enumerate(owners[:finishes]):
        cache.insert([i * 1000 + j for j in range(WRITTEN)], f"user:{i}", owner.slot, owner.num_cached)
        kv.release(owner)
    n = min(finishes, SLOTS)
    return {
        "wall_ms": (time.perf_counter() - wall) * 1000 / n,
        "cpu_ms": (time.process_time() - cpu) * 1000 / n,
    }


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.finish_probe")
    p.add_argument("--checkouts", default="", help="comma-separated checkout directories, alternated")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--finishes", type=int, default=30)
    p.add_argument("--threads", type=int, default=2, help="torch's intra-op threads, as the engine's")
    args = p.parse_args(argv)
    from devtools.checkouts import checkout_runs

    runs = checkout_runs(
        __file__, measure, [args.finishes, args.threads], checkouts=args.checkouts, rounds=args.rounds
    )
    print(
        f"finish_probe: {args.rounds} rounds x {args.finishes} finishes, {args.threads} threads; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print("| checkout | wall per finish, ms | CPU per finish, ms |")
    print("|---|---|---|")
    for checkout, rows in runs.items():
        print(f"| {checkout} | {_fmt([r['wall_ms'] for r in rows])} | {_fmt([r['cpu_ms'] for r in rows])} |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and all(a.isdigit() for a in sys.argv[1:]):  # a --checkouts run: FINISHES THREADS
        sys.path[0] = os.getcwd()  # the checkout measured (the working directory), not this file's directory
        print(json.dumps(measure(int(sys.argv[1]), int(sys.argv[2]))))
    else:
        sys.exit(main())
