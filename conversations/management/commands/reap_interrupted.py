"""``manage.py reap_interrupted``: mark replies whose worker died as ``interrupted``, and re-dispatch queued
replies that no broker message may deliver.

Every worker already does this every few seconds, and ``resume`` does it for the reply it opens; this
command is for when no worker is left running (run it from cron, or by hand after an outage).
"""

from django.core.management.base import BaseCommand

from conversations.reaper import generations_reap_interrupted, generations_redispatch_queued
from events import broadcast


class Command(BaseCommand):
    help = "Mark streaming replies whose worker lease expired as interrupted."

    def add_arguments(self, parser):
        parser.add_argument(
            "--grace", type=float, default=broadcast.LEASE_TTL_S, help="seconds without change"
        )

    def handle(self, *args, grace, **options):
        reaped = generations_reap_interrupted(grace_s=grace, recheck_s=broadcast.LEASE_RECHECK_S)
        self.stdout.write(f"marked {len(reaped)} reply(ies) interrupted" + (f": {reaped}" if reaped else ""))
        again = generations_redispatch_queued()
        self.stdout.write(f"re-dispatched {len(again)} queued reply(ies)" + (f": {again}" if again else ""))
