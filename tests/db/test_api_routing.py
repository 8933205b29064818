"""``/v1/chat/completions`` routes by load like the chat: a tier with a ``degrade_to_model`` is moved to it while
its own model is busy, and the response's ``model`` names the model that answered. Two registry entries, fake
worker statuses published to the real test Redis, the real view, database and channel layer; a thread stands
in for the worker at the service level (claims the queued reply, finishes it, which publishes ``done``)."""

import json
import threading

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from api.services import api_key_create
from billing.models import Tier
from conversations import generation_worker
from conversations.admission import AdmissionRefused
from conversations.completions import completion_request
from conversations.models import Message
from inference.registry import declare_queue, queue_for
from tests.db.conftest import fake_worker, publish_worker
from tests.db.test_admission import saturate
from tests.db.test_api_requests import error_of, post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.real_fleet]

HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture
def two_models(settings, alice):
    """The free tier runs on ``big`` and moves to ``small`` while ``big``'s expected wait is above 5 s
    (one request ahead = 1 s)."""
    base = dict(settings.INFERENCE_MODELS[settings.INFERENCE_DEFAULT_MODEL])
    settings.INFERENCE_MODELS = {"big": base, "small": base}
    settings.ADMISSION_MEAN_REPLY_TOKENS = 100
    settings.ADMISSION_DECODE_TOKENS_PER_S = 100.0
    settings.API_COMPLETION_TIMEOUT_S = 15
    for name in settings.INFERENCE_MODELS:
        declare_queue(queue_for(name))
    Tier.objects.filter(name="free").update(
        model_name="big", degrade_to_model="small", degrade_after_wait_s=5, admit_max_wait_s=10
    )
    alice.refresh_from_db()
    return settings


@pytest.fixture
def key(alice):
    return api_key_create(user=alice)[1]


@pytest.fixture
def answering(alice):
    """Finish every queued reply of alice's within ~50 ms, as a worker would (``completed``, "Hi!")."""
    stop = threading.Event()

    def answer():
        try:
            while not stop.is_set():
                queued = Message.objects.filter(conversation__owner=alice, role="assistant", status="queued")
                for reply_id in queued.values_list("id", flat=True):
                    started = generation_worker.generation_start(message_id=reply_id)
                    if started is not None:
                        generation_worker.generation_finish(
                            message=started,
                            status="completed",
                            text="Hi!",
                            finish_reason="stop",
                            prompt_tokens=5,
                            completion_tokens=2,
                        )
                stop.wait(0.05)
        finally:
            connection.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(10)


def test_busy_own_model_moves_the_api_request_to_the_degrade_model_and_model_says_so(
    client, key, two_models, answering, redis_clean
):
    saturate(waiting=8, model="big")  # 8 s for a free request: over degrade_after (5), under admit (10)
    publish_worker(fake_worker("small", index=1))
    response = post(client, key, {"model": "big", "messages": HELLO})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["model"] == "small" and body["choices"][0]["message"]["content"] == "Hi!"


def test_idle_own_model_answers_as_itself(client, key, two_models, answering, redis_clean):
    saturate(waiting=2, model="big")
    publish_worker(fake_worker("small", index=1))
    response = post(client, key, {"model": "big", "messages": HELLO})
    assert response.status_code == 200, response.content
    assert response.json()["model"] == "big"


async def _read_all(chunks) -> bytes:
    return b"".join([chunk async for chunk in chunks])


def test_streamed_chunks_name_the_answering_model(async_client, key, two_models, answering, redis_clean):
    publish_worker(fake_worker("small", index=1))  # "big" has no worker: the tier is served by "small"

    async def stream() -> tuple[int, bytes]:
        # The request and its streamed body on one event loop, as under daphne: the pub/sub channel layer
        # keeps a socket's subscriptions per loop (Django's sync test client would read on another one).
        response = await async_client.post(
            "/v1/chat/completions",
            json.dumps({"model": "big", "messages": HELLO, "stream": True}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )
        if not response.streaming:
            return response.status_code, response.content
        return response.status_code, await _read_all(response.streaming_content)

    status, body = async_to_sync(stream)()
    assert status == 200
    events = body.decode()
    datas = [line.removeprefix("data: ") for line in events.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    assert {json.loads(data)["model"] for data in datas[:-1]} == {"small"}


def test_busy_degrade_model_is_503_busy(client, key, two_models, redis_clean):
    saturate(waiting=30, model="big")
    saturate(waiting=20, model="small", index=1)
    response = post(client, key, {"model": "big", "messages": HELLO})
    assert response.status_code == 503 and error_of(response)["code"] == "busy"
    assert not Message.objects.filter(conversation__owner__username="alice").exists()


def test_a_model_asked_for_by_name_is_gated_on_its_own_load_and_never_moved(alice, two_models, redis_clean):
    saturate(waiting=8, model="big")
    publish_worker(fake_worker("small", index=1))
    # The tier's fallback asked for by name is served by it, on its own (idle) load.
    assert completion_request(user=alice, model="small", messages=HELLO, sampling={}).model_name == "small"
    Message.objects.filter(status="queued").update(status="completed")
    # Without a worker for the named fallback: no_workers, not a silent move back to "big".
    from tests.db.conftest import clear_fleet

    clear_fleet()
    publish_worker(fake_worker("big"))
    with pytest.raises(AdmissionRefused) as refused:
        completion_request(user=alice, model="small", messages=HELLO, sampling={})
    assert refused.value.code == "no_workers"
