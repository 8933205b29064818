"""``manage.py reply_stages``: where the time of a reply goes before its first token reaches the browser,
p50/p99 per stage (``devtools/reply_stages.py``), from the spans the stack wrote with
``OTEL_TRACES_EXPORTER=jsonfile`` (``docs/overhead.md`` says how to record them)."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from devtools.reply_stages import format_table, read_spans, reply_timelines, stage_rows


class Command(BaseCommand):
    help = "Print the per-stage breakdown (p50/p99 ms) of replies' first tokens from a jsonfile trace."

    def add_arguments(self, parser):
        parser.add_argument(
            "--file", default=None, help="span file (default: OTEL_TRACES_FILE); several with commas"
        )
        parser.add_argument("--last", type=int, default=0, help="only the newest N complete replies")

    def handle(self, *args, file, last, **options):
        paths = (file or settings.OTEL_TRACES_FILE).split(",")
        spans = []
        for path in paths:
            try:
                with open(path) as fh:
                    spans += read_spans(fh)
            except FileNotFoundError:
                raise CommandError(
                    f"no span file {path!r}: run the stack with OTEL_TRACES_EXPORTER=jsonfile first"
                ) from None
        timelines = sorted(reply_timelines(spans), key=lambda t: t["frame received"])
        if last:
            timelines = timelines[-last:]
        if not timelines:
            raise CommandError(f"no complete reply trace among {len(spans)} spans")
        self.stdout.write(format_table(stage_rows(timelines), replies=len(timelines)))
