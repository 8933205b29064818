"""Health endpoints, /metrics protection, the staff fleet page, rollout routing, refusal counting and the
fleet/drain/rollout commands' steps, with the real database and Redis."""

import io
import logging
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from prometheus_client import REGISTRY

from billing.models import Tier
from conversations import generations, refusals, services
from conversations.admission import AdmissionRefused
from conversations.models import Message
from inference import fleet
from inference.management.commands.drain import Command as Drain
from inference.models import ModelRollout
from inference.registry import queue_for
from inference.rollout import rollout_set, route_for, takes_candidate
from operations import health
from tests.conftest import broker_take

pytestmark = pytest.mark.django_db
MODEL = "smollm2-135m-instruct"


def publish_worker(redis_client, **overrides):
    status = fleet.WorkerStatus(
        worker_id="gpu-host:123",
        host="gpu-host",
        pid=123,
        model=MODEL,
        node="gpu@gpu-host",
        queues=[f"inference.{MODEL}"],
        started_at=time.time() - 60,
        ready=True,
        **overrides,
    )
    fleet.publish(status, client=redis_client)
    return status


def test_healthz_answers_without_touching_anything(client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.real_fleet  # no published idle worker: this test publishes its own
def test_readyz_names_the_missing_worker_then_is_ready(client, redis_clean, monkeypatch):
    monkeypatch.setitem(
        health.CHECKS, "broker", lambda: None
    )  # the broker is exercised in the integration layer
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert (
        body["failing"] == ["workers"]
        and body["checks"]["postgres"] == "ok"
        and body["checks"]["redis"] == "ok"
    )
    publish_worker(redis_clean, draining=True)
    assert client.get("/readyz").status_code == 503  # a draining worker is not ready capacity
    publish_worker(redis_clean)
    response = client.get("/readyz")
    assert response.status_code == 200 and response.json()["failing"] == []


@pytest.mark.real_fleet
def test_readyz_not_ready_is_logged_at_info_not_as_an_error(client, redis_clean, monkeypatch, caplog):
    monkeypatch.setitem(health.CHECKS, "broker", lambda: None)
    with caplog.at_level(logging.DEBUG):
        assert client.get("/readyz").status_code == 503
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "operations.views"] == [
        ("INFO", "not ready: workers (no worker with a ready engine)")
    ]


def test_readyz_names_an_unreachable_broker(client, redis_clean, monkeypatch):
    from celery import current_app
    from kombu import Connection

    publish_worker(redis_clean)
    health.BROKER.forget()  # the check answers from its last look; this test needs a first one
    try:
        with monkeypatch.context() as patch:  # undone before redis_clean purges the real broker
            patch.setattr(
                current_app, "connection_for_write", lambda: Connection("amqp://guest:guest@127.0.0.1:1//")
            )
            response = client.get("/readyz")
            again = client.get("/readyz")  # answered from the failing look, not a second connection
    finally:
        health.BROKER.forget()
    assert response.status_code == 503 and response.json()["failing"] == ["broker"]
    assert (
        again.status_code == 503 and again.json()["checks"]["broker"] == response.json()["checks"]["broker"]
    )


def test_metrics_needs_an_allowed_network_or_the_token(client, settings):
    settings.METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    settings.METRICS_BEARER_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 403  # the test client comes from 127.0.0.1
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert response.status_code == 200 and b"chatsite:websocket_connections_open" in response.content
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200


def test_fleet_page_is_staff_only_and_shows_slowest_reply_with_trace_id(client, make_user, redis_clean):
    alice = make_user("alice")
    conversation = services.conversation_create(owner=alice, title="t")
    slow = services.message_create(conversation=conversation, role="assistant", content="x", model_name=MODEL)
    Message.objects.filter(pk=slow.pk).update(
        ttft_ms=900, duration_ms=12000, completion_tokens=50, trace_id="ab" * 16
    )
    publish_worker(redis_clean)
    refusals.refusal_record(tier="free", reason="busy")
    client.force_login(alice)
    assert client.get("/ops/fleet/").status_code == 302  # not staff: to the admin log-in
    client.force_login(make_user("root", is_staff=True))
    response = client.get("/ops/fleet/?minutes=5")
    assert response.status_code == 200
    page = response.content.decode()
    assert "ab" * 16 in page and "gpu-host:123" in page and "busy" in page
    assert response.context["stats"]["ttft_p50_ms"] == 900 and response.context["stats"]["count"] == 1


def test_refusal_is_counted_by_tier_and_reason_and_nothing_is_stored(alice, redis_clean):
    Tier.objects.filter(name="free").update(max_concurrent_generations=0)
    labels = {"tier": "free", "reason": "too_many_generations"}
    before = REGISTRY.get_sample_value("chatsite:admission_rejections_total", labels) or 0
    with pytest.raises(AdmissionRefused):
        generations.reply_request(user=alice, conversation_id=None, content="hi")
    assert REGISTRY.get_sample_value("chatsite:admission_rejections_total", labels) == before + 1
    assert refusals.refusals_recent(minutes=1)[("free", "too_many_generations")] == 1
    assert not Message.objects.exists()


def test_rollout_split_is_exact_and_even_over_consecutive_replies():
    for percent in (0, 1, 10, 33, 50, 100):
        assert sum(takes_candidate(n, percent) for n in range(1000)) == 10 * percent
    assert [takes_candidate(n, 50) for n in range(4)] == [False, True, False, True]
    assert [n for n in range(30) if takes_candidate(n, 10)] == [9, 19, 29]


def test_rollout_at_50_percent_pins_consecutive_replies_to_both_versions(redis_clean):
    rollout_set(model_name=MODEL, to_version="v2", percent=50, stable_version="v1")
    routes = [
        route_for(model_name=MODEL, message_id=i, default_queue="inference.free") for i in range(0, 200, 2)
    ]
    assert [v for _, v in routes[:4]] == ["v1", "v2", "v1", "v2"]
    assert sum(1 for _, v in routes if v == "v2") == 50
    assert {q for q, _ in routes} == {queue_for(MODEL, "v1"), queue_for(MODEL, "v2")}
    rollout_set(model_name=MODEL, to_version="v2", percent=0)
    assert route_for(model_name=MODEL, message_id=1000, default_queue="q") == (queue_for(MODEL, "v1"), "v1")
    ModelRollout.objects.all().delete()
    assert route_for(model_name=MODEL, message_id=1000, default_queue="q") == ("q", "")


def test_dispatch_under_rollout_records_the_version_and_uses_its_queue(
    alice, redis_clean, django_capture_on_commit_callbacks
):
    call_command(
        "rollout",
        MODEL,
        "--to",
        "v2",
        "--percent",
        "100",
        "--stable",
        "v1",
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    with django_capture_on_commit_callbacks(execute=True):
        ticket = generations.reply_request(user=alice, conversation_id=None, content="hello")
    ticket.message.refresh_from_db()
    assert ticket.message.model_version == "v2"
    free_priority = Tier.objects.get(name="free").queue_priority
    assert broker_take(queue_for(MODEL, "v2")) == [([ticket.message.id], min(free_priority, 10))]
    assert broker_take(queue_for(MODEL)) == []


def test_rollout_command_rejects_bad_input_and_clears():
    with pytest.raises(CommandError, match="unknown model"):
        call_command("rollout", "nope", "--to", "v2", "--percent", "10")
    with pytest.raises(CommandError, match="between 0 and 100"):
        call_command("rollout", MODEL, "--to", "v2", "--percent", "150")
    assert not ModelRollout.objects.exists()
    out = io.StringIO()
    call_command("rollout", MODEL, "--to", "v2", "--percent", "10", stdout=out, stderr=io.StringIO())
    assert "10% -> v2" in out.getvalue() and ModelRollout.objects.get().percent == 10
    call_command("rollout", MODEL, "--clear", stdout=out)
    assert not ModelRollout.objects.exists()


def test_fleet_command_lists_workers_and_replies(alice, redis_clean):
    publish_worker(
        redis_clean,
        model_version="v1",
        running=2,
        waiting=1,
        kv_used_tokens=50,
        kv_total_tokens=100,
        metrics_port=9101,
    )
    conversation = services.conversation_create(owner=alice, title="t")
    services.message_create(conversation=conversation, role="assistant", content="", status="queued")
    out = io.StringIO()
    call_command("fleet", stdout=out)
    text = out.getvalue()
    assert f"{MODEL}@v1" in text and "gpu@gpu-host" in text and " 50.0 " in text and "9101" in text
    assert "queued per tier: free=1" in text and "queued=1, streaming=0" in text
    broker_line = next(line for line in text.splitlines() if "broker queues:" in line)
    assert f"inference.{MODEL}=0" in broker_line  # among the test settings' drill aliases


def test_drain_resolves_workers_by_id_node_or_host(redis_clean):
    publish_worker(redis_clean)
    assert Drain.resolve("gpu-host:123").node == "gpu@gpu-host"
    assert Drain.resolve("gpu@gpu-host").worker_id == "gpu-host:123"
    assert Drain.resolve("gpu-host").worker_id == "gpu-host:123"
    with pytest.raises(CommandError, match="no live worker"):
        Drain.resolve("elsewhere")


def test_drain_waits_for_active_replies_and_reports_leftovers(redis_clean):
    status = publish_worker(redis_clean, active_replies=2)
    drain = Drain()
    assert drain.wait_idle(status, timeout=0.2, poll_s=0.05) == 2
    publish_worker(redis_clean, active_replies=0)
    assert drain.wait_idle(status, timeout=0.2, poll_s=0.05) == 0
    fleet.unpublish(status.worker_id, client=redis_clean)
    assert drain.active_replies(status) is None


def test_api_requests_are_counted_by_status(client):
    before = REGISTRY.get_sample_value("chatsite:api_requests_total", {"status": "404"}) or 0
    ok_before = REGISTRY.get_sample_value("chatsite:api_requests_total", {"status": "200"})
    client.get("/v1/no-such-endpoint")
    client.get("/healthz")  # outside /v1/: not counted
    assert REGISTRY.get_sample_value("chatsite:api_requests_total", {"status": "404"}) == before + 1
    assert REGISTRY.get_sample_value("chatsite:api_requests_total", {"status": "200"}) == ok_before


def test_refusals_noted_on_the_event_loop_survive_a_redis_error_until_the_next_flush(
    redis_clean, monkeypatch
):
    import asyncio

    refusals.refusals_flush()  # anything an earlier test of this process noted

    async def gate_refuses():
        refusals.refusal_note(tier="free", reason="busy")
        refusals.refusal_note(tier="free", reason="busy")

    asyncio.run(gate_refuses())

    def outage():
        raise ConnectionError("redis down")

    monkeypatch.setattr(refusals.broadcast, "redis_client", outage)
    assert refusals.refusals_flush() == 0
    monkeypatch.undo()
    assert refusals.refusals_recent(minutes=1).get(("free", "busy")) is None
    assert refusals.refusals_flush() == 2
    assert refusals.refusals_recent(minutes=1)[("free", "busy")] == 2


def test_the_rollout_is_read_once_per_cache_period_and_a_change_saved_here_applies_at_once(
    settings, django_assert_num_queries
):
    from django.db import connection

    from inference.rollout import forget_rollouts

    settings.ADMISSION_LOAD_CACHE_S = 60
    forget_rollouts()
    with django_assert_num_queries(1):
        assert route_for(model_name=MODEL, message_id=1, default_queue="q") == ("q", "")
        assert route_for(model_name=MODEL, message_id=2, default_queue="q") == ("q", "")  # cached
    # Another process's change (no signal here) is seen once the cached read is older than the period.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO observability_modelrollout (model_name, stable_version, candidate_version, percent,"
            " updated_at) VALUES (%s, 'v1', 'v2', 100, now())",
            [MODEL],
        )
    assert route_for(model_name=MODEL, message_id=3, default_queue="q") == ("q", "")
    settings.ADMISSION_LOAD_CACHE_S = 0
    assert route_for(model_name=MODEL, message_id=4, default_queue="q")[1] == "v2"
    settings.ADMISSION_LOAD_CACHE_S = 60
    rollout_set(model_name=MODEL, to_version="v3", percent=100)  # saved in this process: at once
    assert route_for(model_name=MODEL, message_id=5, default_queue="q")[1] == "v3"
