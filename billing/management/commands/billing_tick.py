"""``manage.py billing_tick [--every S]``: apply the subscription changes that fall due with time
(downgrades at the period's end, ended grace periods) and report metered tokens to Stripe. Once, or every
``S`` seconds until stopped (the ``billing`` line of the Procfile)."""

import time

from django.core.management.base import BaseCommand

from billing.metering import overage_report_all
from billing.subscriptions import subscriptions_apply_due


class Command(BaseCommand):
    help = "Apply due downgrades and ended grace periods; report metered tokens to Stripe."

    def add_arguments(self, parser):
        parser.add_argument("--every", type=float, default=0, help="repeat every this many seconds (0: once)")

    def handle(self, *args, every: float = 0, **options):
        while True:
            changed, reported = self.tick()
            self.stdout.write(f"{changed} subscription(s) changed tier, {reported} metered token(s) reported")
            if every <= 0:
                return
            time.sleep(every)

    def tick(self) -> tuple[int, int]:
        """One pass: ``(subscriptions that changed tier, metered tokens reported)``."""
        return subscriptions_apply_due(), overage_report_all()
