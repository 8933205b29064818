"""``manage.py bench_warm_pass``: what the admission warmer's pass costs a web process, in CPU of the calling
thread (``time.thread_time``) for ``--sockets`` open sockets, each of its own signed-in user of the free tier. While
a process has open sockets the warmer (``conversations/load_warmer.py``) runs a pass four times a second on a thread
of its own, and twice a second it re-reads everything: the sockets' users' tiers, their tiers' fleet and queue
figures (``conversations.load.warm``), whether a new conversation of theirs reads its question's vector, and every
socket's session (``accounts.sessions.sessions_current``). Printed: the session check alone, its first call and the
median of ``--passes`` later ones over rows that did not change; and the whole pass re-reading everything
(``load_warmer.warm_once`` after ``load.forget_reads``), median of ``--passes`` after a first. An idle worker's
status is published for the run (and removed after it), so the queue counts are read as under a live fleet.
``--checkouts A,B`` measures each checkout's product code in turn (this file run as a script in that directory),
alternated ``--rounds`` times (``devtools.checkouts.checkout_runs``). A benchmark that prints figures, not a test;
``docs/overhead-levers.md`` (levers 55-56) holds them. The users and sessions it writes are deleted at the end of
each run.

    manage.py bench_warm_pass --sockets 32,1000 --checkouts ../before,. --rounds 3
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta

from django.core.management.base import BaseCommand

PREFIX = "bench-warm-pass-"


class Command(BaseCommand):
    help = "CPU of the admission warmer's pass per open-socket count; --checkouts compares two."

    def add_arguments(self, parser):
        parser.add_argument("--sockets", default="32,1000", help="comma-separated open-socket counts")
        parser.add_argument("--passes", type=int, default=20, help="passes timed after the first, per run")
        parser.add_argument("--rounds", type=int, default=3, help="runs per checkout, alternated")
        parser.add_argument("--checkouts", default="", help="comma-separated checkout directories")

    def handle(self, *args, sockets, passes, rounds, checkouts, **options):
        from devtools.checkouts import checkout_runs  # here: a --checkouts run imports this file alone

        self.stdout.write(
            f"bench_warm_pass: {rounds} run(s) per checkout, {passes} passes each; load average "
            f"{open('/proc/loadavg').read()[:14]}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        self.stdout.write(
            "| checkout | sockets | session check, first, CPU ms | session check, later, CPU ms | the same per "
            "socket, µs | whole pass re-reading everything, CPU ms |"
        )
        self.stdout.write("|---|---|---|---|---|---|")
        for n in [int(x) for x in sockets.split(",")]:
            runs = checkout_runs(__file__, measure, [n, passes], checkouts=checkouts, rounds=rounds)
            for d, rows in runs.items():
                cells = []
                for key in ("first_ms", "later_ms", "per_socket_us", "warm_ms"):
                    v = [r[key] for r in rows]
                    cells.append(f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]")
                self.stdout.write(f"| {d} | {n} | {' | '.join(cells)} |")


def measure(sockets: int, passes: int) -> dict:
    """One run in this process: ``sockets`` users, each signed in with a session of its own (as a log-in writes
    it), then ``1 + passes`` calls of ``sessions_current`` over all of them, then, with those sockets counted as
    open, ``1 + passes`` whole warmer passes that re-read everything. Returns the first session check's CPU, the
    median of the later ones (ms, and µs per socket) and the median whole pass after the first (ms). Raises
    ``AssertionError`` if a session does not read as current."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.auth.hashers import make_password
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    from accounts.sessions import sessions_current
    from billing.models import Tier
    from conversations import load, load_warmer
    from events import broadcast
    from inference import fleet

    User = get_user_model()
    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    User.objects.filter(username__startswith=PREFIX).delete()
    password, tier = make_password("bench-warm-pass"), Tier.objects.get(name="free")
    users = User.objects.bulk_create(
        [User(username=f"{PREFIX}{i}", password=password, tier=tier) for i in range(sockets)]
    )
    expire = timezone.now() + timedelta(hours=1)
    store = store_class()
    rows = []
    for user in users:
        data = {
            SESSION_KEY: str(user.pk),
            BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
            HASH_SESSION_KEY: user.get_session_auth_hash(),
        }
        rows.append(
            Session(
                session_key=store._get_new_session_key(), session_data=store.encode(data), expire_date=expire
            )
        )
    Session.objects.bulk_create(rows)
    pairs = [(row.session_key, user.pk) for row, user in zip(rows, users, strict=True)]
    try:
        cpu = []
        for _ in range(1 + passes):
            started = time.thread_time()
            current = sessions_current(pairs=pairs)
            cpu.append((time.thread_time() - started) * 1000)
            assert current == set(pairs), "a bench session did not read as current"
        for key, user_id in pairs:
            load_warmer.socket_opened(session_key=key, user_id=user_id)
        # An idle, ready worker per model (for fleet.STATUS_TTL_S, longer than the passes), so that the queue
        # counts are read as under a live fleet.
        for model in settings.INFERENCE_MODELS:
            fleet.publish(
                fleet.WorkerStatus(worker_id=f"{PREFIX}-{model}", host=PREFIX, pid=0, model=model, ready=True)
            )
        warm = []
        for _ in range(1 + passes):
            load.forget_reads()
            load_warmer._sessions_read_at = float("-inf")  # the pass that re-reads the sessions too
            started = time.thread_time()
            load_warmer.warm_once()
            warm.append((time.thread_time() - started) * 1000)
    finally:
        for key, user_id in pairs:
            load_warmer.socket_closed(session_key=key, user_id=user_id)
        for model in settings.INFERENCE_MODELS:
            broadcast.redis_client().delete(fleet.status_key(f"{PREFIX}-{model}"))
        Session.objects.filter(session_key__in=[key for key, _ in pairs]).delete()
        User.objects.filter(username__startswith=PREFIX).delete()
    later = statistics.median(cpu[1:])
    return {
        "first_ms": cpu[0],
        "later_ms": later,
        "per_socket_us": later * 1000 / sockets,
        "warm_ms": statistics.median(warm[1:]),
    }


if __name__ == "__main__":  # a run for --checkouts, in the checkout measured (the working directory)
    sys.path[0] = os.getcwd()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    import django

    django.setup()
    print(json.dumps(measure(int(sys.argv[1]), int(sys.argv[2]))))
