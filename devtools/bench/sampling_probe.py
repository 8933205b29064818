"""``python -m devtools.bench.sampling_probe [--rows 32] [--rounds 5] [--threads 1]``: what sampling costs per step.

Runs ``--rows`` chat requests through our engine with the chat's sampling defaults (temperature 0.7, top-p 0.9,
repetition penalty 1.1: ``INFERENCE_*`` in ``chatsite/settings/base.py``), keeps the logits and the sampler states
of every step that samples all of them, then times on those steps, each ``--rounds`` times over all kept steps:

* ``penalty, per-row mask``: the repetition penalty as it was applied before, a vocabulary-wide mask and two
  ``torch.where`` per row;
* ``penalty, batched``: :func:`inference.engine.sampling.apply_penalties` (one gather and scatter for all rows);
* ``draw, torch``: the torch path of temperature and top-p (``_sample_rows_torch``: topk, logsumexp, cumsum);
* ``draw, native``: the native kernel (``kernels/sampling.c``).

Prints one line per measure, ms per step as median [min-max] over the rounds, and how many rows the native kernel
left to the torch path. The figures depend on the CPU; say which one gave them.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import sys
import time


def _mask_penalty(logits, states) -> None:
    """The per-row repetition penalty of before: a ``[V]`` mask of prompt and output ids per row."""
    import torch

    vocab = logits.shape[1]
    for i, state in enumerate(states):
        ids = state.seen_index(vocab)
        seen = torch.zeros(vocab, dtype=torch.bool)
        seen[ids] = True
        row, p = logits[i], state.params.repetition_penalty
        row.copy_(torch.where(seen, torch.where(row > 0, row / p, row * p), row))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.sampling_probe")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads for the timed calls")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--cache-dir", default="var/models")
    args = p.parse_args(argv)

    import torch

    import inference.engine.engine as engine_module
    from devtools.overhead_bench import PROMPTS
    from inference.engine import EngineConfig, LLMEngine, SamplingParams, kernels, load_model
    from inference.engine.config import DEFAULT_MODEL_SPEC
    from inference.engine.sampling import TOP_P_CANDIDATES, _sample_rows_torch, _uniforms, apply_penalties

    native = kernels.top_p_sampler()
    if native is None:
        print("the native kernels cannot be built here", file=sys.stderr)
        return 1
    loaded = load_model(DEFAULT_MODEL_SPEC, args.cache_dir, device="cpu")
    engine = LLMEngine(loaded, EngineConfig(max_num_seqs=max(32, args.rows), device="cpu"), owns_model=True)
    kept: list[tuple[torch.Tensor, list]] = []
    sample = engine_module.sample_next_tokens

    def spy(logits, states, *rest, **named):
        if len(states) == args.rows:
            kept.append((logits.float().clone(), copy.deepcopy(states)))
        return sample(logits, states, *rest, **named)

    engine_module.sample_next_tokens = spy
    params = SamplingParams(
        temperature=0.7, top_p=0.9, repetition_penalty=1.1, max_new_tokens=args.max_tokens
    )
    try:
        for i in range(args.rows):
            engine.submit(
                engine.render_chat([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]), params
            )
        engine.run_until_idle()
    finally:
        engine_module.sample_next_tokens = sample
        engine.shutdown()
    if not kept:
        print(f"no step sampled all {args.rows} rows", file=sys.stderr)
        return 1

    torch.set_num_threads(args.threads)
    rows = kept[0][0].shape[0]

    def timed(fn) -> list[float]:
        per_round = []
        for _ in range(args.rounds):
            inputs = [(logits.clone(), copy.deepcopy(states)) for logits, states in kept]
            start = time.perf_counter()
            for logits, states in inputs:
                fn(logits, states)
            per_round.append((time.perf_counter() - start) / len(inputs) * 1000)
        return per_round

    left = 0

    def draw_native(logits, states):
        nonlocal left
        out = native.sample(
            logits,
            torch.full((rows,), 0.7),
            torch.zeros(rows, dtype=torch.long),
            torch.full((rows,), 0.9),
            _uniforms(states, None),
            TOP_P_CANDIDATES,
        )
        left += int((out < 0).sum())

    measures = {
        "penalty, per-row mask": timed(_mask_penalty),
        "penalty, batched": timed(apply_penalties),
        "draw, torch": timed(
            lambda logits, states: _sample_rows_torch(logits, states, _uniforms(states, None))
        ),
        "draw, native": timed(draw_native),
    }
    print(
        f"sampling_probe: {len(kept)} steps of {rows} rows x {kept[0][0].shape[1]} logits, {args.rounds} rounds, "
        f"{args.threads} thread(s); {platform.processor() or platform.machine()}"
    )
    for name, values in measures.items():
        print(
            f"  {name:22s} {statistics.median(values):7.2f} [{min(values):.2f}-{max(values):.2f}] ms per step"
        )
    print(f"  rows the native kernel left to torch: {left} of {rows * len(kept) * args.rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
