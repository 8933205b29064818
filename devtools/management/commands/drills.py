"""``manage.py drills``: run the fault drills against a running stack and print, per drill, trials, time to
recovery, replies lost and replies stuck (see ``devtools/drills``).

The stack (daphne at ``--url``, PostgreSQL, Redis, the broker) must be up. The worker drill starts its own
``--workers`` Celery workers (and kills only those); the stack's own workers may keep running, but a reply
one of them serves is skipped by that drill. The PostgreSQL drill makes the configured database refuse
connections for ``--outage`` seconds (the whole product sees the outage; other databases are untouched).
The Redis drill runs only with ``--redis-restart-cmd`` (this command never restarts a shared Redis).
"""

import asyncio
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from devtools.drills import faults
from devtools.drills.processes import DrillWorker, stack_queues
from devtools.drills.report import format_table

DRILLS = ("bad_input", "worker_kill", "db_outage", "overload", "redis_restart")


class Command(BaseCommand):
    help = "Run fault drills against the running stack; print trials, time to recovery, replies lost/stuck."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="ws://127.0.0.1:8000/ws/chat/")
        parser.add_argument("--origin", default="http://127.0.0.1:8000")
        parser.add_argument("--drills", default="bad_input,worker_kill,db_outage,overload")
        parser.add_argument("--trials", type=int, default=3, help="trials of the worker and database drills")
        parser.add_argument("--workers", type=int, default=2, help="workers the worker drill starts")
        parser.add_argument("--outage", type=float, default=10.0, help="seconds PostgreSQL is unavailable")
        parser.add_argument("--sends", type=int, default=200, help="burst size of the overload drill")
        parser.add_argument("--clients", type=int, default=50, help="sockets of the overload drill")
        parser.add_argument(
            "--redis-restart-cmd", default="", help="shell command restarting the stack's Redis"
        )
        parser.add_argument("--log-dir", default="", help="where drill workers write their logs")

    def handle(self, *args, **o):
        chosen = [d.strip() for d in o["drills"].split(",") if d.strip()]
        unknown = set(chosen) - set(DRILLS)
        if unknown:
            raise CommandError(f"unknown drills {sorted(unknown)}; choose from {', '.join(DRILLS)}")
        if "redis_restart" in chosen and not o["redis_restart_cmd"]:
            raise CommandError("the redis_restart drill needs --redis-restart-cmd")
        log_dir = Path(o["log_dir"] or tempfile.mkdtemp(prefix="drills-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        results = []
        for name in chosen:
            self.stdout.write(f"running {name} ...")
            close_old_connections()  # the database drill ends every session of the database
            result = asyncio.run(self.run_drill(name, o, log_dir))
            self.stdout.write(format_table([result]))
            results.append(result)
        self.stdout.write("\n" + format_table(results))
        if not all(r.held for r in results):
            raise CommandError("some drills did not hold (see the table)")

    async def run_drill(self, name, o, log_dir):
        url, origin = o["url"], o["origin"]
        if name == "bad_input":
            return await faults.bad_input(url=url, origin=origin)
        if name == "overload":
            return await faults.overload(url=url, origin=origin, sends=o["sends"], clients=o["clients"])
        if name == "db_outage":
            return await faults.db_outage(url=url, origin=origin, outage_s=o["outage"], trials=o["trials"])
        if name == "redis_restart":
            return await faults.redis_restart(
                url=url, origin=origin, command=o["redis_restart_cmd"], trials=o["trials"]
            )
        queues = await asyncio.to_thread(stack_queues)
        generation = iter(range(1, 1000))

        def start(label=None):
            worker = DrillWorker(label or f"drill-{next(generation)}", log_dir, queues=queues)
            worker.wait_ready()
            return worker

        def restart(victim):
            return start(f"{victim.name}-r")

        workers = await asyncio.gather(*(asyncio.to_thread(start) for _ in range(o["workers"])))
        workers = list(workers)
        try:
            return await faults.worker_kill(
                url=url, origin=origin, workers=workers, restart=restart, trials=o["trials"]
            )
        finally:
            for worker in workers:
                await asyncio.to_thread(worker.stop)
