"""One benchmark cell = one (system, workload) pair, run in its own process.

``python -m devtools.bench.cell CONFIG.json RESULT.json`` -- started by ``devtools.bench.__main__``.

A fresh process per cell keeps the systems from influencing each other (allocator state, threads, KV caches
left behind) and makes peak RSS a per-system number: the kernel's RSS high-water mark is reset after the
model is loaded and warmed up, so the reported peak covers the measured run only, model weights included.
"""

from __future__ import annotations

import gc
import json
import platform
import sys
import time
import traceback

from .loader import load
from .metrics import (
    CpuInterference,
    RssSampler,
    extrapolate_serial,
    read_peak_rss_mb,
    reset_peak_rss,
    rss_mb,
    summarize,
    weight_bytes,
)
from .workloads import Workload

SYSTEMS = ("naive", "static", "hf_cb", "ours")


def make_system(name: str, bm, opts: dict):
    if name == "naive":
        from .naive import NaiveSystem

        return NaiveSystem(bm, opts)
    if name == "static":
        from .static import StaticSystem

        return StaticSystem(bm, opts)
    if name == "hf_cb":
        from .hf_cb import HfCbSystem

        return HfCbSystem(bm, opts)
    if name == "ours":
        from .ours import OursSystem

        return OursSystem(bm, opts)
    raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")


def run_cell(cfg: dict) -> dict:
    """Load, warm up, measure; return the cell's JSON-able result (see ``report`` for the fields used)."""
    import torch
    import transformers

    system_name = cfg["system"]
    wl = Workload.from_dict(cfg["workload"])
    opts = dict(cfg.get("opts") or {})
    bm = load(cfg["spec"], cfg["cache_dir"], cfg.get("threads"))
    # Read before the system is built: ``ours`` owns the model and frees the float weights it holds in other forms.
    model_weight_bytes = weight_bytes(bm.model)
    model_dtype = str(next(bm.model.parameters()).dtype).replace("torch.", "")

    requests = list(wl.requests)
    cap = int(opts.get("naive_max_requests") or 0)
    extrapolate = system_name == "naive" and wl.name == "uniform" and cap and len(requests) > cap
    measured = requests[:cap] if extrapolate else requests

    system = make_system(system_name, bm, opts)
    result: dict = {"system": system_name, "workload": wl.name, "n": wl.n, "params": wl.params}
    try:
        t = time.perf_counter()
        system.warmup(measured)
        warmup_s = time.perf_counter() - t
        gc.collect()
        rss_before = rss_mb()
        hwm_reset = reset_peak_rss()
        with RssSampler() as sampler, CpuInterference() as interference:
            t0 = time.perf_counter() + 0.05  # a moment for feeder threads to be ready
            records = system.run(measured, t0)
            run_s = time.perf_counter() - t0
        hwm = read_peak_rss_mb() if hwm_reset else None
    finally:
        system.close()
    peak = hwm if hwm is not None else sampler.peak_mb

    full = extrapolate_serial(records, wl.n) if extrapolate else records
    result.update(
        {
            "measured_n": len(measured),
            "extrapolated": bool(extrapolate),
            "summary": summarize(full),
            "summary_measured": summarize(records) if extrapolate else None,
            "records": [r.to_dict(t0) for r in records],
            "peak_rss_mb": round(peak, 1),
            "rss_method": "VmHWM (reset after warmup)" if hwm is not None else "psutil sampling every 20 ms",
            "rss_before_run_mb": round(rss_before, 1),
            "weight_bytes": model_weight_bytes,
            "load_s": round(bm.load_s, 2),
            "warmup_s": round(warmup_s, 2),
            "run_s": round(run_s, 2),
            "notes": system.notes,
            "other_cpu_cores": interference.other_cores,
            "steal_cpu_cores": interference.steal_cores,
            "torch_threads": torch.get_num_threads(),
            "versions": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
            "dtype": model_dtype,
        }
    )
    return result


def main(argv: list[str]) -> int:
    cfg_path, out_path = argv
    with open(cfg_path) as f:
        cfg = json.load(f)
    try:
        result = run_cell(cfg)
        rc = 0
    except Exception as e:
        result = {
            "system": cfg.get("system"),
            "workload": cfg.get("workload", {}).get("name"),
            "n": len(cfg.get("workload", {}).get("requests", [])),
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc(),
        }
        rc = 1
    with open(out_path, "w") as f:
        json.dump(result, f)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
