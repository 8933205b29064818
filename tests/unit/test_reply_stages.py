"""``devtools/reply_stages.py``: a reply's stages joined across processes by trace id, and the table of
``manage.py reply_stages`` (p50/p99 per stage)."""

import json

from devtools.reply_stages import STAGES, format_table, read_spans, reply_timelines, stage_rows


def _spans(trace_id: str, start_ns: int, step_ms: float) -> list[dict]:
    """Spans of one reply whose stages are ``step_ms`` apart, as the web and worker processes export them."""
    moments = {stage: start_ns + int(i * step_ms * 1e6) for i, (stage, _, _) in enumerate(STAGES)}
    spans: dict[str, dict] = {}
    for stage, name, edge in STAGES:
        span = spans.setdefault(name, {"name": name, "trace_id": trace_id})
        span[f"{edge}_ns"] = moments[stage]
    for span in spans.values():  # spans known by one edge only: the other is the same moment
        span.setdefault("start_ns", span.get("end_ns"))
        span.setdefault("end_ns", span["start_ns"])
    return list(spans.values())


def test_stages_of_each_reply_are_joined_by_trace_and_summarised_per_stage():
    spans = _spans("a" * 32, 1_000_000_000, 1.0) + _spans("b" * 32, 5_000_000_000, 3.0)
    spans += _spans("d" * 32, 9_000_000_000, 2.0)
    spans.append(
        {"name": "chat.send", "trace_id": "c" * 32, "start_ns": 1, "end_ns": 2}
    )  # refused: no stages
    lines = [json.dumps(s) for s in spans] + ["", '{"torn']
    timelines = reply_timelines(read_spans(lines))
    assert len(timelines) == 3

    rows = {r.stage: r for r in stage_rows(timelines)}
    assert rows["frame received"].total_p99 == 0.0
    assert rows["validated"].step_p50 == 2.0 and rows["validated"].step_p99 == 3.0
    last = STAGES[-1][0]
    assert rows[last].total_p50 == 22.0 and rows[last].total_p99 == 33.0

    table = format_table(stage_rows(timelines), replies=3)
    assert table.splitlines()[0].startswith("3 replies")
    assert f"| {last} | 2.0 | 3.0 | 22.0 | 33.0 |" in table
