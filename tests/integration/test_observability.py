"""Observability and fleet operations over the live stack: real Celery worker processes with the real model,
a real daphne process, PostgreSQL, Redis and the broker.

* metrics: the worker's and daphne's own scrape endpoints change as a reply streams;
* tracing: one reply yields one trace across the web (this test process, in-memory exporter) and the
  worker (a subprocess exporting to a JSON-lines file) — two exporters, one trace id, parent links intact;
* blue-green: a 50 % rollout sends replies to two workers serving two versions of the same weights;
* drain: a drained worker finishes its running replies while new ones go to the other worker;
* /readyz turns 503 once no worker is ready.
"""

import asyncio
import json
import os
import re
import signal
import threading
import time
from urllib.request import Request, urlopen

import psutil
import pytest
import websockets
from channels.db import database_sync_to_async
from django.conf import settings
from django.core.management import call_command
from prometheus_client.parser import text_string_to_metric_families

from billing.models import Tier
from conversations.models import Message
from inference import fleet
from inference.models import ModelRollout

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
MODEL = settings.INFERENCE_DEFAULT_MODEL


def scrape(url: str, headers=None) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted label items): value}`` from a Prometheus text endpoint."""
    with urlopen(Request(url, headers=headers or {}), timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def fleet_status(node_prefix: str, timeout: float = 60) -> fleet.WorkerStatus:
    """The live status of the worker whose Celery node starts with ``node_prefix@`` once it announced its
    node name and metrics port (``worker_ready`` finished)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for w in fleet.live_workers():
            if w.node.startswith(f"{node_prefix}@") and w.metrics_port:
                return w
        time.sleep(0.3)
    raise TimeoutError(f"worker {node_prefix} not in the fleet")


@pytest.fixture
def users(make_user):
    """Free-tier users allowed several replies at once, short replies (two shared CPU cores)."""
    Tier.objects.filter(name="free").update(
        max_reply_tokens=24, max_concurrent_generations=8, requests_per_minute=600
    )
    return [make_user(f"user{i}") for i in range(4)]


def session_cookie(client, user) -> str:
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


async def ws_send(base_url: str, cookie: str, content: str, *, on_frame=None, timeout: float = 180) -> dict:
    """Send one message over a real WebSocket to daphne; returns the ``done`` frame."""
    ws_url = base_url.replace("http://", "ws://") + "/ws/chat/"
    async with websockets.connect(ws_url, additional_headers={"Cookie": cookie}, origin=base_url) as ws:
        await ws.send(json.dumps({"type": "send", "conversation_id": None, "content": content}))
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            if on_frame:
                await on_frame(frame)
            if frame["type"] in ("done", "error"):
                return frame


def wait_replies_finished(ids, timeout: float = 240) -> list[Message]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replies = list(Message.objects.filter(pk__in=ids).order_by("id"))
        if len(replies) == len(ids) and not any(m.is_active for m in replies):
            return replies
        time.sleep(0.5)
    raise TimeoutError([(m.id, m.status) for m in Message.objects.filter(pk__in=ids)])


def queue_replies(users, n: int, content: str = "Count to {n}.") -> list[int]:
    """``n`` replies queued through the real service (dispatched to the broker on commit); ``content`` with
    ``{n}`` replaced by 3, 4, ... for the successive messages."""
    from conversations.generations import reply_request

    return [
        reply_request(
            user=users[i % len(users)], conversation_id=None, content=content.format(n=i + 3)
        ).message.id
        for i in range(n)
    ]


async def test_worker_and_web_metrics_change_as_a_reply_streams(
    celery_worker, live_server_url, users, client
):  # noqa: F811
    worker = await database_sync_to_async(fleet_status)("shared")
    worker_url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    web_url = f"{live_server_url}/metrics"
    labels = {"model": MODEL, "tier": "free"}
    worker_before, web_before = scrape(worker_url), scrape(web_url)
    cookie = await database_sync_to_async(session_cookie)(client, users[0])
    seen = {}

    async def on_frame(frame):
        if frame["type"] == "token" and "mid" not in seen:  # mid-stream: the socket is open, the engine busy
            seen["mid"] = (
                await asyncio.to_thread(scrape, web_url),
                await asyncio.to_thread(scrape, worker_url),
            )

    done = await ws_send(live_server_url, cookie, "Tell me about bread.", on_frame=on_frame)
    assert done["type"] == "done" and done["status"] == "completed", done
    web_mid, worker_mid = seen["mid"]
    assert value(web_mid, "chatsite:websocket_connections_open") >= 1
    # The token frame this client already holds was counted before the consumer sent it.
    tokens_out = {"direction": "out", "type": "token"}
    assert value(web_mid, "chatsite:websocket_frames_total", **tokens_out) >= (
        value(web_before, "chatsite:websocket_frames_total", **tokens_out) + 1
    )
    # The engine's gauges are published mid-stream (their values depend on whether a short reply has
    # already ended by the time of the scrape, so only their presence is certain).
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert (f"chatsite:{gauge}", (("model", MODEL),)) in worker_mid

    await asyncio.sleep(0.5)  # the pipeline-overhead observation follows the done frame
    worker_after, web_after = scrape(worker_url), scrape(web_url)
    completion = done["usage"]["completion_tokens"]
    assert (
        value(worker_after, "chatsite:generation_tokens_total", **labels)
        - value(worker_before, "chatsite:generation_tokens_total", **labels)
        == completion
    )
    assert (
        value(worker_after, "chatsite:time_to_first_token_seconds_count", **labels)
        == value(worker_before, "chatsite:time_to_first_token_seconds_count", **labels) + 1
    )
    assert (
        value(worker_after, "chatsite:request_success_total", finish_reason=done["finish_reason"], **labels)
        >= 1
    )
    # The engine's step listener: one step per token at least, each decode token counted once.
    steps = value(worker_after, "chatsite:engine_step_duration_seconds_count", model=MODEL) - value(
        worker_before, "chatsite:engine_step_duration_seconds_count", model=MODEL
    )
    assert steps >= completion
    assert value(worker_after, "chatsite:engine_step_batch_size_count", model=MODEL) >= steps
    decode = value(worker_after, "chatsite:engine_step_tokens_sum", model=MODEL, phase="decode") - value(
        worker_before, "chatsite:engine_step_tokens_sum", model=MODEL, phase="decode"
    )
    assert decode == completion - 1  # the first token comes from the prefill
    assert value(worker_after, "chatsite:inter_token_latency_seconds_count", **labels) > value(
        worker_before, "chatsite:inter_token_latency_seconds_count", **labels
    )
    assert (
        value(web_after, "chatsite:admissions_total", tier="free")
        == value(web_before, "chatsite:admissions_total", tier="free") + 1
    )
    assert value(web_after, "chatsite:websocket_frames_total", direction="in", type="send") >= 1
    assert (
        value(web_after, "chatsite:websocket_frames_total", direction="out", type="token")
        - value(web_before, "chatsite:websocket_frames_total", direction="out", type="token")
        >= 1
    )
    assert (
        value(web_after, "chatsite:pipeline_overhead_seconds_count")
        == value(web_before, "chatsite:pipeline_overhead_seconds_count") + 1
    )
    # One grep follows the reply: the worker's line carries the web request's id, the message id and trace id.
    finished = [
        line
        for line in celery_worker.log_path.read_text().splitlines()
        if "reply finished" in line and f"message_id={done['message_id']} " in line
    ]
    assert len(finished) == 1 and re.search(r"request_id=[0-9a-f]{32} ", finished[0]), finished
    assert "Tell me about bread" not in celery_worker.log_path.read_text()  # no content at INFO
    # The socket closed after the reply.
    assert value(web_after, "chatsite:websocket_connections_open") == value(
        web_before, "chatsite:websocket_connections_open"
    )


@pytest.fixture(scope="module")
def blue_green(worker_factory, tmp_path_factory):
    """Two workers of the same weights announcing versions ``blue`` and ``green``; both export their spans
    to one JSON-lines file. Stopped at the end of the module (they are large)."""
    spans = tmp_path_factory.mktemp("spans") / "worker-spans.jsonl"
    env = {
        "OTEL_TRACES_EXPORTER": "jsonfile",
        "OTEL_TRACES_FILE": str(spans),
        "OTEL_INSTRUMENT": "celery,psycopg",
        "OTEL_SERVICE_NAME": "chatsite-worker",
    }
    workers = {v: worker_factory(v, env={**env, "INFERENCE_MODEL_VERSION": v}) for v in ("blue", "green")}
    yield workers, spans
    for w in workers.values():
        w.stop()


def test_rollout_at_50_percent_reaches_both_versions(blue_green, users):
    workers, _ = blue_green
    for v in workers:
        assert fleet_status(v).model_version == v
    call_command("rollout", MODEL, "--to", "green", "--percent", "50", "--stable", "blue")
    try:
        ids = queue_replies(users, 4)
        replies = wait_replies_finished(ids)
    finally:
        ModelRollout.objects.all().delete()
    assert [m.status for m in replies] == ["completed"] * 4
    versions = [m.model_version for m in replies]
    assert sorted(versions) == ["blue", "blue", "green", "green"]  # consecutive replies alternate at 50 %


def test_one_reply_is_one_trace_across_web_and_worker(blue_green, users):
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from conversations.generations import reply_request
    from observability import tracing

    _, spans_file = blue_green
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    # This test process plays the web side: the span the consumer opens for a send frame, then the same
    # service call; Celery's instrumentation injects the context into the task headers.
    tracing.setup_tracing(exporter=InMemorySpanExporter(), instrument=["celery"])
    web_spans = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(web_spans))
    call_command("rollout", MODEL, "--to", "green", "--percent", "100", "--stable", "blue")
    try:
        with tracing.span("chat.send") as root:
            message_id = reply_request(user=users[0], conversation_id=None, content="Hello!").message.id
        reply = wait_replies_finished([message_id])[0]
    finally:
        ModelRollout.objects.all().delete()
    trace_id = format(root.get_span_context().trace_id, "032x")
    assert reply.status == "completed" and reply.trace_id == trace_id
    web = {s.name for s in web_spans.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id}
    assert {"chat.send", "moderation.input", "db.transaction", "admission", "reply.dispatch"} <= web
    assert any(name.startswith("apply_async/") for name in web)
    deadline = time.monotonic() + 10
    while True:
        worker = [json.loads(line) for line in spans_file.read_text().splitlines()]
        worker = [s for s in worker if s["trace_id"] == trace_id]
        names = {s["name"] for s in worker}
        if "generation.final_write" in names or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    expected = {
        "generation",
        "context.assembly",
        "engine.queue_wait",
        "engine.prefill",
        "engine.decode",
        "moderation.output",  # the final output check (partial checks while streaming make no span)
        "generation.final_write",
        "channel_layer.first_token",  # a stage of manage.py reply_stages
    }
    assert expected <= names, names
    assert any(n.startswith("run/") for n in names)
    by_id = {s["span_id"]: s for s in worker}
    generation = next(s for s in worker if s["name"] == "generation")
    assert by_id[generation["parent_id"]]["name"].startswith("run/")  # the worker's root hangs off the web's
    assert {s["service"] for s in worker} == {"chatsite-worker"}


async def test_one_streamed_api_completion_is_one_trace_with_the_api_paths_stages(blue_green, users):
    """The API path's stages (``manage.py reply_stages``): request received and validated, the shared stages
    from admission to the worker's first publish, then the SSE body's first token chunk, in one trace."""
    from django.test import AsyncClient
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from api.services import api_key_create
    from devtools.reply_stages import PATHS, reply_timelines
    from observability import tracing

    _, spans_file = blue_green
    tracing.setup_tracing(exporter=InMemorySpanExporter(), instrument=["celery"])
    web_spans = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(web_spans))
    _, key = await database_sync_to_async(api_key_create)(user=users[1], name="trace")
    # To the traced green worker only: the session's plain worker may be alive and serve the model's queue.
    await database_sync_to_async(call_command)(
        "rollout", MODEL, "--to", "green", "--percent", "100", "--stable", "blue"
    )
    try:
        response = await AsyncClient().post(
            "/v1/chat/completions",
            # Stored: an unstored completion's rows are deleted once its reply ends.
            data=json.dumps(
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "Hi!"}],
                    "stream": True,
                    "store": True,
                }
            ),
            content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )
        assert response.status_code == 200
        body = b"".join([chunk async for chunk in response.streaming_content]).decode()
        reply_id = int(json.loads(body.split("data: ", 2)[1].split("\n")[0])["id"].removeprefix("chatcmpl-"))
        reply = (await database_sync_to_async(wait_replies_finished)([reply_id]))[0]
    finally:
        await database_sync_to_async(ModelRollout.objects.all().delete)()
    assert body.rstrip().endswith("data: [DONE]") and '"content":' in body

    web = [s for s in web_spans.get_finished_spans() if s.name == "api.request"]
    assert len(web) == 1
    root = web[0]
    trace_id = format(root.context.trace_id, "032x")
    ours = [s for s in web_spans.get_finished_spans() if s.context.trace_id == root.context.trace_id]
    by_name = {s.name: s for s in ours}
    assert {"api.validate", "admission", "reply.dispatch", "sse.first_token"} <= set(by_name)
    # Recorded after the view returned, under the request's span (as the consumer's ws.first_token).
    assert by_name["sse.first_token"].parent.span_id == root.context.span_id
    assert by_name["api.validate"].start_time == root.start_time  # both begin when the request came in
    assert reply.status == "completed" and reply.trace_id == trace_id

    exported = [
        {"name": s.name, "trace_id": trace_id, "start_ns": s.start_time, "end_ns": s.end_time} for s in ours
    ]
    deadline = time.monotonic() + 10
    while True:
        worker = [json.loads(line) for line in spans_file.read_text().splitlines()]
        worker = [s for s in worker if s["trace_id"] == trace_id]
        if {"generation.final_write", "channel_layer.first_token"} <= {s["name"] for s in worker}:
            break
        assert time.monotonic() < deadline, {s["name"] for s in worker}
        await asyncio.sleep(0.3)
    timelines = reply_timelines(exported + worker, PATHS["api"])
    assert len(timelines) == 1
    moments = [timelines[0][stage] for stage, _, _ in PATHS["api"]]
    # One clock for the test process and the worker: every stage comes after the request came in.
    assert min(moments) == moments[0] and moments[-1] >= moments[-2]


def test_drained_worker_finishes_its_replies_while_new_ones_go_elsewhere(blue_green, users):
    workers, _ = blue_green
    blue, green = workers["blue"], workers["green"]
    blue_status = fleet_status("blue")
    # Replies that stream for seconds: blue must be seen running them (its status is published once a second) and
    # still be running them when the drain starts. A "Count to N." reply is 12-51 tokens, done in well under a
    # second on the batched engine, so it could start and end between two status reads; these prompts ran to the
    # 256-token cap in 35 of 36 tries (the four of them, greedy and sampled at 0.7 and 1.0; the other stopped at 94).
    Tier.objects.filter(name="free").update(max_reply_tokens=256)
    # Pinned to blue (its version queue), so blue certainly runs them: on the shared queue green or the
    # session's worker could take all four (each prefetches up to its task threads).
    call_command("rollout", MODEL, "--to", "blue", "--percent", "100", "--stable", "green")
    try:
        first = queue_replies(users, 4, "Write a long story about lighthouse keeper number {n} and the sea.")
    finally:
        ModelRollout.objects.all().delete()
    deadline = time.monotonic() + 120
    while not (
        fleet_status("blue").active_replies
        and Message.objects.filter(pk__in=first, status="streaming").exists()
    ):
        assert time.monotonic() < deadline, "blue never took a reply"
        time.sleep(0.2)
    out = []
    drain = threading.Thread(
        target=lambda: out.append(call_command("drain", blue_status.worker_id, "--timeout", "240"))
    )
    drain.start()
    while not fleet_status("blue").draining:
        time.sleep(0.2)
    later = queue_replies(users, 2)
    drain.join(300)
    assert not drain.is_alive()
    blue.proc.wait(60)
    replies = wait_replies_finished(first + later)
    assert [m.status for m in replies] == ["completed"] * 6  # none interrupted, none lost
    blue_log = blue.log_path.read_text()
    assert any(f"message_id={i} " in blue_log for i in first)  # blue finished what it was running
    assert not any(f"message_id={i} " in blue_log for i in later)  # ...and took nothing new
    assert "Traceback" not in blue_log
    assert green.proc.poll() is None


def test_readyz_is_503_once_no_worker_is_ready(blue_green, client):
    workers, _ = blue_green
    assert client.get("/readyz").status_code == 200 or not any(
        w.proc.poll() is None for w in workers.values()
    )
    for w in workers.values():
        w.stop()
    # Other workers of this test session (e.g. the shared one) are paused so their fleet status expires;
    # only our own child processes are touched.
    paused = [w.pid for w in fleet.live_workers() if psutil.Process(w.pid).ppid() == os.getpid()]
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + fleet.STATUS_TTL_S + 5
        while (response := client.get("/readyz")).status_code != 503:
            assert time.monotonic() < deadline, response.json()
            time.sleep(0.5)
        assert response.json()["failing"] == ["workers"]
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
