"""``manage.py bench_overhead``: what the product adds to the engine, against a running stack (``make run``),
in one run: the bare engine (loaded in this process with the worker's settings), the page path (WebSocket)
and the API path (SSE: the openai SDK, and at one client also a bare HTTP client, ``devtools/bare_http.py``) on
the same prompts and reply length, at 1, 8 and 32 clients, ``--rounds`` rounds
(each round runs every path at every level, so drift of a shared machine's load hits them alike), plus
refusals with the engine saturated and a ``resume`` flood. Prints median [min-max] over rounds for every
goal row of ``docs/overhead.md``. A benchmark that prints figures, not a test.

Engine figures: the bare engine's TTFT and inter-token gaps (its step time as a consumer of its events sees
it) and tok/s; the stack's engine TTFT comes with each reply (``done`` frame, stored reply), so added TTFT is
measured per reply. Refusals: a user whose tier refuses every request at the load gate
(``admit_max_wait_s`` -1) sends ``--refusals`` frames from a process of its own while the 32-client page wave
runs. Flood: ``resume`` of a finished reply, 100 frames/s for 5 s on one socket.

Memory: ``--memory off`` (the default) switches the bench users' memory off, so the stack renders the bare
engine's prompts (one user turn in the chat template) and the goal rows compare the same prompts and
lengths; ``--memory on`` leaves it on as a new account has it: each reply then also waits for recall and
prefills the turns it recalled from the users' earlier waves (often 100-200 more prompt tokens), the
feature's own cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections import Counter

from django.core.management.base import BaseCommand, CommandError

from devtools import overhead_bench as bench
from devtools.bench_figures import gaps as _gaps
from devtools.bench_figures import median_range, tps
from devtools.bench_figures import pct as _pct
from devtools.reply_stages import percentile

TIER = "bench-overhead"
REFUSED_TIER = "bench-refused"


class Command(BaseCommand):
    help = "Bare engine vs the full stack (page and API paths) at 1/8/32 clients; median [min-max] per goal."

    def add_arguments(self, parser):
        parser.add_argument("--origin", default="http://127.0.0.1:8000")
        parser.add_argument("--clients", default="1,8,32")
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--max-tokens", type=int, default=32)
        parser.add_argument("--samples", type=int, default=8, help="replies per level and round, at least")
        parser.add_argument("--refusals", type=int, default=20)
        parser.add_argument("--flood-rate", type=float, default=100.0)
        parser.add_argument("--flood-seconds", type=float, default=5.0)
        parser.add_argument("--skip-api", action="store_true")
        parser.add_argument(
            "--memory",
            choices=("off", "on"),
            default="off",
            help="the bench users' memory: off renders the bare engine's prompts; on adds recall's wait and "
            "the recalled turns to every reply",
        )
        parser.add_argument(
            "--only",
            choices=("all", "refusals", "engine"),
            default="all",
            help="refusals: only page waves at the top level with the refusal prober running through them (no "
            "bare engine, API or flood); engine: only the bare engine's waves (tok/s, TTFT), no stack needed",
        )

    def handle(self, *args, **o):
        import logging

        for noisy in ("httpx", "openai"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        levels = [int(x) for x in o["clients"].split(",")]
        if o["rounds"] < 1 or min(levels) < 1:
            raise CommandError("--rounds and --clients must be >= 1")
        origin = o["origin"].rstrip("/")
        self.ws_url = origin.replace("http", "ws", 1) + "/ws/chat/"
        self.origin, self.api_url = origin, origin + "/v1"
        load_before = open("/proc/loadavg").read().split()[:3]
        self.started_at = time.gmtime()
        if o["only"] != "all":
            return self.handle_only(o, levels, load_before)
        cookies, refused_cookie, api_user, api_key, key = self.prepare(
            max(levels), o["max_tokens"], o["memory"]
        )
        engine = self.load_engine()
        from conversations.reply_runner import sampling_for

        sampling = sampling_for(max_new_tokens=o["max_tokens"])
        per_round = []
        try:
            # Warm-up, not counted: first connections, the pools, the first prefill of each path.
            bench.engine_wave(engine, 1, sampling, round_index=-1)
            asyncio.run(bench.page_wave(cookies[:1], self.ws_url, self.origin))
            if not o["skip_api"]:
                self.api_wave(key, 1, o["max_tokens"])
            for r in range(o["rounds"]):
                rows: dict = {}
                for n in levels:
                    waves = max(1, math.ceil(o["samples"] / n))
                    rows[("engine", n)] = [
                        bench.engine_wave(engine, n, sampling, round_index=r) for _ in range(waves)
                    ]
                    refusals = self.prober(refused_cookie, o["refusals"]) if n == max(levels) else None
                    rows[("page", n)] = [
                        asyncio.run(bench.page_wave(cookies[:n], self.ws_url, self.origin))
                        for _ in range(waves)
                    ]
                    if refusals is not None:
                        rows["refusals"] = refusals.finish()
                    if not o["skip_api"]:
                        rows[("api", n)] = [self.api_wave(key, n, o["max_tokens"]) for _ in range(waves)]
                        if n == 1:  # the same without a client library (devtools/bare_http.py)
                            rows[("api-bare", n)] = [
                                self.api_wave(key, n, o["max_tokens"], True) for _ in range(waves)
                            ]
                rows["flood"] = self.flood(cookies[0], o["flood_rate"], o["flood_seconds"])
                per_round.append(rows)
                self.stderr.write(f"round {r + 1}/{o['rounds']} done")
        finally:
            engine.shutdown()
            api_key.delete()
            self.cleanup(api_user)
        load_after = open("/proc/loadavg").read().split()[:3]
        self.report(per_round, levels, o, load_before, load_after)

    def handle_only(self, o, levels, load_before):
        """``--only refusals|engine``: one part of the run, ``--rounds`` times; prints median [min-max]."""
        w = self.stdout.write
        per_round = []
        if o["only"] == "engine":
            from conversations.reply_runner import sampling_for

            engine = self.load_engine()
            sampling = sampling_for(max_new_tokens=o["max_tokens"])
            try:
                bench.engine_wave(engine, 1, sampling, round_index=-1)
                for r in range(o["rounds"]):
                    per_round.append(
                        {n: [bench.engine_wave(engine, n, sampling, round_index=r)] for n in levels}
                    )
            finally:
                engine.shutdown()
            rows = [(f"tok/s, bare engine, {n} clients", [tps(x[n]) for x in per_round]) for n in levels]
            rows += [
                (
                    f"bare engine TTFT, {n} clients, p50 ms",
                    [_pct(x[n][0].streams, "ttft_ms", 50) for x in per_round],
                )
                for n in levels
            ]
        else:
            top = max(levels)
            cookies, refused_cookie, api_user, api_key, _ = self.prepare(top, o["max_tokens"], o["memory"])
            try:
                asyncio.run(bench.page_wave(cookies[:1], self.ws_url, self.origin))
                for _ in range(o["rounds"]):
                    prober = self.prober(refused_cookie, o["refusals"])
                    waves = [asyncio.run(bench.page_wave(cookies, self.ws_url, self.origin))]
                    while prober.running():  # keep the engine saturated until the last refusal
                        waves.append(asyncio.run(bench.page_wave(cookies, self.ws_url, self.origin)))
                    per_round.append({"refusals": prober.finish(), "waves": waves})
                    self.stderr.write(
                        f"refusal ms, in order: {[round(t, 1) for t in per_round[-1]['refusals']]}"
                    )
            finally:
                api_key.delete()
                self.cleanup(api_user)
            rows = [
                ("refusal p50 ms", [percentile(x["refusals"], 50) for x in per_round]),
                ("refusal p99 ms", [percentile(x["refusals"], 99) for x in per_round]),
                ("refusals per round", [len(x["refusals"]) for x in per_round]),
                (f"page waves of {top} clients per round", [len(x["waves"]) for x in per_round]),
                (f"tok/s, page path, {top} clients", [tps(x["waves"]) for x in per_round]),
            ]
            for q in (50, 99):
                added = [_pct([s for wv in x["waves"] for s in wv.streams], "added_ms", q) for x in per_round]
                rows.append((f"added TTFT, page path, {top} clients, p{q} ms", added))
        load_after = open("/proc/loadavg").read().split()[:3]
        w(
            f"bench_overhead --only {o['only']}: {o['rounds']} rounds, levels {levels}; memory {o['memory']}; {os.cpu_count()} CPUs; "
            f"load average before {' '.join(load_before)}, after {' '.join(load_after)}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        w("| measure | median [min-max] over rounds |")
        w("|---|---|")
        for name, values in rows:
            w(f"| {name} | {median_range(values, '{:.1f}')} |")

    # --- set-up ------------------------------------------------------------------------------------------------

    def prepare(self, clients: int, max_tokens: int, memory: str = "off"):
        from accounts.models import User
        from accounts.sessions import session_cookie_for
        from api.services import api_key_create
        from devtools.bench_tiers import bench_tier
        from memory.models import AccountMemory

        bench.vacuum_reply_tables()
        tier = bench_tier(TIER, display_name="Overhead bench", max_tokens=max_tokens)
        refused = bench_tier(REFUSED_TIER, display_name="Refused", max_tokens=max_tokens, admit_max_wait_s=-1)

        def user(name, t):
            u, _ = User.objects.get_or_create(username=name, defaults={"tier": t})
            if u.tier_id != t.id:
                u.tier = t
                u.save(update_fields=["tier"])
            AccountMemory.objects.update_or_create(user=u, defaults={"enabled": memory == "on"})
            return u

        cookies = [session_cookie_for(user(f"{TIER}-{i}", tier)) for i in range(clients)]
        refused_cookie = session_cookie_for(user(REFUSED_TIER, refused))
        api_user = user(f"{TIER}-api", tier)
        api_key, key = api_key_create(user=api_user, name="bench_overhead")
        return cookies, refused_cookie, api_user, api_key, key

    @contextlib.contextmanager
    def signed_in(self, clients: int, max_tokens: int):
        """The session cookies of ``clients`` bench users (:meth:`prepare`, memory off), for a command that needs
        only those (``bench_burst``, ``bench_connect``); their API key and conversations are deleted on exit."""
        cookies, _, api_user, api_key, _ = self.prepare(clients, max_tokens)
        try:
            yield cookies
        finally:
            api_key.delete()
            self.cleanup(api_user)

    def load_engine(self):
        from django.conf import settings

        from inference.engine import LLMEngine
        from inference.registry import engine_config, model_spec

        engine = LLMEngine.from_spec(model_spec(), engine_config(), settings.MODEL_CACHE_DIR)
        engine.start()
        return engine

    def cleanup(self, api_user):
        from django.db import OperationalError

        from conversations.models import Conversation

        for attempt in range(5):  # the embeddings worker may still be indexing the last turns (deadlock)
            try:
                Conversation.objects.filter(owner__username__startswith=TIER).delete()
                Conversation.objects.filter(owner__username=REFUSED_TIER).delete()
                return
            except OperationalError:
                if attempt == 4:
                    raise
                time.sleep(2)

    # --- paths -------------------------------------------------------------------------------------------------

    def api_wave(self, key: str, n: int, max_tokens: int, bare: bool = False):
        from django.conf import settings

        from conversations.models import Message

        model = settings.INFERENCE_DEFAULT_MODEL
        if bare:
            wave, ids = asyncio.run(bench.bare_api_wave(self.origin, key, model, n, max_tokens))
        else:
            wave, ids = asyncio.run(bench.api_wave(self.api_url, key, model, n, max_tokens))
        stored = dict(Message.objects.filter(pk__in=ids).values_list("id", "ttft_ms"))
        for stream, message_id in zip(wave.streams, ids, strict=True):
            stream.engine_ttft_ms = stored.get(message_id)
        return wave

    def prober(self, cookie: str, count: int) -> bench.RefusalProber:
        try:
            return bench.RefusalProber(self.ws_url, self.origin, cookie, count)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc

    def flood(self, cookie: str, rate: float, seconds: float) -> dict:
        from conversations.models import Message

        finished = (
            Message.objects.filter(
                conversation__owner__username=f"{TIER}-0", role="assistant", status="completed"
            )
            .order_by("-id")
            .first()
        )
        if finished is None:
            return {}
        return asyncio.run(
            bench.resume_flood(self.ws_url, self.origin, cookie, finished.id, rate=rate, seconds=seconds)
        )

    # --- report ------------------------------------------------------------------------------------------------

    def report(self, per_round, levels, o, load_before, load_after):
        w = self.stdout.write
        w(
            f"bench_overhead: {o['rounds']} rounds, {o['max_tokens']}-token replies, levels {levels}; "
            f"memory {o['memory']}; {os.cpu_count()} CPUs; load average before {' '.join(load_before)}, after {' '.join(load_after)}"
        )

        def flat(rows, key):
            return [s for wave in rows.get(key, []) for s in wave.streams]

        w("| measure | goal | median [min-max] over rounds |")
        w("|---|---|---|")
        for n in levels:
            for path in ("page", "api", "api-bare"):
                if path != "page" and o["skip_api"] or (path, n) not in per_round[0]:
                    continue
                p50 = [_pct(flat(rows, (path, n)), "added_ms", 50) for rows in per_round]
                p99 = [_pct(flat(rows, (path, n)), "added_ms", 99) for rows in per_round]
                goal = "p50 < 15, p99 < 40" if n == 1 else ("p50 < 50" if n == 32 else "-")
                label = {"page": "page path", "api": "API path", "api-bare": "API path, bare HTTP client"}[
                    path
                ]
                w(f"| added TTFT, {label}, {n} clients, p50 ms | {goal} | {median_range(p50, '{:.1f}')} |")
                w(f"| added TTFT, {label}, {n} clients, p99 ms | | {median_range(p99, '{:.1f}')} |")
            eng = [_pct(flat(rows, ("engine", n)), "ttft_ms", 50) for rows in per_round]
            w(f"| bare engine TTFT, {n} clients, p50 ms | | {median_range(eng, '{:.1f}')} |")
            stack = [_pct(flat(rows, ("page", n)), "engine_ttft_ms", 50) for rows in per_round]
            w(f"| stack's engine TTFT (page), {n} clients, p50 ms | | {median_range(stack, '{:.1f}')} |")
            # What a user waits for in all, against the bare engine at the same concurrency (docs/overhead.md).
            client = [_pct(flat(rows, ("page", n)), "ttft_ms", 50) for rows in per_round]
            w(f"| client TTFT, page path, {n} clients, p50 ms | | {median_range(client, '{:.1f}')} |")
            vs = [c / e if e else float("nan") for c, e in zip(client, eng, strict=True)]
            w(f"| client TTFT page / bare engine TTFT, {n} clients, p50 | | {median_range(vs, '{:.2f}')} |")
            bare_tps = [tps(rows.get(("engine", n), [])) for rows in per_round]
            page_tps = [tps(rows.get(("page", n), [])) for rows in per_round]
            w(f"| tok/s, bare engine, {n} clients | | {median_range(bare_tps)} |")
            w(f"| tok/s, page path, {n} clients | | {median_range(page_tps)} |")
            ratio = [p / b if b else float("nan") for p, b in zip(page_tps, bare_tps, strict=True)]
            goal = ">= 0.9" if n == 32 else "-"
            w(f"| tok/s page / bare, {n} clients | {goal} | {median_range(ratio, '{:.2f}')} |")
            gaps_page = [percentile(_gaps(flat(rows, ("page", n))), 99) for rows in per_round]
            gaps_bare = [percentile(_gaps(flat(rows, ("engine", n))), 99) for rows in per_round]
            w(
                f"| inter-token gap p99, page client, {n} clients, ms | | {median_range(gaps_page, '{:.1f}')} |"
            )
            w(
                f"| engine step (inter-token gap) p99, bare, {n} clients, ms | | {median_range(gaps_bare, '{:.1f}')} |"
            )
            gr = [p / b if b else float("nan") for p, b in zip(gaps_page, gaps_bare, strict=True)]
            goal = "<= 1.5" if n == 32 else "-"
            w(f"| gap p99 page / engine step p99, {n} clients | {goal} | {median_range(gr, '{:.2f}')} |")
            if n > 1:  # the same once every reply of the wave streams: the relay without the burst's arrival
                steady = [
                    bench.steady_gap_ratio(rows.get(("page", n), []), rows.get(("engine", n), []))
                    for rows in per_round
                ]
                w(
                    f"| gap p99 page / engine step p99 once all {n} stream (after the last first token) | | "
                    f"{median_range(steady, '{:.2f}')} |"
                )
        ref = [percentile(rows.get("refusals", []), 99) for rows in per_round]
        ref50 = [percentile(rows.get("refusals", []), 50) for rows in per_round]
        counts = [len(rows.get("refusals", [])) for rows in per_round]
        w(
            f"| refusal p50, engine saturated ({max(levels)} page clients), ms | | {median_range(ref50, '{:.1f}')} |"
        )
        w(
            f"| refusal p99, engine saturated, ms ({median_range(counts)} refusals/round) | < 100 | {median_range(ref, '{:.1f}')} |"
        )
        floods = [rows.get("flood") or {} for rows in per_round]
        answered = [f.get("answered", 0) / f["sent"] if f.get("sent") else float("nan") for f in floods]
        f99 = [percentile(f.get("latencies_ms", []), 99) for f in floods]
        w(
            f"| resume flood {o['flood_rate']:.0f}/s x {o['flood_seconds']:.0f} s: answered share | 1.0 | {median_range(answered, '{:.2f}')} |"
        )
        w(f"| resume flood: answer p99 ms | < 250 | {median_range(f99, '{:.1f}')} |")
        w(f"resume flood answers by kind, per round: {[f.get('kinds') for f in floods]}")
        errors = sorted(
            {
                s.error
                for rows in per_round
                for k, v in rows.items()
                if isinstance(k, tuple)
                for wv in v
                for s in wv.streams
                if s.error
            }
        )
        failed = Counter(
            "-".join(map(str, k))
            for rows in per_round
            for k, v in rows.items()
            if isinstance(k, tuple)
            for wv in v
            for s in wv.streams
            if not s.ok
        )
        w(
            f"replies not completed: {sum(failed.values())}{' ' + str(dict(failed)) if failed else ''}; error codes: {errors or 'none'}; started {time.strftime('%Y-%m-%d %H:%M UTC', self.started_at)}, ended {time.strftime('%H:%M UTC', time.gmtime())}"
        )
