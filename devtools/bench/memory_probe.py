"""``python -m devtools.bench.memory_probe [N] [THREADS] [--dtype float32]``: peak RSS of a fresh engine process serving N requests.

What the worker does, measured in one new process: load the default model (``load_model``), build the engine that
owns it (``owns_model=True``, as ``LLMEngine.from_spec``), then prefill N 128-token prompts and decode 128 tokens
each (greedy, EOS ignored, prefix cache on as configured by default). Prints one JSON line with the RSS (MB, 10**6
bytes) after import, after load, after the engine is built, after the run, and the kernel's high-water mark
(``VmHWM``) at the end of each stage: the peak includes the load, unlike the side-by-side bench's per-run peak.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .metrics import read_status_mb


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.memory_probe")
    p.add_argument("n", type=int, nargs="?", default=32)
    p.add_argument("threads", type=int, nargs="?", default=2)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--cache-dir", default="var/models")
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default=None,
        help="the model's dtype (default: the default model's, bfloat16, which runs as float32 without native bf16)",
    )
    args = p.parse_args(argv)
    stages: dict[str, dict[str, float]] = {}

    def stage(name: str) -> None:
        stages[name] = {
            field: round(read_status_mb(proc_field) or float("nan"), 1)
            for field, proc_field in (("rss_mb", "VmRSS"), ("peak_mb", "VmHWM"))
        }

    import torch  # noqa: F401  (the import itself is a stage)

    stage("import")
    import dataclasses

    from inference.engine import EngineConfig, LLMEngine, SamplingParams, load_model
    from inference.engine.config import DEFAULT_MODEL_SPEC

    spec = dataclasses.replace(DEFAULT_MODEL_SPEC, dtype=args.dtype) if args.dtype else DEFAULT_MODEL_SPEC
    loaded = load_model(spec, args.cache_dir, device="cpu", num_threads=args.threads)
    stage("loaded")
    engine = LLMEngine(loaded, EngineConfig(device="cpu", num_threads=args.threads), owns_model=True)
    stage("engine")
    params = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens, ignore_eos=True)
    for i in range(args.n):
        engine.submit(list(range(1000, 1127)) + [2000 + i], params)
    t = time.perf_counter()
    engine.run_until_idle()
    stage("run")
    result = {
        "n": args.n,
        "dtype": str(loaded.dtype).replace("torch.", ""),
        "run_s": round(time.perf_counter() - t, 1),
        "stages": stages,
        "peak_rss_mb": stages["run"]["peak_mb"],
    }
    print(json.dumps(result))
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
