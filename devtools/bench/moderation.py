"""Moderation benchmark: ``python -m devtools.bench.moderation [latency] [quality] [decode]``.

* ``latency``: the default input chain (``SAFETY_GUARDS``' defaults: rules + the profanity classifier,
  default policy) on 200- and 8,000-character messages; p50 and p99 per round (ms).
* ``quality``: precision and recall of the default chain (input stage) on ``moderation_labelled.jsonl``
  beside this file: 112 texts written by chatsite's developers for this benchmark (52 that should be
  flagged: prompt injection, secrets, invisible Unicode, offensive language, repetition; 60 ordinary chat
  requests, several chosen to be near misses). It is small and not an independent corpus: a regression
  check, not a claim about real traffic.
* ``decode``: the real engine (default model, settings' dtype) decoding N=32 concurrent replies of 128
  tokens (greedy, ``ignore_eos``), one consumer thread per reply as in the worker; output moderation off
  (the consumer only collects deltas) and on (each consumer runs ``safety.streaming.OutputMonitor`` at
  sentence ends and once at the end), alternating in one process. Output tok/s = completion tokens / wall
  time from the first submit to the last finish; also the checks' own CPU time (thread time summed over the
  consumers) as a share of the round's wall time, the cost that no scheduling noise hides.

Every section runs ``--rounds`` rounds (default 3) and prints median [min-max]. Nothing here is imported by
the product.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LABELLED = HERE / "moderation_labelled.jsonl"


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import django

    django.setup()


def _fmt(values: list[float], digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def labelled() -> list[dict]:
    """The labelled set: ``[{"text", "flagged", "kind"}]``."""
    return [json.loads(line) for line in LABELLED.read_text(encoding="utf-8").splitlines() if line.strip()]


def chat_text(n_chars: int, seed: int) -> str:
    """``n_chars`` of ordinary chat-like English: words of the labelled set's clean texts in random order
    (varied enough not to look like repetition to zlib)."""
    rng = random.Random(seed)
    words = sorted({w for row in labelled() if not row["flagged"] for w in row["text"].split()})
    out: list[str] = []
    size = 0
    while size < n_chars:
        word = rng.choice(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n_chars]


def bench_latency(rounds: int, iterations: int) -> dict:
    from safety.chain import chain_run

    chain_run(text="warm up", stage="input")
    results = {}
    for n_chars in (200, 8000):
        p50s, p99s, cpu50s, cpu99s = [], [], [], []
        for r in range(rounds):
            texts = [chat_text(n_chars, seed=1000 * r + i) for i in range(50)]
            times, cpu = [], []
            for i in range(iterations):
                text = texts[i % len(texts)]
                started, cpu_started = time.perf_counter(), time.thread_time()
                verdict = chain_run(text=text, stage="input")
                cpu.append((time.thread_time() - cpu_started) * 1000)
                times.append((time.perf_counter() - started) * 1000)
                assert not verdict.blocked, verdict.categories
            for values, p50, p99 in ((times, p50s, p99s), (cpu, cpu50s, cpu99s)):
                values.sort()
                p50.append(values[len(values) // 2])
                p99.append(values[int(len(values) * 0.99) - 1])
        results[n_chars] = {"p50_ms": p50s, "p99_ms": p99s, "cpu_p50_ms": cpu50s, "cpu_p99_ms": cpu99s}
        # Wall time includes the scheduler's preemptions on a busy machine; the thread's CPU time does not.
        print(
            f"input chain, {n_chars:>5} chars: wall p50 {_fmt(p50s)} ms, p99 {_fmt(p99s)} ms; "
            f"thread CPU p50 {_fmt(cpu50s)} ms, p99 {_fmt(cpu99s)} ms ({iterations} calls/round)"
        )
    return results


def bench_quality() -> dict:
    from safety.chain import chain_run

    rows = labelled()
    tp = fp = fn = 0
    by_kind: dict[str, list[int]] = {}
    misses = []
    for row in rows:
        flagged = chain_run(text=row["text"], stage="input").flagged
        hit = by_kind.setdefault(row["kind"], [0, 0])
        hit[0] += flagged == row["flagged"]
        hit[1] += 1
        if flagged and row["flagged"]:
            tp += 1
        elif flagged:
            fp += 1
            misses.append(("false positive", row["text"][:70]))
        elif row["flagged"]:
            fn += 1
            misses.append(("missed", row["text"][:70]))
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    print(
        f"labelled set ({len(rows)} texts, {LABELLED.name}): precision {precision:.3f}, recall {recall:.3f}"
    )
    for kind, (right, total) in sorted(by_kind.items()):
        print(f"  {kind:<11} {right}/{total} judged right")
    for what, text in misses:
        print(f"  {what}: {text!r}")
    return {"precision": precision, "recall": recall, "tp": tp, "fp": fp, "fn": fn}


def _decode_round(
    engine, prompts: list[list[int]], *, moderate: bool, max_new_tokens: int
) -> tuple[float, int]:
    from inference.engine import SamplingParams, TokenEvent
    from safety.streaming import OutputMonitor

    tokens = [0] * len(prompts)
    checks = [0] * len(prompts)
    check_cpu = [0.0] * len(prompts)
    handles = []

    def consume(i: int, handle) -> None:
        monitor = OutputMonitor(tier=None) if moderate else None
        parts = []
        for event in handle.events():
            if isinstance(event, TokenEvent):
                parts.append(event.text)
                if monitor is not None:
                    cpu = time.thread_time()
                    if monitor.feed(event.text, len(event.token_ids)) is not None:
                        handle.cancel()
                    check_cpu[i] += time.thread_time() - cpu
            else:
                tokens[i] = event.usage.completion_tokens
                if monitor is not None:
                    cpu = time.thread_time()
                    monitor.finish("".join(parts))
                    check_cpu[i] += time.thread_time() - cpu
                    checks[i] = monitor.checks + 1

    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True)
        handles.append(
            engine.submit(prompt, params, request_id=f"bench-{moderate}-{i}-{time.monotonic_ns()}")
        )
    threads = [threading.Thread(target=consume, args=(i, h)) for i, h in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    return sum(tokens) / elapsed, sum(checks), sum(check_cpu) / elapsed


def bench_decode(rounds: int, n: int, max_new_tokens: int) -> dict:
    from django.conf import settings

    from inference.engine import LLMEngine
    from inference.registry import engine_config, model_spec

    engine = LLMEngine.from_spec(model_spec(), engine_config(), cache_dir=settings.MODEL_CACHE_DIR)
    engine.start()
    try:
        clean = [row["text"] for row in labelled() if not row["flagged"]]
        prompts = [engine.render_chat([{"role": "user", "content": clean[i % len(clean)]}]) for i in range(n)]
        _decode_round(engine, prompts[:4], moderate=False, max_new_tokens=16)  # warm-up (kernels, caches)
        off, on, checks, cpu_share = [], [], [], []
        for _ in range(rounds):
            off.append(_decode_round(engine, prompts, moderate=False, max_new_tokens=max_new_tokens)[0])
            tps, n_checks, share = _decode_round(
                engine, prompts, moderate=True, max_new_tokens=max_new_tokens
            )
            on.append(tps)
            checks.append(n_checks)
            cpu_share.append(100 * share)
    finally:
        engine.shutdown()
    losses = [100 * (a - b) / a for a, b in zip(off, on, strict=True)]
    print(
        f"decode N={n}, {max_new_tokens} tokens each: moderation off {_fmt(off, 1)} tok/s, "
        f"on {_fmt(on, 1)} tok/s, lost {_fmt(losses, 2)} % ({statistics.median(checks):.0f} checks/round; "
        f"their CPU time {_fmt(cpu_share, 2)} % of the round's wall time)"
    )
    return {
        "off_tok_s": off,
        "on_tok_s": on,
        "lost_pct": losses,
        "checks": checks,
        "check_cpu_pct": cpu_share,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*", default=["latency", "quality", "decode"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=2000, help="chain calls per latency round")
    parser.add_argument("--n", type=int, default=32, help="concurrent replies in the decode section")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per reply in the decode section")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    _setup()
    results: dict = {}
    if "latency" in args.sections:
        results["latency"] = bench_latency(args.rounds, args.iterations)
    if "quality" in args.sections:
        results["quality"] = bench_quality()
    if "decode" in args.sections:
        results["decode"] = bench_decode(args.rounds, args.n, args.tokens)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
