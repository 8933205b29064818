"""``manage.py socket_capacity``: how many chat sockets the bed's web tier holds, on its client host
(``scripts/bed exec client .venv/bin/python manage.py socket_capacity``); see devtools/drills/capacity.py
and docs/scale-out.md."""

import asyncio

from django.core.management.base import BaseCommand

from devtools.drills import capacity


class Command(BaseCommand):
    help = "Hold idle + streaming sockets on one daphne (or the LB) and report RSS, CPU, frame delay p99."

    def add_arguments(self, parser):
        parser.add_argument("--idle", type=int, default=1000)
        parser.add_argument("--streaming", type=int, default=200)
        parser.add_argument("--tokens", type=int, default=40, help="tokens per streaming reply")
        parser.add_argument("--rate", type=float, default=4.0, help="tokens/s per streaming reply")
        parser.add_argument("--lb", action="store_true", help="through the load balancer to both web nodes")
        parser.add_argument("--rounds", type=int, default=1)
        parser.add_argument("--clients", type=int, default=4, help="client processes reading the sockets")

    def handle(self, *args, **o):
        for r in range(o["rounds"]):
            result = asyncio.run(
                capacity.run(
                    idle=o["idle"],
                    streaming=o["streaming"],
                    through_lb=o["lb"],
                    tokens=o["tokens"],
                    rate=o["rate"],
                    clients=o["clients"],
                )
            )
            self.stdout.write(f"round {r + 1}: {result.text()}")
