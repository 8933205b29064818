"""``python -m inference.engine.kernels.calibrate``: time every implementation of the projections that this CPU can run
against each other, for the registry's measured table (:data:`~inference.engine.kernels.table.MEASURED`).

For each op (``linear``: every layer's QKV, O and down projections and the lm_head; ``gated_up``: every layer's gate/up
with its SiLU) and each implementation the registry has that this CPU runs and the weights fit, the model's weights are
bound to that implementation alone (one at a time, so the copies of the others are not held at once), then a step of
``rows`` rows goes through all of them, ``--rounds`` times after one warm-up; prints median [min-max] milliseconds and
the weight bytes each holds. Nothing is written: copy the figures into ``kernels/table.py`` with the machine and date.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from typing import Any

import torch

from ..block_quant import BlockWeight
from . import registry


def _nbytes(value: Any) -> int:
    """Bytes of the tensors a bound implementation holds (its closure's packed copies and blocks)."""
    seen: dict[int, int] = {}

    def visit(obj: Any, depth: int) -> None:
        if isinstance(obj, torch.Tensor):
            seen[id(obj)] = obj.numel() * obj.element_size()
        elif isinstance(obj, BlockWeight | tuple) and depth < 3:
            for item in (obj.qs, obj.d, obj.mn) if isinstance(obj, BlockWeight) else obj:
                visit(item, depth + 1)
        elif callable(obj) and getattr(obj, "__closure__", None) and depth < 3:
            for cell in obj.__closure__:
                visit(cell.cell_contents, depth + 1)

    visit(value, 0)
    return sum(seen.values())


def measure(*, dtype: torch.dtype, rows: list[int], rounds: int, cache_dir: str, threads: int) -> list[str]:
    """Lines of the table: op, implementation, rows, median [min-max] ms, MB held."""
    from ..config import DEFAULT_MODEL_SPEC
    from ..loader import load_model
    from ..runner_linear import GatedUp, Linear, Natives
    from ..runner_weights import BlockLookup, fuse

    torch.set_num_threads(threads)
    spec = replace(DEFAULT_MODEL_SPEC, dtype=str(dtype).removeprefix("torch."), cpu_float32_fallback=False)
    loaded = load_model(spec, cache_dir, device="cpu", num_threads=threads)
    model = loaded.model
    natives = Natives.load(native=True)
    blocks_of = BlockLookup(model, loaded.block_weights)
    weights: dict[str, list[tuple[torch.Tensor, torch.Tensor | None, Any, int]]] = {
        "linear": [],
        "gated_up": [],
    }
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        wqkv, _ = fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        wgu, _ = fuse([mlp.gate_proj, mlp.up_proj])
        weights["linear"] += [
            (wqkv, None, blocks_of(attn.q_proj, attn.k_proj, attn.v_proj), 0),
            (attn.o_proj.weight.data, None, blocks_of(attn.o_proj), 0),
            (mlp.down_proj.weight.data, None, blocks_of(mlp.down_proj), 0),
        ]
        weights["gated_up"].append(
            (wgu, None, blocks_of(mlp.gate_proj, mlp.up_proj), mlp.gate_proj.out_features)
        )
    tied = blocks_of(model.lm_head) or blocks_of(model.model.embed_tokens)
    weights["linear"].append((model.lm_head.weight.data, None, tied, 0))
    lines = []
    for op, parts in weights.items():
        for entry in registry.kernels_of(op):
            if registry.unavailable(entry, dtype) is not None or entry.name in ("unfused",):
                continue
            bound = []
            for w, b, bw, inter in parts:
                holder = (
                    GatedUp(w, b, inter, block_weight=bw, natives=natives)
                    if op == "gated_up"
                    else Linear(w, b, block_weight=bw, natives=natives)
                )
                fn = holder._build(entry)
                if fn is None:
                    break
                bound.append((fn, w.shape[1]))
            else:
                mb = sum(_nbytes(fn) for fn, _ in bound) / 1e6
                for m in rows:
                    if (entry.rows_limit(dtype) or m) < m:
                        continue
                    xs = {k: torch.randn(m, k, dtype=dtype) for k in {k for _, k in bound}}
                    times = []
                    with torch.inference_mode():
                        for _ in range(rounds + 1):
                            started = time.perf_counter()
                            for fn, k in bound:
                                fn(xs[k])
                            times.append((time.perf_counter() - started) * 1e3)
                    t = times[1:]
                    lines.append(
                        f"{op:9} {entry.name:26} rows {m:4}: {statistics.median(t):8.2f} "
                        f"[{min(t):.2f}-{max(t):.2f}] ms, {mb:6.0f} MB"
                    )
                    print(lines[-1], flush=True)
            del bound
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inference.engine.kernels.calibrate")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 512])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache-dir", default="var/models")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    print(f"CPU kind {registry.cpu_kind()}, {args.dtype}, {args.threads} threads, default model", flush=True)
    measure(dtype=dtype, rows=args.rows, rounds=args.rounds, cache_dir=args.cache_dir, threads=args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
