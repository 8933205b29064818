"""``manage.py bench_session_pass``: what the admission warmer's session pass costs a web process
(``accounts.sessions.sessions_current`` for every open socket's session, run twice a second on the warmer's thread
while sockets are open, ``conversations/load_warmer.py``), in CPU of the calling thread per pass (``time.thread_time``)
for ``--sockets`` open sockets, each of its own signed-in user: the first pass after the sockets opened, and the
passes after it over rows that did not change (median of ``--passes``). ``--checkouts A,B`` measures each
checkout's product code in turn (this file run as a script in that directory), alternated ``--rounds`` times
(``devtools.checkouts.checkout_runs``). A benchmark that prints figures, not a test; ``docs/overhead-levers.md``
(lever 55) holds them. The users and sessions it writes are deleted at the end of each run.

    manage.py bench_session_pass --sockets 32,1000 --checkouts ../before,. --rounds 3
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta

from django.core.management.base import BaseCommand

PREFIX = "bench-session-pass-"


class Command(BaseCommand):
    help = "CPU of the admission warmer's session pass per open-socket count; --checkouts compares two."

    def add_arguments(self, parser):
        parser.add_argument("--sockets", default="32,1000", help="comma-separated open-socket counts")
        parser.add_argument("--passes", type=int, default=20, help="passes timed after the first, per run")
        parser.add_argument("--rounds", type=int, default=3, help="runs per checkout, alternated")
        parser.add_argument("--checkouts", default="", help="comma-separated checkout directories")

    def handle(self, *args, sockets, passes, rounds, checkouts, **options):
        from devtools.checkouts import checkout_runs  # here: a --checkouts run imports this file alone

        self.stdout.write(
            f"bench_session_pass: {rounds} run(s) per checkout, {passes} passes each; load average "
            f"{open('/proc/loadavg').read()[:14]}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        self.stdout.write(
            "| checkout | sockets | first pass, CPU ms | each later pass, CPU ms | per socket, µs |"
        )
        self.stdout.write("|---|---|---|---|---|")
        for n in [int(x) for x in sockets.split(",")]:
            runs = checkout_runs(__file__, measure, [n, passes], checkouts=checkouts, rounds=rounds)
            for d, rows in runs.items():
                cells = []
                for key in ("first_ms", "later_ms"):
                    v = [r[key] for r in rows]
                    cells.append(f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]")
                per = statistics.median(r["later_ms"] for r in rows) * 1000 / n
                self.stdout.write(f"| {d} | {n} | {' | '.join(cells)} | {per:.1f} |")


def measure(sockets: int, passes: int) -> dict:
    """One run in this process: ``sockets`` users, each signed in with a session of its own (as a log-in writes
    it), then ``1 + passes`` calls of ``sessions_current`` over all of them. Returns the first call's CPU and
    the median of the later ones (ms). Raises ``AssertionError`` if a session does not read as current."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.auth.hashers import make_password
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    from accounts.sessions import sessions_current
    from billing.models import Tier

    User = get_user_model()
    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    User.objects.filter(username__startswith=PREFIX).delete()
    password, tier = make_password("bench-session-pass"), Tier.objects.get(name="free")
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
    finally:
        Session.objects.filter(session_key__in=[key for key, _ in pairs]).delete()
        User.objects.filter(username__startswith=PREFIX).delete()
    return {"first_ms": cpu[0], "later_ms": statistics.median(cpu[1:])}


if __name__ == "__main__":  # a run for --checkouts, in the checkout measured (the working directory)
    sys.path[0] = os.getcwd()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.dev")
    import django

    django.setup()
    print(json.dumps(measure(int(sys.argv[1]), int(sys.argv[2]))))
