"""OpenTelemetry tracing: one trace per reply, from the WebSocket ``send`` (or an API request) to the final
database write in the worker.

Spans: ``chat.send`` (consumer) -> ``admission`` and ``db.transaction`` (web) -> Celery's
``apply_async``/``run`` spans (``opentelemetry-instrumentation-celery`` carries the context in the task
headers) -> ``generation`` (worker) with ``context.assembly``, ``engine.queue_wait``, ``engine.prefill``
(its end is the first token, also an event), ``engine.decode`` and ``generation.final_write``. The engine
knows nothing of tracing: its queue/prefill/decode spans are written after the fact from the
``FinishEvent`` timings, with explicit start and end times. The maintained instrumentations for Django,
Celery, psycopg and redis add their spans where ``OTEL_INSTRUMENT`` lists them; per-token Redis
publishes are kept out of the trace (``suppress_instrumentation``) so a reply is tens of spans, not
thousands.

Exporters (``OTEL_TRACES_EXPORTER``): ``none`` (default: no provider is installed, the API stays a
no-op), ``console``, ``otlp`` (HTTP/protobuf; ``OTEL_EXPORTER_OTLP_ENDPOINT`` etc. are read by the
exporter), and ``jsonfile`` (one JSON object per span appended to ``OTEL_TRACES_FILE``; used by the
cross-process test and handy without a collector).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace

logger = logging.getLogger(__name__)
tracer = trace.get_tracer("chatsite")

_configured = False
_lock = threading.Lock()


def _setting(name: str, default):
    from django.conf import settings

    return getattr(settings, name, default)


class JsonFileSpanExporter:
    """Appends each finished span as one JSON line (``name``, ``trace_id``, ``span_id``, ``parent_id`` as
    hex, ``start_ns``/``end_ns``, ``attributes``, ``service``) to ``path``. Thread-safe within a process;
    lines from several processes may interleave only between lines (O_APPEND, one write per span)."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans) -> object:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = []
        for span in spans:
            ctx = span.get_span_context()
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "trace_id": format(ctx.trace_id, "032x"),
                        "span_id": format(ctx.span_id, "016x"),
                        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                        "start_ns": span.start_time,
                        "end_ns": span.end_time,
                        "attributes": {k: v for k, v in (span.attributes or {}).items()},
                        "service": span.resource.attributes.get("service.name"),
                    },
                    default=str,
                )
            )
        with self._lock, open(self.path, "a") as fh:
            fh.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _exporter_from_settings():
    kind = _setting("OTEL_TRACES_EXPORTER", "none")
    if kind == "none":
        return None
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if kind == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if kind == "jsonfile":
        return JsonFileSpanExporter(_setting("OTEL_TRACES_FILE", "traces.jsonl"))
    raise ValueError(f"OTEL_TRACES_EXPORTER must be none, console, otlp or jsonfile, not {kind!r}")


def setup_tracing(
    *, exporter=None, instrument: Sequence[str] | None = None, simple: bool | None = None
) -> bool:
    """Install a tracer provider and the instrumentations once per process. Returns whether tracing is on.

    ``exporter``: a span exporter to use instead of the one named by ``OTEL_TRACES_EXPORTER`` (tests pass
    an ``InMemorySpanExporter``). ``instrument``: instrumentation names (``django``, ``celery``,
    ``psycopg``, ``redis``; default ``OTEL_INSTRUMENT``). ``simple``: export each span as it ends instead
    of in batches (default: for ``jsonfile`` and in-memory exporters)."""
    global _configured
    with _lock:
        if _configured:
            return True
        exporter = exporter or _exporter_from_settings()
        if exporter is None:
            return False
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        if simple is None:
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

            simple = isinstance(exporter, JsonFileSpanExporter | InMemorySpanExporter)
        provider = TracerProvider(
            resource=Resource.create({"service.name": _setting("OTEL_SERVICE_NAME", "chatsite")})
        )
        provider.add_span_processor((SimpleSpanProcessor if simple else BatchSpanProcessor)(exporter))
        trace.set_tracer_provider(provider)
        for name in instrument if instrument is not None else _setting("OTEL_INSTRUMENT", []):
            _instrument(name)
        _configured = True
        return True


def _instrument(name: str) -> None:
    if name == "django":
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        DjangoInstrumentor().instrument()
    elif name == "celery":
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()
    elif name == "psycopg":
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        PsycopgInstrumentor().instrument(enable_commenter=False)
    elif name == "redis":
        from opentelemetry.instrumentation.redis import RedisInstrumentor

        RedisInstrumentor().instrument()
    else:
        raise ValueError(f"unknown OTEL_INSTRUMENT entry {name!r}")


def span(name: str, *, start_ns: int | None = None, **attributes):
    """A child span of the current one (context manager), e.g. ``with span("admission", tier="free"):``.
    ``start_ns``: when it began (ns since the epoch, ``time.time_ns()``) if earlier than now, e.g. the
    moment a frame was received."""
    return tracer.start_as_current_span(name, start_time=start_ns, attributes=attributes or None)


def current_context():
    """The current span's context (to parent spans recorded later, outside the ``with`` block, e.g. the
    consumer's first token of a reply whose ``chat.send`` span has ended); None when nothing is recorded."""
    ctx = trace.get_current_span().get_span_context()
    return ctx if ctx.is_valid else None


def current_trace_id() -> str:
    """The current trace id as 32 hex digits, or ``""`` when no trace is being recorded."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


def record_span(name: str, start_ns: int, end_ns: int, *, parent=None, **attributes) -> None:
    """Write a finished child span of the current span (or of ``parent``, a span context from
    :func:`current_context`) with explicit times (ns since the epoch); used for engine stages known only
    from the ``FinishEvent`` timings and for the stages of a reply (``docs/overhead.md``)."""
    if parent is not None:
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    elif trace.get_current_span().get_span_context().is_valid:
        context = None
    else:
        return
    s = tracer.start_span(name, context=context, start_time=start_ns, attributes=attributes or None)
    s.end(end_time=max(start_ns, end_ns))


@contextmanager
def quiet() -> Iterator[None]:
    """Keep the instrumentations' spans out for the block (per-token Redis publishes)."""
    from opentelemetry.instrumentation.utils import suppress_instrumentation

    with suppress_instrumentation():
        yield
