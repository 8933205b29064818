"""``manage.py moderation_report [--days N] [--json]``: verdicts by category and tier."""

import json

from django.core.management.base import BaseCommand, CommandError

from safety.selectors import verdict_summary

ACTIONS = ("allow", "flag", "block")


class Command(BaseCommand):
    help = "Summarise moderation verdicts of the last N days by tier and by category (stage, category)."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=float, default=7.0, help="Window in days (default 7).")
        parser.add_argument("--json", action="store_true", help="Print the summary as one JSON object.")

    def handle(self, *args, days: float, json: bool = False, **options):
        if days <= 0:
            raise CommandError("--days must be positive.")
        summary = self.summary(days=days)
        if json:
            self.stdout.write(self.as_json(summary))
        else:
            self.stdout.write(self.as_table(summary, days=days))

    def summary(self, *, days: float) -> dict:
        return verdict_summary(days=days)

    def as_json(self, summary: dict) -> str:
        by_category = [
            {"stage": stage, "category": category, **counts}
            for (stage, category), counts in summary["by_category"].items()
        ]
        return json_dumps({**summary, "by_category": by_category})

    def as_table(self, summary: dict, *, days: float) -> str:
        lines = [
            f"Moderation verdicts, last {days:g} days: {summary['total']} checked, "
            f"{summary['false_positives']} marked false positive, {summary['failures']} guard failures.",
            "",
            f"{'tier':<20}" + "".join(f"{a:>8}" for a in ACTIONS),
        ]
        for tier, counts in summary["by_tier"].items():
            lines.append(f"{tier:<20}" + "".join(f"{counts.get(a, 0):>8}" for a in ACTIONS))
        lines += ["", f"{'stage':<8}{'category':<24}" + "".join(f"{a:>8}" for a in ACTIONS[1:])]
        for (stage, category), counts in summary["by_category"].items():
            lines.append(f"{stage:<8}{category:<24}" + "".join(f"{counts.get(a, 0):>8}" for a in ACTIONS[1:]))
        if not summary["by_category"]:
            lines.append("(no category hit)")
        return "\n".join(lines)


def json_dumps(value) -> str:
    return json.dumps(value, sort_keys=True)
