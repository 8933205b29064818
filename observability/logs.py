"""Structured logs: every record carries ``request_id``, ``message_id``, ``user_id`` and ``trace_id`` so one
reply can be followed with one grep across the web and worker processes.

``LOG_FORMAT=json`` renders one JSON object per line (python-json-logger); ``text`` (default) appends the
same fields to a plain line. Set the ids for a block with :func:`log_context`; the trace id comes from the
current OpenTelemetry span. Message content is never put in these fields; code logs ids and sizes, not
text, at INFO.
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from pythonjsonlogger.json import JsonFormatter

FIELDS = ("request_id", "message_id", "user_id", "trace_id")
_context: contextvars.ContextVar[dict | None] = contextvars.ContextVar("chatsite_log_context", default=None)


@contextmanager
def log_context(**fields) -> Iterator[None]:
    """Attach ``fields`` (any of ``request_id``, ``message_id``, ``user_id``) to every record logged in the
    block (this thread/task and the sync_to_async threads it starts)."""
    token = _context.set({**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def current_field(name: str) -> str:
    """The value of a :func:`log_context` field in this context (``""`` when unset)."""
    return str((_context.get() or {}).get(name, ""))


def new_request_id() -> str:
    """A fresh request id (32 hex digits)."""
    return uuid.uuid4().hex


class ContextFilter(logging.Filter):
    """Sets :data:`FIELDS` on each record (``""`` where unknown). Attach to handlers."""

    def filter(self, record: logging.LogRecord) -> bool:
        from observability.tracing import current_trace_id

        ctx = _context.get() or {}
        for name in FIELDS[:3]:
            if not hasattr(record, name):
                setattr(record, name, ctx.get(name, ""))
        if not getattr(record, "trace_id", ""):
            record.trace_id = current_trace_id()
        return True


class ChatsiteJsonFormatter(JsonFormatter):
    """JSON lines with ``time``, ``level``, ``logger``, ``message`` and :data:`FIELDS`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("rename_fields", {"asctime": "time", "levelname": "level", "name": "logger"})
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s %(message_id)s %(user_id)s %(trace_id)s",
            *args,
            **kwargs,
        )


TEXT_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s %(message)s "
    "[request_id=%(request_id)s message_id=%(message_id)s user_id=%(user_id)s trace_id=%(trace_id)s]"
)


def logging_config(*, log_format: str, level: str) -> dict:
    """The ``LOGGING`` dict for ``LOG_FORMAT`` (``json`` or ``text``). Raises ``ValueError`` otherwise."""
    if log_format not in ("json", "text"):
        raise ValueError(f"LOG_FORMAT must be json or text, not {log_format!r}")
    formatter = (
        {"()": "observability.logs.ChatsiteJsonFormatter"}
        if log_format == "json"
        else {"format": TEXT_FORMAT}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "observability.logs.ContextFilter"}},
        "formatters": {"default": formatter},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "filters": ["context"], "formatter": "default"}
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": {"django.channels.server": {"level": "WARNING"}},
    }
