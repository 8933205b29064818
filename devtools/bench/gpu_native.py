"""``python -m devtools.bench.gpu_native OUTDIR``: the native engine against Hugging Face transformers'
``generate`` (static batch) on a GPU, on randomly initialised Llama models: the default model's shape
(SmolLM2-135M) and a ~1.07B shape (Llama-3.2-1B's layers with SmolLM2's vocabulary). Random weights need no
files to travel; the shapes, not the values, set the speed (every reply runs to ``max_new_tokens``).

Workloads: uniform N=1 and N=32 (128-token prompts, 128 new tokens each, greedy), and a mixed one (64 requests,
Poisson arrivals at 8 req/s, lognormal prompt lengths 16..1500, 128 new tokens; the native engine only, since
``generate`` has no arrivals). Each round prints one JSON line; ``OUTDIR/gpu_bench.json`` holds them all.
docs/serving-backends.md tabulates a run (median [min-max] over the rounds).

Options: ``--device cuda|cpu`` (default cuda), ``--rounds N`` (default 3), ``--quick`` (one round, tiny
workloads: a smoke test), ``--template DIR`` (a prepared model directory whose config and tokenizer the
random models copy; default ``MODEL_CACHE_DIR/<default model>`` or ``var/models/smollm2-135m-instruct``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time

import torch

from inference.engine import EngineConfig, LLMEngine, ModelSpec, SamplingParams

#: Config overrides of each random model over the template's (SmolLM2-135M: 30 layers, 576 hidden, 9/3 heads).
SHAPES = {
    "smollm2-135m-random": {},
    "llama-1b-random": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
    },
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def model_make(*, root: str, name: str, overrides: dict, template: str) -> tuple[str, int]:
    """Save a bf16 Llama with random weights (seed 0) under ``root/src/name``; returns (directory, parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = os.path.join(root, "src", name)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(template, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(overrides)
    skip = ("architectures", "transformers_version", "_model_name_or_path")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k not in skip})).to(
        torch.bfloat16
    )
    model.save_pretrained(out)
    for name_ in TOKENIZER_FILES:
        if os.path.exists(os.path.join(template, name_)):
            shutil.copy(os.path.join(template, name_), out)
    params = sum(p.numel() for p in model.parameters())
    del model
    return out, params


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` random token ids (100..40000)."""
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(n)]


def run_native(
    engine: LLMEngine, batch: list[list[int]], max_new: int, arrivals: list[float] | None = None
) -> dict:
    """Submit ``batch`` (at ``arrivals`` seconds when given), greedy, exactly ``max_new`` tokens each.
    Returns ``tok_s`` (generated tokens / wall s), ``wall_s`` and TTFT p50/p99 in ms (engine-measured)."""
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True)
    t0 = time.perf_counter()
    handles = []
    for i, prompt in enumerate(batch):
        if arrivals and (wait := arrivals[i] - (time.perf_counter() - t0)) > 0:
            time.sleep(wait)
        handles.append(engine.submit(prompt, params))
    ttfts, tokens = [], 0
    for handle in handles:
        final = handle.result(timeout=600)
        tokens += final.usage.completion_tokens
        if final.timings.ttft_ms is not None:
            ttfts.append(final.timings.ttft_ms)
    wall = time.perf_counter() - t0
    ttfts.sort()
    return {
        "tok_s": tokens / wall,
        "wall_s": wall,
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p99_ms": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
    }


def run_hf(model, batch: list[list[int]], max_new: int, device: str) -> dict:
    """transformers' ``generate`` on the whole batch at once (no arrivals), greedy, exactly ``max_new`` tokens."""
    ids = torch.tensor(batch, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new,
        min_new_tokens=max_new,
        do_sample=False,
        pad_token_id=2,
    )
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"tok_s": (out.shape[1] - ids.shape[1]) * out.shape[0] / wall, "wall_s": wall}


def mixed_workload(*, seed: int, n: int) -> tuple[list[list[int]], list[float]]:
    """``n`` requests with Poisson arrivals at 8 req/s and lognormal prompt lengths (16..1500 tokens)."""
    rng = random.Random(seed)
    t, arrivals, batch = 0.0, [], []
    for _ in range(n):
        t += rng.expovariate(8.0)
        arrivals.append(t)
        length = max(16, min(1500, int(rng.lognormvariate(5.5, 0.8))))
        batch.append(prompts(1, length, rng.randrange(10**6))[0])
    return batch, arrivals


def default_template() -> str:
    try:
        from django.conf import settings

        return os.path.join(settings.MODEL_CACHE_DIR, settings.INFERENCE_DEFAULT_MODEL)
    except Exception:  # run without Django settings
        return os.path.join("var", "models", "smollm2-135m-instruct")


def bench_shape(name: str, overrides: dict, args, root: str, emit) -> None:
    """Every workload and round of one model shape; ``emit(row)`` records each row."""
    from transformers import AutoModelForCausalLM

    quick = args.quick
    rounds = 1 if quick else args.rounds
    plen, gen = (32, 8) if quick else (128, 128)
    src, nparams = model_make(root=root, name=name, overrides=overrides, template=args.template)
    spec = ModelSpec(name=name, source=src, dtype="bfloat16", context_length=4096)
    engine = LLMEngine.from_spec(
        spec, EngineConfig(device=args.device, max_num_seqs=32), os.path.join(root, "cache")
    )
    engine.start()
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).to(args.device).eval()
    run_native(engine, prompts(2, plen, 99), 4)  # warm-up: CUDA context, kernels, allocator
    run_hf(hf, prompts(2, plen, 99), 4, args.device)
    base = {"model": name, "params": nparams}
    for n in (1, 32):
        for r in range(rounds):
            batch = prompts(n, plen, r)
            ours = run_native(engine, batch, gen)
            theirs = run_hf(hf, batch, gen, args.device)
            emit({**base, "workload": f"uniform N={n}", "round": r, "ours": ours, "hf_generate": theirs,
                  "ratio": ours["tok_s"] / theirs["tok_s"]})  # fmt: skip
    for r in range(rounds):
        batch, arrivals = mixed_workload(seed=1000 + r, n=16 if quick else 64)
        ours = run_native(engine, batch, 8 if quick else 128, arrivals)
        emit({**base, "workload": "mixed 64 req @ 8 req/s", "round": r, "ours": ours})
    engine.shutdown()
    del hf
    if args.device == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.gpu_native")
    p.add_argument("outdir")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--template", default=None)
    args = p.parse_args(argv)
    args.template = args.template or default_template()
    info = {"device": args.device, "torch": torch.__version__}
    if args.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(info), flush=True)
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as root:
        for name, overrides in SHAPES.items():
            if not (args.quick and name != "smollm2-135m-random"):
                bench_shape(name, overrides, args, root, emit)
    os.makedirs(args.outdir, exist_ok=True)
    with open(os.path.join(args.outdir, "gpu_bench.json"), "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
