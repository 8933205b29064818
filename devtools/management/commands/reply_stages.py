"""``manage.py reply_stages``: where the time of a reply goes before its first token reaches the browser
(page path) or the API client (a streamed chat completion), p50/p99 per stage and path (``devtools/reply_stages.py``), from the spans the stack wrote with
``OTEL_TRACES_EXPORTER=jsonfile`` (``docs/overhead.md`` says how to record them)."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from devtools.reply_stages import PATHS, format_table, read_spans, stage_rows, timelines_by_path


class Command(BaseCommand):
    help = (
        "Print the per-stage breakdown (p50/p99 ms) of replies' first tokens from a jsonfile trace, one table "
        "per path (page: WebSocket; api: streamed /v1/chat/completions)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--file", default=None, help="span file (default: OTEL_TRACES_FILE); several with commas"
        )
        parser.add_argument("--last", type=int, default=0, help="only the newest N complete replies per path")

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
        tables = []
        for path, timelines in timelines_by_path(spans).items():
            if last:
                timelines = timelines[-last:]
            if timelines:
                rows = stage_rows(timelines, PATHS[path])
                tables.append(format_table(rows, replies=len(timelines), path=path))
        if not tables:
            raise CommandError(f"no complete reply trace among {len(spans)} spans")
        self.stdout.write("\n\n".join(tables))
