"""``devtools/reply_stages.py``: a reply's stages joined across processes by trace id, and the table of
``manage.py reply_stages`` (p50/p99 per stage)."""

import json

from devtools.reply_stages import (
    PATHS,
    STAGES,
    format_table,
    read_spans,
    reply_timelines,
    stage_rows,
    timelines_by_path,
)


def _spans(trace_id: str, start_ns: int, step_ms: float, stages=STAGES) -> list[dict]:
    """Spans of one reply whose stages are ``step_ms`` apart, as the web and worker processes export them."""
    moments = {stage: start_ns + int(i * step_ms * 1e6) for i, (stage, _, _) in enumerate(stages)}
    spans: dict[str, dict] = {}
    for stage, name, edge in stages:
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
    assert table.splitlines()[0].startswith("page path: 3 replies")
    assert f"| {last} | 2.0 | 3.0 | 22.0 | 33.0 |" in table


def test_page_and_api_replies_are_told_apart_and_get_a_table_each():
    spans = _spans("a" * 32, 1_000_000_000, 1.0) + _spans("b" * 32, 2_000_000_000, 2.0, PATHS["api"])
    spans += _spans("c" * 32, 3_000_000_000, 4.0, PATHS["api"])
    spans += _spans("d" * 32, 3_500_000_000, 3.0, PATHS["api"])
    # An API reply whose first chunk never went out (client gone): no sse.first_token span, left out.
    spans += [s for s in _spans("e" * 32, 4_000_000_000, 1.0, PATHS["api"]) if s["name"] != "sse.first_token"]
    by_path = timelines_by_path(read_spans(json.dumps(s) for s in spans))
    assert [len(by_path["page"]), len(by_path["api"])] == [1, 3]
    assert by_path["api"][0]["request received"] == 2_000_000_000  # sorted by their first stage

    rows = stage_rows(by_path["api"], PATHS["api"])
    assert [r.stage for r in rows][:2] == ["request received", "validated"]
    assert [r.stage for r in rows][-2:] == ["received by the view", "first SSE chunk written"]
    last = len(PATHS["api"]) - 1
    assert rows[-1].total_p50 == 3.0 * last and rows[-1].total_p99 == 4.0 * last
    table = format_table(rows, replies=3, path="api")
    assert table.splitlines()[0].startswith("api path: 3 replies")
    assert "since request received p50" in table.splitlines()[1]
    # The shared stages are the same spans on both paths; only the ends differ.
    assert PATHS["api"][2:-2] == PATHS["page"][2:-2]
