"""``manage.py cluster_drills``: the drills of the multi-host test bed, run on its client host
(``scripts/bed exec client .venv/bin/python manage.py cluster_drills``); prints trials, time to recovery,
replies lost and stuck per drill and fails when a drill did not hold (docs/scale-out.md)."""

import asyncio

from django.core.management.base import BaseCommand, CommandError

from devtools.drills import cluster
from devtools.drills.report import format_table

DRILLS = ("worker_kill", "partition_10", "partition_60", "web_kill", "rolling_web", "lossy_broker")


class Command(BaseCommand):
    help = "Run the multi-host bed's drills through its load balancer; print the drill table."

    def add_arguments(self, parser):
        parser.add_argument("--drills", default="worker_kill,partition_10")
        parser.add_argument("--trials", type=int, default=1)

    def handle(self, *args, **o):
        names = [n for n in o["drills"].split(",") if n]
        unknown = set(names) - set(DRILLS)
        if unknown:
            raise CommandError(f"unknown drills {sorted(unknown)}; choose from {', '.join(DRILLS)}")
        results = [asyncio.run(self.run_one(name, o)) for name in names]
        self.stdout.write(format_table(results))
        if not all(r.held for r in results):
            raise CommandError("a drill did not hold")

    async def run_one(self, name, o):
        if name == "worker_kill":
            return await cluster.worker_host_kill(trials=o["trials"])
        if name.startswith("partition_"):
            return await cluster.partition(seconds=float(name.split("_")[1]))
        if name == "lossy_broker":
            return await cluster.lossy_broker()
        if name == "rolling_web":
            return await cluster.rolling_web()
        if name == "web_kill":
            from devtools.drills import cluster_browser

            return await asyncio.to_thread(cluster_browser.web_kill, trials=o["trials"])
        raise CommandError(f"{name}: not implemented")
