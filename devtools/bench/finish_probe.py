"""``python -m devtools.bench.finish_probe [--checkouts A,B] [--rounds 5] [--finishes 30]``: what the engine's own
work for a finished request costs: keeping its full blocks in the prefix cache (``PrefixCache.insert``) and freeing
its slot, which moves the last active slot's K/V into it (``KVCache.release``).

Builds a KV cache of the default model's shape (30 layers, 3 KV heads of 64, bfloat16; 32 slots of 2048 positions)
and a prefix cache of 32768 tokens whose pool pages are already written, as in an engine that has served a while,
fills 32 slots with 100 positions each, then times ``--finishes`` finishes as one engine step that ends them does
(each one's insert, then their slots freed together by ``KVCache.release_many``, or one after another by
``release`` in a checkout without it) on torch's ``--threads`` threads, ``--rounds`` times. A fresh pool hands out
its rows in order, so each request's new blocks land in consecutive rows; ``--scattered`` shuffles the free rows
first, as in a pool whose blocks were evicted and reused out of order; ``--fresh-pool`` leaves the pool's pages
unwritten, as after the engine's memory target handed evicted blocks' pages back to the OS, so that each insert
faults its rows in; ``--float32`` keeps K/V in float32, as on a CPU without AVX-512. With ``--checkouts A,B`` each
checkout's engine code is timed in a process of its own run in that checkout, alternated round by round
(``devtools.checkouts.checkout_runs``). Prints ms of wall time and of the process's CPU per finish, median
[min-max] over the rounds, and the median of the process's minor page faults per finish. The figures depend on the
CPU; say which one gave them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
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


def measure(finishes: int, threads: int, scattered: int = 0, fresh: int = 0, float32: int = 0) -> dict:
    """One round in this process: ``{"wall_ms": ..., "cpu_ms": ..., "faults": ...}`` per finish (``faults``: the
    process's minor page faults)."""
    import torch

    from inference.engine.kv_cache import KVCache
    from inference.engine.prefix_cache import PrefixCache

    torch.set_num_threads(threads)
    dtype = torch.float32 if float32 else torch.bfloat16
    kv = KVCache(LAYERS, KV_HEADS, HEAD_DIM, SLOTS, SLOT_LEN, SLOTS * SLOT_LEN, dtype, torch.device("cpu"))
    cache = PrefixCache(kv, block_size=16, capacity_tokens=32768)
    if not fresh:
        cache._pool.fill_(0)  # its pages written once, as after a while of serving
    if scattered:  # rows in no order, as in a pool whose blocks were evicted and reused out of order
        random.Random(7).shuffle(cache._free)
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
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    release_many = getattr(kv, "release_many", None)  # a checkout before it freed each finish's slot at once
    for i, owner in enumerate(owners[:finishes]):
        cache.insert([i * 1000 + j for j in range(WRITTEN)], f"user:{i}", owner.slot, owner.num_cached)
        if release_many is None:
            kv.release(owner)
    if release_many is not None:
        release_many(owners[:finishes])
    n = min(finishes, SLOTS)
    return {
        "wall_ms": (time.perf_counter() - wall) * 1000 / n,
        "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / n,
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
    p.add_argument(
        "--scattered",
        action="store_true",
        help="the prefix cache's free rows shuffled: no two blocks in a row",
    )
    p.add_argument(
        "--fresh-pool",
        action="store_true",
        help="the pool's pages not written yet (or handed back by the memory target): each insert faults them in",
    )
    p.add_argument("--float32", action="store_true", help="K/V in float32, as on a CPU without AVX-512")
    args = p.parse_args(argv)
    from devtools.checkouts import checkout_runs

    runs = checkout_runs(
        __file__,
        measure,
        [args.finishes, args.threads, int(args.scattered), int(args.fresh_pool), int(args.float32)],
        checkouts=args.checkouts,
        rounds=args.rounds,
    )
    print(
        f"finish_probe: {args.rounds} rounds x {args.finishes} finishes, {args.threads} threads"
        f"{', scattered rows' if args.scattered else ''}{', fresh pool' if args.fresh_pool else ''}"
        f"{', float32' if args.float32 else ', bfloat16'}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print("| checkout | wall per finish, ms | CPU per finish, ms | minor page faults per finish |")
    print("|---|---|---|---|")
    for checkout, rows in runs.items():
        print(
            f"| {checkout} | {_fmt([r['wall_ms'] for r in rows])} | {_fmt([r['cpu_ms'] for r in rows])} | "
            f"{statistics.median(r['faults'] for r in rows):.0f} |"
        )
    return 0


if __name__ == "__main__":
    # A --checkouts run: measure()'s five arguments.
    if len(sys.argv) == 6 and all(a.isdigit() for a in sys.argv[1:]):
        sys.path[0] = os.getcwd()  # the checkout measured (the working directory), not this file's directory
        print(json.dumps(measure(*map(int, sys.argv[1:]))))
    else:
        sys.exit(main())
