"""``python -m devtools.bench.step_log FILE [--min-finishes 10] [--min-batch 28] [--steps]``: where a GPU worker's
engine steps spent their time, from the JSON lines ``ENGINE_STEP_LOG`` made it write (observability/step_log.py).

Compares the steady decode's steps (a batch of at least ``--min-batch`` requests, no prompt tokens, no request
finished) with the steps in which at least ``--min-finishes`` requests finished at once (the end of a wave of
replies): each one's wall time split into the forward pass, applying its results, and within that the finished
requests' K/V work (prefix-cache insert and slot release), with the engine loop thread's CPU beside each wall
time. Wall well above CPU means the loop thread waited, for the GIL or for a core. Prints milliseconds, median
[min-max]; ``--steps`` lists every such finishing step. The figures depend on the CPU; say which one gave them.
"""

from __future__ import annotations

import argparse
import json
import sys

from devtools.bench_figures import median_range


def load(path: str) -> list[dict]:
    """The step log's lines as dicts; a line that is not JSON (a worker killed mid-write) is skipped."""
    steps = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                steps.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return steps


def spread(values: list[float]) -> str:
    """``median [min-max]`` of ``values`` (ms) with one decimal; ``-`` when empty."""
    return median_range(values, "{:.1f}")


def kind_of(step: dict, *, min_finishes: int = 10, min_batch: int = 28) -> str:
    """The kind of one logged step, in this order of precedence: "finishing" (at least ``min_finishes`` requests
    finished, prompt tokens or not), "prefill" (any prompt tokens), "steady decode" (no request finished, a batch
    of at least ``min_batch``), "other" (smaller decode batches, steps finishing fewer requests)."""
    if step["num_finished"] >= min_finishes:
        return "finishing"
    if step["num_prefill_tokens"] > 0:
        return "prefill"
    if step["num_finished"] == 0 and step["batch_size"] >= min_batch:
        return "steady decode"
    return "other"


def summarise(steps: list[dict], *, min_finishes: int = 10, min_batch: int = 28) -> dict:
    """``{"decode": [...], "finishing": [...]}``: the steady decode's steps and the finishing steps (dicts of
    the log's fields, seconds), as :func:`kind_of` sorts them."""
    kinds = [kind_of(s, min_finishes=min_finishes, min_batch=min_batch) for s in steps]
    return {
        "decode": [s for s, kind in zip(steps, kinds, strict=True) if kind == "steady decode"],
        "finishing": [s for s, kind in zip(steps, kinds, strict=True) if kind == "finishing"],
    }


def time_by_kind(
    steps: list[dict], *, min_finishes: int = 10, min_batch: int = 28
) -> list[tuple[str, int, float]]:
    """``[(kind, steps, seconds), ...]``: the sum of ``duration_s`` over each kind of step (:func:`kind_of`),
    every step counted once."""
    kinds = {"finishing": [0, 0.0], "prefill": [0, 0.0], "steady decode": [0, 0.0], "other": [0, 0.0]}
    for s in steps:
        totals = kinds[kind_of(s, min_finishes=min_finishes, min_batch=min_batch)]
        totals[0] += 1
        totals[1] += s["duration_s"]
    return [(kind, count, seconds) for kind, (count, seconds) in kinds.items()]


def report(steps: list[dict], *, min_finishes: int, min_batch: int, every: bool) -> str:
    """The printed summary (markdown tables) of ``steps``."""
    parts = summarise(steps, min_finishes=min_finishes, min_batch=min_batch)
    ms = 1e3
    out = [
        f"step_log: {len(steps)} steps; {len(parts['decode'])} decode steps of >= {min_batch} requests, "
        f"{len(parts['finishing'])} steps finishing >= {min_finishes} requests",
        "",
        "| steps | step ms | forward ms | apply ms (wall) | apply ms (loop thread CPU) | finishes |",
        "|---|---|---|---|---|---|",
    ]
    for name, rows in (("steady decode", parts["decode"]), ("finishing", parts["finishing"])):
        out.append(
            f"| {name} | {spread([s['duration_s'] * ms for s in rows])} | "
            f"{spread([s['forward_s'] * ms for s in rows])} | {spread([s['apply_s'] * ms for s in rows])} | "
            f"{spread([s['apply_cpu_s'] * ms for s in rows])} | {spread([float(s['num_finished']) for s in rows])} |"
        )
    fin = [s for s in parts["finishing"] if s["num_finished"]]
    out += [
        "",
        "finished requests' K/V work per finish, in the finishing steps: "
        f"wall {spread([s['finish_kv_s'] * ms / s['num_finished'] for s in fin])} ms, "
        f"loop thread CPU {spread([s['finish_kv_cpu_s'] * ms / s['num_finished'] for s in fin])} ms",
    ]
    by_kind = time_by_kind(steps, min_finishes=min_finishes, min_batch=min_batch)
    total = sum(seconds for _, _, seconds in by_kind)
    out += ["", "| kind of step | steps | ms | share of the steps' time |", "|---|---|---|---|"]
    for kind, count, seconds in by_kind:
        share = f"{seconds / total:.0%}" if total else "-"
        out.append(f"| {kind} | {count} | {seconds * ms:.0f} | {share} |")
    if every:
        out += [
            "",
            "| step ms | finishes | forward ms | apply ms wall / CPU | K/V work ms wall / CPU |",
            "|---|---|---|---|---|",
        ]
        for s in parts["finishing"]:
            out.append(
                f"| {s['duration_s'] * ms:.1f} | {s['num_finished']} | {s['forward_s'] * ms:.1f} | "
                f"{s['apply_s'] * ms:.1f} / {s['apply_cpu_s'] * ms:.1f} | "
                f"{s['finish_kv_s'] * ms:.1f} / {s['finish_kv_cpu_s'] * ms:.1f} |"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.bench.step_log", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("file", help="an ENGINE_STEP_LOG file")
    parser.add_argument(
        "--min-finishes", type=int, default=10, help="a finishing step ends at least this many"
    )
    parser.add_argument(
        "--min-batch", type=int, default=28, help="a steady decode step holds at least this many"
    )
    parser.add_argument("--steps", action="store_true", help="list every finishing step")
    args = parser.parse_args(argv)
    if args.min_finishes < 1 or args.min_batch < 1:
        parser.error("--min-finishes and --min-batch must be at least 1")
    try:
        steps = load(args.file)
    except OSError as exc:
        parser.error(f"cannot read {args.file}: {exc.strerror}")
    print(report(steps, min_finishes=args.min_finishes, min_batch=args.min_batch, every=args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
