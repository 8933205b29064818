"""``manage.py usage_report --from 2026-11-01 --to 2026-11-30 [--tier free] [--top 10]``.

Prints usage per tier and per model, and the top users, between two dates (both inclusive, days in
``settings.TIME_ZONE``). Reads the ``UsageRecord`` ledger only.
"""

from datetime import date, datetime, time, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from billing.models import Tier
from billing.selectors import top_users, usage_by_model, usage_per_tier


def _day(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError as exc:
        raise CommandError(f"not a date (YYYY-MM-DD): {value!r}") from exc


class Command(BaseCommand):
    help = "Usage per tier, per model and the top users between two dates (inclusive)."

    def add_arguments(self, parser):
        parser.add_argument("--from", dest="date_from", required=True, help="first day, YYYY-MM-DD")
        parser.add_argument("--to", dest="date_to", required=True, help="last day (inclusive), YYYY-MM-DD")
        parser.add_argument("--tier", help="only users of this tier (its name)")
        parser.add_argument("--top", type=int, default=10, help="how many top users to list")

    def handle(self, *args, date_from, date_to, tier, top, **options):
        since, until, tier_obj = self.window(date_from, date_to, tier)
        self.stdout.write(self.report(since=since, until=until, tier=tier_obj, top=top))

    def window(self, date_from: str, date_to: str, tier_name: str | None):
        """``(since, until, tier)``: aware instants (``until`` exclusive, the midnight after ``--to``)."""
        first, last = _day(date_from), _day(date_to)
        if last < first:
            raise CommandError("--to is before --from")
        tier = None
        if tier_name:
            try:
                tier = Tier.objects.get(name=tier_name)
            except Tier.DoesNotExist as exc:
                names = ", ".join(Tier.objects.values_list("name", flat=True))
                raise CommandError(f"unknown tier {tier_name!r}; tiers: {names}") from exc
        since = timezone.make_aware(datetime.combine(first, time.min))
        until = timezone.make_aware(datetime.combine(last + timedelta(days=1), time.min))
        return since, until, tier

    def report(self, *, since, until, tier=None, top: int = 10) -> str:
        """The report as text (tables of fixed-width columns)."""
        last = (until - timedelta(days=1)).date()
        lines = [f"Usage {since.date()} .. {last}" + (f", tier {tier.name}" if tier else "")]
        lines += [
            "",
            "Per tier:",
            f"{'tier':<12}{'users':>8}{'requests':>10}{'prompt':>12}{'completion':>12}{'total':>12}",
        ]
        for r in usage_per_tier(since=since, until=until, tier=tier):
            lines.append(
                f"{r['tier']:<12}{r['users']:>8}{r['requests']:>10}{r['prompt_tokens']:>12}"
                f"{r['completion_tokens']:>12}{r['total_tokens']:>12}"
            )
        lines += [
            "",
            "Per model:",
            f"{'model':<28}{'requests':>10}{'prompt':>12}{'completion':>12}{'cost':>12}",
        ]
        for r in usage_by_model(since=since, until=until, tier=tier):
            lines.append(
                f"{r['model_name']:<28}{r['requests']:>10}{r['prompt_tokens']:>12}"
                f"{r['completion_tokens']:>12}{r['cost']:>12.4f}"
            )
        lines += ["", f"Top {top} users:", f"{'user':<24}{'tier':<12}{'requests':>10}{'total':>12}"]
        for r in top_users(since=since, until=until, tier=tier, limit=top):
            lines.append(f"{r['username']:<24}{r['tier']:<12}{r['requests']:>10}{r['total_tokens']:>12}")
        return "\n".join(lines) + "\n"
