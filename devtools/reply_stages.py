"""The stages of one reply, from the WebSocket frame to the first token frame on the socket, read from its
trace (the ``jsonfile`` span exporter, ``observability/tracing.py``) and joined across the web, the worker
and back by trace id. ``manage.py reply_stages`` prints them; ``docs/overhead.md`` says what each costs.

Each stage is a moment (ns since the epoch, ``time.time_ns()`` of the process that saw it; all processes
of the stack share one clock) taken from a span's start or end:

============================== ============================== =================================================
stage                          span                           where
============================== ============================== =================================================
frame received                 ``ws.validate`` start          consumer, before the rate limit and JSON parsing
validated                      ``ws.validate`` end            consumer, the frame parsed by pydantic
admitted                       ``admission`` end              web: quota reserved, rate counted
stored                         ``reply.dispatch`` start       web: the transaction committed (on-commit hook)
dispatched                     ``reply.dispatch`` end         web: the broker confirmed the task's publish
picked up by a worker          ``generation`` start           worker thread: the task started
context assembled              ``context.assembly`` end       worker: branch read, chat template tokenised
submitted to the engine        ``engine.queue_wait`` start    worker: ``engine.submit``
first token                    ``engine.prefill`` end         engine: the first token sampled
published to the channel layer ``channel_layer.first_token``  worker: XADD + group send of the first delta
received by the consumer       ``ws.first_token`` start       consumer: the channel layer delivered it
sent to the socket             ``ws.first_token`` end         consumer: the token frame written to the socket
============================== ============================== =================================================

The API path (``POST /v1/chat/completions`` with ``stream: true``) shares the stages from ``admitted`` to
``published to the channel layer`` and has its own ends:

============================== ============================== =================================================
request received               ``api.validate`` start         web: the outermost middleware saw the request
validated                      ``api.validate`` end           view: API key checked, body parsed, model allowed
received by the view           ``sse.first_token`` start      SSE body: the channel layer delivered the token
first SSE chunk written        ``sse.first_token`` end        SSE body: its chunk handed to daphne (next pull)
============================== ============================== =================================================
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

#: The stages both paths share, from admission to the first delta handed to the channel layer.
_SHARED: list[tuple[str, str, str]] = [
    ("admitted", "admission", "end"),
    ("stored", "reply.dispatch", "start"),
    ("dispatched", "reply.dispatch", "end"),
    ("picked up by a worker", "generation", "start"),
    ("context assembled", "context.assembly", "end"),
    ("submitted to the engine", "engine.queue_wait", "start"),
    ("first token", "engine.prefill", "end"),
    ("published to the channel layer", "channel_layer.first_token", "end"),
]

#: Per path, (stage, span name, "start" | "end") in the order a reply passes them. A trace belongs to the
#: path whose first span it holds (``ws.validate``: the page's WebSocket; ``api.validate``: the API's SSE).
PATHS: dict[str, list[tuple[str, str, str]]] = {
    "page": [
        ("frame received", "ws.validate", "start"),
        ("validated", "ws.validate", "end"),
        *_SHARED,
        ("received by the consumer", "ws.first_token", "start"),
        ("sent to the socket", "ws.first_token", "end"),
    ],
    "api": [
        ("request received", "api.validate", "start"),
        ("validated", "api.validate", "end"),
        *_SHARED,
        ("received by the view", "sse.first_token", "start"),
        ("first SSE chunk written", "sse.first_token", "end"),
    ],
}
#: The page path's stages (the table of the module docstring).
STAGES = PATHS["page"]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def read_spans(lines: Iterable[str]) -> list[dict]:
    """Spans from ``jsonfile`` exporter lines (one JSON object each); blank or torn lines are skipped."""
    spans = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            spans.append(json.loads(line))
        except ValueError:
            continue
    return spans


def reply_timelines(
    spans: Iterable[dict], stages: list[tuple[str, str, str]] = STAGES
) -> list[dict[str, int]]:
    """One ``{stage: ns}`` per trace that has every one of ``stages`` (default: the page path's; replies that
    were refused, cut short or whose first token went to no client of this web process are left out)."""
    by_trace: dict[str, dict[str, dict]] = defaultdict(dict)
    for span in spans:
        # The first span of a name in a trace (a regenerate in the same trace would repeat none of these).
        by_trace[span["trace_id"]].setdefault(span["name"], span)
    timelines = []
    for named in by_trace.values():
        if all(name in named for _, name, _ in stages):
            timelines.append({stage: named[name][f"{edge}_ns"] for stage, name, edge in stages})
    return timelines


def timelines_by_path(spans: Iterable[dict]) -> dict[str, list[dict[str, int]]]:
    """``{path: timelines}`` for each of :data:`PATHS` (``"page"``, ``"api"``), each sorted by its first
    stage; a path without a complete reply maps to ``[]``."""
    spans = list(spans)
    out = {}
    for path, stages in PATHS.items():
        out[path] = sorted(reply_timelines(spans, stages), key=lambda t, first=stages[0][0]: t[first])
    return out


@dataclass(frozen=True)
class StageRow:
    """One stage: milliseconds since the previous stage and since the path's first stage (p50, p99)."""

    stage: str
    step_p50: float
    step_p99: float
    total_p50: float
    total_p99: float


def stage_rows(
    timelines: list[dict[str, int]], stages: list[tuple[str, str, str]] = STAGES
) -> list[StageRow]:
    """The breakdown table over ``timelines`` (:func:`reply_timelines` of the same ``stages``)."""
    rows = []
    previous = None
    first = stages[0][0]
    for stage, _, _ in stages:
        steps = [(t[stage] - t[previous]) / 1e6 for t in timelines] if previous else [0.0 for _ in timelines]
        totals = [(t[stage] - t[first]) / 1e6 for t in timelines]
        rows.append(
            StageRow(
                stage=stage,
                step_p50=percentile(steps, 50),
                step_p99=percentile(steps, 99),
                total_p50=percentile(totals, 50),
                total_p99=percentile(totals, 99),
            )
        )
        previous = stage
    return rows


def format_table(rows: list[StageRow], *, replies: int, path: str = "page") -> str:
    """A Markdown table of :func:`stage_rows` for ``replies`` replies of ``path`` (a key of :data:`PATHS`)."""
    out = [
        f"{path} path: {replies} replies; ms, nearest-rank percentiles",
        f"| stage | since previous p50 | p99 | since {rows[0].stage if rows else 'received'} p50 | p99 |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r.stage} | {r.step_p50:.1f} | {r.step_p99:.1f} | {r.total_p50:.1f} | {r.total_p99:.1f} |"
        )
    return "\n".join(out)
