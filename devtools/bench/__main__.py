"""``python -m devtools.bench`` -- serving benchmark: naive vs static batching vs HF continuous batching vs ours.

Runs every (system, workload) cell in a fresh subprocess (same model file, dtype and machine, one after the
other), prints a table and the target ratios, and writes everything (per-request token timestamps included)
to ``--out`` as JSON. See ``devtools/bench/__init__.py`` for the systems and ``metrics.py`` for the metric
definitions and units.

Examples::

    python -m devtools.bench                          # full default run (~20-25 min on 2 cores)
    python -m devtools.bench --quick                  # smoke test, tiny sizes (~2 min)
    python -m devtools.bench --systems static,ours --workloads uniform --n 32
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime

from .cell import SYSTEMS
from .loader import DEFAULT_SPEC, load_tokenizer, prepare
from .metrics import measure_bandwidth
from .report import (
    compute_ratios,
    find,
    format_ratios,
    format_table,
    interference_warning,
    token_agreement,
    write_json,
)
from .workloads import RealisticParams, corpus_token_ids, realistic_workload, uniform_workload


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m devtools.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of naive,static,hf_cb,ours")
    p.add_argument("--workloads", default="uniform,realistic", help="comma list of uniform,realistic")
    p.add_argument("--n", default="1,8,32", help="uniform workload sizes (requests at t=0)")
    p.add_argument("--prompt-len", type=int, default=128, help="uniform prompt length (tokens)")
    p.add_argument(
        "--max-new-tokens", type=int, default=128, help="uniform reply length (tokens, EOS ignored)"
    )
    p.add_argument(
        "--rate", type=float, default=RealisticParams.rate, help="realistic Poisson arrival rate (requests/s)"
    )
    p.add_argument("--num-requests", type=int, default=None, help="realistic request count (default 48)")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="realistic arrival span (s); sets --num-requests to rate*duration",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--naive-max-requests",
        type=int,
        default=8,
        help="naive on uniform N > this measures only the first this-many requests and extrapolates "
        "the rest as a serial FIFO queue (labelled in the table); 0 = measure all",
    )
    p.add_argument("--window-ms", type=float, default=50.0, help="static batching collection window (ms)")
    p.add_argument(
        "--max-batch", type=int, default=32, help="static max batch; hf_cb/ours max running sequences"
    )
    p.add_argument("--max-batch-tokens", type=int, default=512, help="hf_cb/ours per-step token budget")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    p.add_argument("--cache-dir", default="var/models", help="model cache directory")
    p.add_argument(
        "--bandwidth-gb-s", type=float, default=None, help="skip the bandwidth measurement, use this"
    )
    p.add_argument("--bandwidth-mb", type=int, default=1024, help="size of the bandwidth copy (MiB)")
    p.add_argument("--cell-timeout", type=float, default=3600, help="seconds before a cell is killed")
    p.add_argument("--out", default=None, help="JSON output (default bench-results/bench-<timestamp>.json)")
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test")
    p.add_argument("--verbose", action="store_true", help="show the cells' own output")
    return p


def apply_quick(args: argparse.Namespace) -> None:
    args.n = "1,2"
    args.prompt_len = 32
    args.max_new_tokens = 8
    args.num_requests = 4
    args.rate = 4.0
    args.naive_max_requests = 0
    args.bandwidth_mb = 256


def realistic_params(args: argparse.Namespace) -> RealisticParams:
    n = args.num_requests
    if n is None and args.duration is not None:
        n = max(1, math.ceil(args.rate * args.duration))
    if args.quick:
        return RealisticParams(
            num_requests=n or 4,
            rate=args.rate,
            prompt_median=40,
            prompt_sigma=0.5,
            prompt_min=20,
            prompt_max=80,
            reply_median=8,
            reply_sigma=0.5,
            reply_min=4,
            reply_max=16,
            seed=args.seed,
        )
    return RealisticParams(num_requests=n or 48, rate=args.rate, seed=args.seed)


def run_cell_subprocess(cfg: dict, timeout: float, verbose: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-cell-") as d:
        cfg_path, out_path = os.path.join(d, "cfg.json"), os.path.join(d, "out.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        cmd = [sys.executable, "-m", "devtools.bench.cell", cfg_path, out_path]
        try:
            proc = subprocess.run(
                cmd,
                env=env,
                timeout=timeout,
                text=True,
                stdout=None if verbose else subprocess.PIPE,
                stderr=None if verbose else subprocess.STDOUT,
            )
            output = proc.stdout or ""
        except subprocess.TimeoutExpired:
            return {
                "system": cfg["system"],
                "workload": cfg["workload"]["name"],
                "n": len(cfg["workload"]["requests"]),
                "error": f"cell timed out after {timeout:.0f} s",
            }
        if os.path.exists(out_path):
            with open(out_path) as f:
                res = json.load(f)
        else:
            res = {
                "system": cfg["system"],
                "workload": cfg["workload"]["name"],
                "n": len(cfg["workload"]["requests"]),
                "error": f"cell exited with {proc.returncode}",
            }
        if "error" in res:
            res["output_tail"] = output[-3000:]
        return res


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        apply_quick(args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    systems = _csv(args.systems)
    for s in systems:
        if s not in SYSTEMS:
            raise SystemExit(f"unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    workloads = _csv(args.workloads)
    ns = [int(x) for x in _csv(args.n)]
    started = time.time()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_path = args.out or os.path.join("bench-results", f"bench-{stamp}.json")
    spec = dict(DEFAULT_SPEC, dtype=args.dtype)

    t = time.perf_counter()
    model_dir = prepare(spec, args.cache_dir)
    print(f"# model cache ready: {model_dir} ({time.perf_counter() - t:.1f} s)", file=sys.stderr)

    tok = load_tokenizer(model_dir)
    corpus = corpus_token_ids(tok)
    wls = []
    if "uniform" in workloads:
        wls += [uniform_workload(corpus, n, args.prompt_len, args.max_new_tokens, args.seed) for n in ns]
    if "realistic" in workloads:
        wls.append(realistic_workload(corpus, realistic_params(args)))
    unknown = set(workloads) - {"uniform", "realistic"}
    if unknown:
        raise SystemExit(f"unknown workloads {sorted(unknown)}")

    if args.bandwidth_gb_s:
        bandwidth = {"copy_gb_s": args.bandwidth_gb_s, "source": "--bandwidth-gb-s"}
    else:
        bandwidth = measure_bandwidth(args.bandwidth_mb << 20, repeats=5, num_threads=args.threads)
        bandwidth["source"] = "measured: torch uint8 copy, (read+write bytes)/s, best of 5"
    print(
        f"# memory bandwidth {bandwidth['copy_gb_s']} GB/s; {len(wls)} workloads x {len(systems)} systems",
        file=sys.stderr,
    )

    opts = {
        "naive_max_requests": args.naive_max_requests,
        "window_ms": args.window_ms,
        "max_batch": args.max_batch,
        "max_seqs": args.max_batch,
        "max_batch_tokens": args.max_batch_tokens,
        "threads": args.threads,
        "timeout_s": args.cell_timeout,
    }
    cells = []
    total = len(wls) * len(systems)
    for wl in wls:
        for system in systems:
            cfg = {
                "system": system,
                "workload": wl.to_dict(),
                "spec": spec,
                "cache_dir": args.cache_dir,
                "threads": args.threads,
                "opts": opts,
            }
            t = time.perf_counter()
            res = run_cell_subprocess(cfg, args.cell_timeout + 120, args.verbose)
            cells.append(res)
            if "summary" in res:
                s = res["summary"]
                msg = (
                    f"{s['output_tok_s']} tok/s, TTFT p99 {s['ttft_ms_p99']} ms, RSS {res['peak_rss_mb']} MB"
                )
            else:
                msg = "FAILED: " + res.get("error", "?") + "\n" + res.get("output_tail", "")[-1500:]
            print(
                f"# [{len(cells)}/{total}] {system:6s} {wl.label:16s} {time.perf_counter() - t:6.1f} s  {msg}",
                file=sys.stderr,
                flush=True,
            )

    for c in cells:
        if "summary" in c and c["system"] != "naive":
            c["agreement_vs_naive"] = token_agreement(c, find(cells, "naive", c["workload"], c["n"]))
    uniform_n = max(ns) if ("uniform" in workloads and ns) else None
    ratios = compute_ratios(cells, bandwidth.get("copy_gb_s"), uniform_n)
    elapsed = time.time() - started

    first = next((c for c in cells if "summary" in c), {})
    print()
    print(
        f"chatsite inference benchmark -- {spec['name']} {args.dtype}, {first.get('torch_threads', '?')} torch "
        f"threads, {platform.processor() or platform.machine()}"
    )
    print(
        "times in ms, throughput in output tok/s, RSS = peak MB of the cell's process during the run; "
        "meas = requests actually measured; dec/seq = per-sequence decode tok/s (p50); "
        "=naive = replies token-identical to naive; bg cpu = cores used by other processes meanwhile"
    )
    print(format_table(cells))
    print()
    print(format_ratios(ratios, bandwidth))
    warning = interference_warning(cells)
    if warning:
        print(warning)
    print(f"\ntotal {elapsed / 60:.1f} min; JSON: {out_path}")

    payload = {
        "meta": {
            "timestamp_utc": stamp,
            "argv": sys.argv if argv is None else ["python", "-m", "devtools.bench", *argv],
            "args": vars(args),
            "model": spec,
            "machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "platform": platform.platform()},
            "bandwidth": bandwidth,
            "elapsed_s": round(elapsed, 1),
        },
        "ratios": ratios,
        "cells": cells,
    }
    write_json(out_path, payload)
    return 0 if all("summary" in c for c in cells) else 1


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
