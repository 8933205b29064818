"""Memory benchmark: embedding throughput, retrieval latency per store backend, the TTFT retrieval adds,
and recall@5 quality. A development tool, not a test: it prints median [min-max] over rounds.

    # embedding throughput (chunks/s), chat engine idle and busy (no database needed)
    python -m devtools.memory_bench embed [--rounds 3] [--chunks 512]
    # retrieval p50/p99 at 1k, 10k, 100k chunks of one user, on the backend of DATABASE_URL's database;
    # --ttft also runs an embeddings worker and times the whole recall step at 10k chunks
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/chatsite_membench \\
        python -m devtools.memory_bench retrieval [--sizes 1000,10000,100000] [--ttft]
    # recall@5 on the needle set and on a labelled set (CPython's Language Reference topics)
    DATABASE_URL=... python -m devtools.memory_bench quality

``retrieval`` and ``quality`` create the database named in DATABASE_URL when missing and migrate it; for
the pgvector backend point DATABASE_URL at a server with the extension, e.g. the test one:
``postgres://postgres@%2Ftmp%2Fchatsite-pgvector/chatsite_membench``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TURN = (
    "User: I'm planning a {n}-day trip and want a relaxed pace, mostly food and museums, any tips?\n"
    "Assistant: For {n} days, pick one neighbourhood a day, book the big museum early, and leave "
    "afternoons free for markets and long lunches."
)


def fmt(values: list[float], unit: str = "", digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f}{unit} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


# --- embed --------------------------------------------------------------------------------------------


def _engine_load(seconds: float) -> None:
    """Keep the default chat engine busy for ``seconds``: 8 concurrent 128-token replies, resubmitted."""
    import django

    django.setup()
    from django.conf import settings

    from inference.engine import LLMEngine, SamplingParams
    from inference.registry import engine_config, model_spec

    engine = LLMEngine.from_spec(model_spec(), engine_config(), settings.MODEL_CACHE_DIR)
    engine.start()
    prompt = engine.render_chat([{"role": "user", "content": "Tell me a long story about a lighthouse."}])
    params = SamplingParams(temperature=0.0, max_new_tokens=128, ignore_eos=True)
    print("engine busy", flush=True)
    deadline = time.monotonic() + seconds
    handles = [engine.submit(prompt, params) for _ in range(8)]
    while time.monotonic() < deadline:
        for i, h in enumerate(handles):
            for _ev in h.events():
                pass
            handles[i] = engine.submit(prompt, params)
    engine.shutdown()


def bench_embed(args) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from memory.batching import EmbeddingBatcher
    from memory.embedding import Embedder

    embedder = Embedder(num_threads=args.threads)  # as the worker runs it (EMBEDDINGS_NUM_THREADS)
    batcher = EmbeddingBatcher(embedder.encode, max_batch=64, max_wait_s=0.005)
    texts = [TURN.format(n=i) for i in range(args.chunks)]
    tasks = [texts[i : i + 32] for i in range(0, len(texts), 32)]  # as memory.embed_chunks tasks carry them
    batcher.submit(texts[:64]).result()  # warm-up

    def one_round() -> float:
        started = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:  # the worker's task threads
            list(pool.map(lambda t: batcher.submit(t).result(), tasks))
        return len(texts) / (time.perf_counter() - started)

    idle = [one_round() for _ in range(args.rounds)]
    print(f"embedding throughput ({args.threads} thread), chat engine idle: {fmt(idle, ' chunks/s')}")
    load = subprocess.Popen(
        [sys.executable, "-m", "devtools.memory_bench", "_engine_load", "--seconds", "600"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert load.stdout.readline().strip() == "engine busy", "the chat engine did not start"
        time.sleep(3)
        busy = [one_round() for _ in range(args.rounds)]
    finally:
        load.terminate()
        load.wait(30)
    print(
        f"embedding throughput ({args.threads} thread), chat engine busy (8 replies decoding): {fmt(busy, ' chunks/s')}"
    )
    batcher.stop()


# --- database set-up ----------------------------------------------------------------------------------


def setup_database() -> None:
    """Create DATABASE_URL's database when missing, set up Django and migrate it."""
    import environ
    import psycopg

    cfg = environ.Env.db_url_config(os.environ["DATABASE_URL"])
    from urllib.parse import unquote

    host = unquote(cfg.get("HOST") or "") or None
    conninfo = {"dbname": "postgres", "user": cfg.get("USER") or "postgres", "host": host}
    if cfg.get("PORT"):
        conninfo["port"] = cfg["PORT"]
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [cfg["NAME"]]).fetchone():
            conn.execute(f'CREATE DATABASE "{cfg["NAME"]}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def bench_user(name: str):
    from django.contrib.auth import get_user_model

    from billing.services import tiers_ensure
    from memory.models import Chunk

    tiers_ensure()
    user, _ = get_user_model().objects.get_or_create(username=name)
    Chunk.objects.filter(user=user).delete()
    return user


def unit_vectors(rng, n: int) -> np.ndarray:
    v = rng.standard_normal((n, 384)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def load_chunks(store, user, vectors: np.ndarray, first: int) -> list[int]:
    """Insert ``len(vectors)`` chunks of ``user`` with these vectors; returns their ids."""
    from django.db import connection

    from memory.models import Chunk
    from memory.store import pgvector
    from memory.store.base import to_stored

    ids: list[int] = []
    rebuild = store.name == "pgvector"
    if rebuild:  # bulk load without the HNSW index, then build it once (pgvector's own advice)
        with connection.cursor() as c:
            c.execute(f"DROP INDEX IF EXISTS {pgvector.TABLE}_hnsw_idx")
    for start in range(0, len(vectors), 5000):
        part = vectors[start : start + 5000]
        rows = Chunk.objects.bulk_create(
            [
                Chunk(
                    user=user,
                    source_kind="turn",
                    source_id=first + start + i,
                    text=TURN.format(n=first + start + i),
                    embedding=to_stored(v),
                    embedding_model="bench",
                )
                for i, v in enumerate(part)
            ]
        )
        if rebuild:
            store.add_index_rows([(r.pk, user.pk, part[i]) for i, r in enumerate(rows)])
        ids += [r.pk for r in rows]
    if rebuild:
        with connection.cursor() as c:
            c.execute("SET maintenance_work_mem = '512MB'")
            c.execute(
                f"CREATE INDEX {pgvector.TABLE}_hnsw_idx ON {pgvector.TABLE} USING hnsw (embedding vector_cosine_ops)"
                f" WITH (m = {pgvector.HNSW_M}, ef_construction = {pgvector.HNSW_EF_CONSTRUCTION})"
            )
            c.execute(f"ANALYZE {pgvector.TABLE}")
    with connection.cursor() as c:
        # As autovacuum would after a while: the visibility map lets the exact store's check be index-only.
        c.execute("VACUUM ANALYZE memory_chunk")
    return ids


# --- retrieval ----------------------------------------------------------------------------------------


def bench_retrieval(args) -> None:
    setup_database()
    from memory.selectors import chunks_search
    from memory.store import SearchFilter, store_for, store_reset

    store = store_for()
    rng = np.random.default_rng(0)
    user = bench_user("membench")
    bench_user("membench-other")  # a second user's rows share the table
    sizes = [int(s) for s in args.sizes.split(",")]
    all_vectors = unit_vectors(rng, max(sizes))
    print(f"backend {store.name}; vectors: random unit vectors (384-d); k=4; {args.queries} queries a round")
    held = 0
    for size in sizes:
        load_chunks(store, user, all_vectors[held:size], held)
        held = size
        p50s, p99s, recalls, colds = [], [], [], []
        for _round in range(args.rounds):
            store_reset()  # the first search of a round reads the user's vectors from PostgreSQL
            picks = rng.integers(0, size, args.queries)
            queries = all_vectors[picks] + 0.3 * unit_vectors(rng, args.queries) / np.sqrt(1)
            queries /= np.linalg.norm(queries, axis=1, keepdims=True)
            times, hit = [], 0
            exact_scores = queries @ all_vectors[:size].T
            flt = SearchFilter(exclude_message_ids=tuple(range(1, 21)))  # a 20-message window, as a reply has
            for q, scores in zip(queries, exact_scores, strict=True):
                started = time.perf_counter()
                found = chunks_search(user_id=user.pk, vector=q, k=4, flt=flt)
                times.append((time.perf_counter() - started) * 1000)
                best = set(np.argsort(-scores)[:4].tolist())
                got = {f.chunk.source_id for f in found}
                hit += len(best & got)
            colds.append(times[0])
            times.sort()
            p50s.append(times[len(times) // 2])
            p99s.append(times[min(len(times) - 1, int(len(times) * 0.99))])
            recalls.append(hit / (4 * args.queries))
        print(
            f"{store.name} {size:>7} chunks: p50 {fmt(p50s, ' ms', 2)}  p99 {fmt(p99s, ' ms', 2)}  "
            f"recall@4 vs exact {fmt(recalls, '', 3)}  first search of a process {fmt(colds, ' ms', 1)}"
        )
        if args.ttft and size == 10000:
            bench_recall_step(user)


def bench_recall_step(user) -> None:
    """Time memory_context at the current size, as a reply's worker runs it before prefill: (a) the
    question embedded by a real embeddings worker in a round trip, (b) the question prefetched when the
    reply was queued and already answered (the reply's dispatch took longer than the embedding). The
    added TTFT of a reply lies between the two."""
    from memory.query import question_embed, question_key, question_prefetch, redis_client
    from memory.recall import memory_context

    env = {**os.environ, "EMBEDDINGS_METRICS_PORT": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "memory.worker", "worker", "--pool", "threads",
         "--concurrency", "4", "-Q", "embeddings.query,embeddings", "-n", f"embeddings-bench-{os.getpid()}@%h",
         "--loglevel", "WARNING"],
        cwd=ROOT, env=env, start_new_session=True,
    )  # fmt: skip

    def step(i: int) -> float:
        started = time.perf_counter()
        memory_context(
            user_id=user.pk,
            conversation_id=None,
            question=f"What did I plan for the {i}-day trip?",
            window_message_ids=list(range(1, 21)),
            budget_tokens=512,
            count_tokens=lambda s: len(s) // 4,
            min_score=-1.0,
            timeout_s=5,
        )
        return (time.perf_counter() - started) * 1000

    try:
        deadline = time.monotonic() + 120
        while question_embed(text="warm-up", timeout_s=2) is None:
            assert time.monotonic() < deadline, "the embeddings worker did not answer"
        for label, prefetched in (
            ("question embedded in a round trip", False),
            ("question prefetched", True),
        ):
            rounds = []
            for _r in range(3):
                times = []
                for i in range(50):
                    text = f"What did I plan for the {i}-day trip?"
                    key = question_key(user_id=user.pk, text=text)
                    redis_client().delete(key, f"{key}:asked")  # no vector left from the round before
                    if prefetched:
                        question_prefetch(user_id=user.pk, text=text, at_once=True)
                        while not redis_client().llen(key):
                            time.sleep(0.002)
                    times.append(step(i))
                times.sort()
                rounds.append(times[len(times) // 2])
            print(f"  recall step before prefill, {label}: p50 {fmt(rounds, ' ms', 1)}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    parser = argparse.ArgumentParser(
        prog="python -m devtools.memory_bench", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("embed")
    e.add_argument("--rounds", type=int, default=3)
    e.add_argument("--chunks", type=int, default=512)
    e.add_argument("--threads", type=int, default=1, help="torch threads, as EMBEDDINGS_NUM_THREADS")
    r = sub.add_parser("retrieval")
    r.add_argument("--sizes", default="1000,10000,100000")
    r.add_argument("--queries", type=int, default=200)
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--ttft", action="store_true")
    sub.add_parser("quality")
    load = sub.add_parser("_engine_load")
    load.add_argument("--seconds", type=float, default=600)
    args = parser.parse_args(argv)
    if args.command == "embed":
        bench_embed(args)
    elif args.command == "retrieval":
        bench_retrieval(args)
    elif args.command == "quality":
        from devtools.memory_quality import bench_quality

        bench_quality(args)
    else:
        _engine_load(args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
