"""``python -m devtools.bench.turns``: TTFT of each turn of multi-turn conversations, prefix cache on vs off.

Each of ``--conversations`` conversations runs ``--turns`` turns in a closed loop (the next turn is sent when
the previous reply is complete, as a chat user does): turn k's prompt is turn k-1's prompt, the tokens the
engine generated for it, then ``--user-tokens`` new tokens (a corpus window), which is what the product
re-sends (the whole history). Conversations run concurrently on one engine, each with its own
``cache_salt`` (one user each, as the worker passes). Greedy, exactly ``--reply-tokens`` new tokens.

Two engines over the same loaded weights run the same conversations one after the other per round:
``prefix_cache_tokens=0`` (off) and the default capacity (on). Printed: TTFT per turn (median over
conversations and rounds, ms) with and without the cache, and the cache's hit rate (prompt tokens served
from the cache ÷ prompt tokens submitted).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading

from .loader import DEFAULT_SPEC, load, load_tokenizer, prepare
from .workloads import corpus_token_ids


def run_conversations(engine, corpus, args, round_no: int) -> list[list[float]]:
    """TTFT (ms) of every turn of every conversation: ``[conversation][turn]``."""
    from inference.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=args.reply_tokens, ignore_eos=True)
    out: list[list[float]] = [[] for _ in range(args.conversations)]

    def converse(c: int) -> None:
        history: list[int] = []
        for k in range(args.turns):
            start = (round_no * 7919 + c * 104729 + k * 15485863) % (len(corpus) - args.user_tokens)
            prompt = history + corpus[start : start + args.user_tokens]
            handle = engine.submit(prompt, params, cache_salt=f"user:{c}")
            finish = None
            generated: list[int] = []
            for ev in handle.events():
                generated.extend(getattr(ev, "token_ids", []) or [])
                finish = ev
            out[c].append(finish.timings.ttft_ms)
            history = prompt + generated

    threads = [threading.Thread(target=converse, args=(c,)) for c in range(args.conversations)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.turns", description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--user-tokens", type=int, default=60)
    p.add_argument("--reply-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--cache-dir", default="var/models")
    args = p.parse_args(argv)

    from inference.engine import EngineConfig, LLMEngine

    spec = dict(DEFAULT_SPEC, dtype="bfloat16")
    model_dir = prepare(spec, args.cache_dir)
    corpus = list(corpus_token_ids(load_tokenizer(model_dir)))
    bm = load(spec, args.cache_dir, args.threads)
    engines = {
        mode: LLMEngine(
            bm.engine_loaded,
            EngineConfig(
                device="cpu", num_threads=args.threads, prefix_cache_tokens=0 if mode == "off" else 8192
            ),
        )
        for mode in ("off", "on")
    }
    from inference.engine import SamplingParams

    for engine in engines.values():  # warm-up: oneDNN kernel selection, allocator growth
        engine.start()
        engine.submit(
            corpus[:200], SamplingParams(temperature=0.0, max_new_tokens=8), cache_salt="warmup"
        ).result()
    ttft: dict[str, list[list[list[float]]]] = {"off": [], "on": []}
    for rnd in range(args.rounds):
        for mode, engine in engines.items():
            ttft[mode].append(run_conversations(engine, corpus, args, rnd))
            print(f"# round {rnd} cache {mode} done", file=sys.stderr, flush=True)
    on = engines["on"].load()
    for engine in engines.values():
        engine.shutdown()

    print(
        f"{args.conversations} concurrent conversations x {args.turns} turns, {args.user_tokens} new user tokens "
        f"and {args.reply_tokens} reply tokens per turn, {args.rounds} round(s); TTFT median [min-max] ms"
    )
    print("\n| turn | prompt tokens | TTFT cache off | TTFT cache on | off ÷ on |\n|---|---|---|---|---|")
    for k in range(args.turns):
        vals = {m: [conv[k] for r in ttft[m] for conv in r] for m in ttft}
        med = {m: statistics.median(v) for m, v in vals.items()}
        plen = k * (args.user_tokens + args.reply_tokens) + args.user_tokens
        print(
            f"| {k + 1} | {plen} | {med['off']:.0f} [{min(vals['off']):.0f}-{max(vals['off']):.0f}] "
            f"| {med['on']:.0f} [{min(vals['on']):.0f}-{max(vals['on']):.0f}] | {med['off'] / med['on']:.2f} |"
        )
    rate = on.prefix_cache_hit_tokens_total / max(1, on.prefix_cache_query_tokens_total)
    print(
        f"\nprefix cache hit rate: {on.prefix_cache_hit_tokens_total} of {on.prefix_cache_query_tokens_total} "
        f"prompt tokens ({100 * rate:.1f}%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
