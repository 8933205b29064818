"""``manage.py overload``: drive many free and paid WebSocket clients against the running stack at several
times its capacity and print, per tier, what admission control did (a load script, not a test).

Phases: first ``--paid`` paid clients alone (the baseline paid TTFT), then the same paid clients together
with ``--free`` free clients (the overload). Every client loops for ``--duration`` seconds: it sends a
prompt in a new conversation, waits for ``queued`` or ``error``; on a refusal (``busy``/``no_workers``...)
it records the refusal latency (send -> error frame) and sends again after ``--retry-s`` seconds (shorter
than the page's backoff, to keep the pressure on); once queued it waits for the first ``token`` (TTFT) and
``done``. Afterwards it waits up to ``--drain`` seconds and counts, in PostgreSQL, user messages whose reply
never reached a final state (**stuck**) or has no reply at all (**lost**), plus sends that got neither
``queued`` nor ``error`` within ``--ack-timeout`` (**unanswered**).

The free clients run in a process of their own (``--one-process``: all in this one), so the paid clients'
token streams do not delay the loop that times the refusals; each process probes its loop's lag, and the
web process's own refusal timing (``chatsite:websocket_refusal_seconds`` from ``--metrics-url``, frame in ->
error frame out) is printed beside the client's (``devtools/overload_clients.py``).

The clients are users of two dedicated tiers, ``overload-free`` / ``overload-paid``, copies of ``free`` /
``paid`` (same priority, thresholds and model) with rate and quota limits lifted and ``--max-tokens`` as the
reply limit, so what refuses requests is the load, not a per-user limit. Start the stack first (``make
run``); this command only talks to it over ws:// and reads the database.
"""

import json
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from accounts.models import User
from accounts.sessions import session_cookie_for
from billing.models import Tier
from conversations.models import Message
from devtools import overload_clients as clients
from devtools.management.commands.loadtest import percentile

FINAL = {"completed", "cancelled", "failed", "interrupted"}


class Command(BaseCommand):
    help = "Overload the running stack with free + paid WebSocket clients; print admission figures per tier."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="ws://127.0.0.1:8000/ws/chat/")
        parser.add_argument("--origin", default="http://127.0.0.1:8000")
        parser.add_argument("--free", type=int, default=60, help="free clients")
        parser.add_argument("--paid", type=int, default=6, help="paid clients")
        parser.add_argument("--duration", type=float, default=60.0, help="seconds each phase sends")
        parser.add_argument("--max-tokens", type=int, default=48, help="reply limit of both load tiers")
        parser.add_argument("--retry-s", type=float, default=1.0, help="pause after a refusal")
        parser.add_argument(
            "--ack-timeout", type=float, default=10.0, help="seconds to wait for queued/error"
        )
        parser.add_argument("--reply-timeout", type=float, default=300.0, help="seconds to wait for done")
        parser.add_argument("--drain", type=float, default=120.0, help="seconds to wait for stragglers")
        parser.add_argument("--skip-baseline", action="store_true", help="skip the paid-alone phase")
        parser.add_argument("--json", dest="json_path", help="also write the raw results here")
        parser.add_argument("--one-process", action="store_true", help="free and paid clients on one loop")
        parser.add_argument("--metrics-url", help="the web process's /metrics (default: ORIGIN/metrics)")

    def handle(self, *args, **o):
        if o["free"] < 0 or o["paid"] < 1 or o["duration"] <= 0:
            raise CommandError("--paid >= 1, --free >= 0 and --duration > 0 are required")
        run_started = time.time()
        users = self.prepare_users(o["free"], o["paid"], o["max_tokens"])
        baseline = []
        if not o["skip_baseline"]:
            baseline, _ = self.run_phase([], users["paid"], o)
            self.wait_drained(users, o["drain"])
        metrics_url = o["metrics_url"] or f"{o['origin']}/metrics"
        server_before = clients.server_refusal_histogram(metrics_url)
        mixed, lags = self.run_phase(users["free"], users["paid"], o)
        server_after = clients.server_refusal_histogram(metrics_url)
        self.wait_drained(users, o["drain"])
        lost, stuck = self.lost_and_stuck(users, since=run_started)
        table = self.summarize(mixed, baseline, lost, stuck)
        table["measurement"] = self.measurement(lags, server_before, server_after)
        self.print_table(table, o)
        if o["json_path"]:
            with open(o["json_path"], "w") as fh:
                json.dump({"table": table, "mixed": mixed, "baseline": baseline}, fh, indent=2, default=str)

    # --- set-up ---------------------------------------------------------------------------------------------

    def load_tier(self, name: str, template: str, max_tokens: int) -> Tier:
        base = Tier.objects.get(name=template)
        values = {
            f.name: getattr(base, f.name) for f in Tier._meta.concrete_fields if f.name not in ("id", "name")
        }
        values.update(
            display_name=f"Overload {template}",
            requests_per_minute=100_000,
            tokens_per_day=1_000_000_000,
            max_reply_tokens=max_tokens,
            max_concurrent_generations=1,
        )
        tier, _ = Tier.objects.update_or_create(name=name, defaults=values)
        return tier

    def prepare_users(self, free: int, paid: int, max_tokens: int) -> dict[str, list[tuple[str, str, int]]]:
        """``{"free": [(tier, cookie, user_id)], "paid": [...]}`` with a logged-in session per client."""
        out: dict[str, list] = {"free": [], "paid": []}
        for label, count in (("free", free), ("paid", paid)):
            tier = self.load_tier(f"overload-{label}", label, max_tokens)
            for i in range(count):
                user, _ = User.objects.get_or_create(
                    username=f"overload-{label}-{i}", defaults={"tier": tier}
                )
                if user.tier_id != tier.id:
                    user.tier = tier
                    user.save(update_fields=["tier"])
                out[label].append((label, session_cookie_for(user), user.pk))
        return out

    # --- the clients ----------------------------------------------------------------------------------------

    def run_phase(self, free, paid, o) -> tuple[list[dict], dict[str, list[float]]]:
        """Both groups until ``--duration`` from now; ``(results, {process: loop lags in ms})``. The free
        clients run in a forked process unless ``--one-process`` (or there are none)."""
        deadline = time.monotonic() + o["duration"]
        if o["one_process"] or not free:
            results, lags = clients.run_clients(free + paid, 0, deadline, o)
            return results, {"one process": lags}
        connections.close_all()  # the forked child must not share this process's database sockets
        child = clients.run_clients_in_process(free, 0, deadline, o)
        paid_results, paid_lags = clients.run_clients(paid, len(free), deadline, o)
        free_results, free_lags = child.result()
        return free_results + paid_results, {"free process": free_lags, "paid process": paid_lags}

    # --- after the run --------------------------------------------------------------------------------------

    def _replies(self, users):
        ids = [u[2] for group in users.values() for u in group]
        return Message.objects.filter(conversation__owner_id__in=ids, role=Message.Role.ASSISTANT)

    def wait_drained(self, users, drain_s: float) -> None:
        end = time.monotonic() + drain_s
        while (
            time.monotonic() < end
            and self._replies(users).filter(status__in=Message.ACTIVE_STATUSES).exists()
        ):
            time.sleep(1)

    def lost_and_stuck(self, users, *, since: float) -> tuple[dict, dict]:
        """Per tier: user messages of this run without a reply (lost), replies not in a final state (stuck)."""
        from datetime import UTC, datetime

        started = datetime.fromtimestamp(since, tz=UTC)
        lost, stuck = {}, {}
        for label, group in users.items():
            ids = [u[2] for u in group]
            mine = Message.objects.filter(conversation__owner_id__in=ids, created_at__gte=started)
            user_conversations = set(mine.filter(role="user").values_list("conversation_id", flat=True))
            answered = set(mine.filter(role="assistant").values_list("conversation_id", flat=True))
            lost[label] = len(user_conversations - answered)
            stuck[label] = mine.filter(role="assistant").exclude(status__in=FINAL).count()
        return lost, stuck

    def summarize(self, mixed, baseline, lost, stuck) -> dict:
        table = {}
        for tier in ("free", "paid"):
            rs = [r for r in mixed if r["tier"] == tier]
            admitted = [r for r in rs if r["outcome"] == "admitted"]
            refused = [r for r in rs if r["outcome"] == "refused"]
            codes = {}
            for r in refused:
                codes[r["code"]] = codes.get(r["code"], 0) + 1
            refusal = [r["refusal_ms"] for r in refused]
            ttft = [r["ttft_ms"] for r in admitted if "ttft_ms" in r]
            table[tier] = {
                "sends": len(rs),
                "admitted": len(admitted),
                "refused": len(refused),
                "refused_by_code": codes,
                "completed": sum(1 for r in admitted if r.get("status") == "completed"),
                "degraded": sum(1 for r in admitted if r.get("degraded")),
                "refusal_ms": {"p50": percentile(refusal, 50), "p99": percentile(refusal, 99)},
                "ttft_ms": {"p50": percentile(ttft, 50), "p99": percentile(ttft, 99)},
                "unanswered": sum(1 for r in rs if r["outcome"] == "unanswered"),
                "lost": lost.get(tier, 0),
                "stuck": stuck.get(tier, 0),
            }
        alone = [r["ttft_ms"] for r in baseline if "ttft_ms" in r]
        table["paid_alone"] = {
            "admitted": sum(1 for r in baseline if r["outcome"] == "admitted"),
            "refused": sum(1 for r in baseline if r["outcome"] == "refused"),
            "ttft_ms": {"p50": percentile(alone, 50), "p99": percentile(alone, 99)},
        }
        return table

    def measurement(self, lags, server_before, server_after) -> dict:
        """Loop lag of each client process (ms) and the web process's own refusal time (ms) in the mixed
        phase, with the share of refusals it decided from memory."""
        out = {
            f"{name} loop lag ms": {"p50": percentile(v, 50), "p99": percentile(v, 99)}
            for name, v in lags.items()
        }
        p50, n = clients.histogram_quantile(0.50, server_before, server_after)
        p99, _ = clients.histogram_quantile(0.99, server_before, server_after)
        memory = server_after.get("memory", {}).get(float("inf"), 0) - server_before.get("memory", {}).get(
            float("inf"), 0
        )
        out["server refusal ms"] = {"p50": p50, "p99": p99, "count": n, "from memory": int(memory)}
        return out

    def print_table(self, t, o) -> None:
        self.stdout.write(
            f"free clients={o['free']} paid clients={o['paid']} duration={o['duration']} s/phase "
            f"max_tokens={o['max_tokens']} retry={o['retry_s']} s"
        )
        self.stdout.write(
            "| tier | sends | admitted | refused | completed | refusal p50 / p99 ms | TTFT p50 / p99 ms "
            "| unanswered | lost | stuck |"
        )
        self.stdout.write("|---|---|---|---|---|---|---|---|---|---|")
        for tier in ("free", "paid"):
            r = t[tier]
            self.stdout.write(
                f"| {tier} | {r['sends']} | {r['admitted']} | {r['refused']} {r['refused_by_code'] or ''} "
                f"| {r['completed']} | {r['refusal_ms']['p50']:.1f} / {r['refusal_ms']['p99']:.1f} "
                f"| {r['ttft_ms']['p50']:.0f} / {r['ttft_ms']['p99']:.0f} | {r['unanswered']} | {r['lost']} "
                f"| {r['stuck']} |"
            )
        a = t["paid_alone"]
        self.stdout.write(
            f"| paid alone | | {a['admitted']} | {a['refused']} | | | {a['ttft_ms']['p50']:.0f} / "
            f"{a['ttft_ms']['p99']:.0f} | | | |"
        )
        for name, figures in t["measurement"].items():
            extra = "".join(f", {k} {v}" for k, v in figures.items() if k not in ("p50", "p99"))
            self.stdout.write(f"{name}: p50 {figures['p50']:.1f} / p99 {figures['p99']:.1f}{extra}")
