"""``/v1`` request handling with the real database and Redis, no worker: validation (every unsupported
parameter is a 400 naming it), authentication, model access, admission refusals mapped to HTTP, body limits,
request ids; the completion service's storage; the history JSON API over a browser session. Transactional:
the completion view checks the key and stores the reply on a reply-service thread (lever 37), whose database
connection sees only committed rows."""

import json

import pytest
from django.db import transaction

from api.services import api_key_create
from billing.models import DailyQuota, Tier, UsageRecord
from billing.quota import quota_day
from conversations import generation_worker, reaper
from conversations.admission import AdmissionRefused
from conversations.completions import completion_cancel, completion_request
from conversations.models import Conversation, Message
from conversations.reply_runner import sampling_for
from inference.registry import queue_for
from tests.conftest import broker_take_headers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def short_completion_timeout(settings):
    """No worker runs in this layer: a request admitted by mistake must fail fast, not after 10 minutes."""
    settings.API_COMPLETION_TIMEOUT_S = 15


MODEL = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture
def key(alice):
    return api_key_create(user=alice)[1]


def post(client, key, body, **extra):
    raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(
        "/v1/chat/completions",
        raw,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
        **extra,
    )


def error_of(response):
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"n": 2}, "n"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": "ten"}, "max_completion_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"seed": 1.5}, "seed"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
        ({"messages": [{"role": "system", "content": "only a system prompt"}]}, "messages"),
        ({"messages": [{"role": "user", "content": ""}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}, "messages"),
        ({"model": ""}, "model"),
        ({"max_tokens": 513}, "max_tokens"),  # above the free plan's reply limit (512)
        ({"max_completion_tokens": 100_000}, "max_completion_tokens"),
        ({"user": 5}, "user"),
        ({"user": "u" * 257}, "user"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"metadata": {"k": 1}}, "metadata.k"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k"),
    ],
)
def test_unsupported_or_bad_parameter_is_400_naming_it_and_stores_nothing(client, key, extra, param):
    response = post(client, key, {"model": MODEL, "messages": HELLO, **extra})
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert response["x-request-id"]
    assert not Conversation.objects.exists() and not Message.objects.exists()


def test_malformed_json_and_oversized_body_are_400_not_500(client, key, settings):
    response = post(client, key, b"{not json")
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_json"
    settings.API_MAX_BODY_BYTES = 1000
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 2000}]}
    response = post(client, key, big)
    assert response.status_code == 400 and "larger than 1000 bytes" in error_of(response)["message"]
    assert not Message.objects.exists()


def test_missing_or_bad_key_is_401_invalid_api_key(client):
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer cs-nope_nope"}, {"HTTP_AUTHORIZATION": "Basic abc"}):
        response = client.post("/v1/chat/completions", "{}", content_type="application/json", **headers)
        assert response.status_code == 401
        assert error_of(response)["code"] == "invalid_api_key" and response["x-request-id"]
        assert client.get("/v1/models", **headers).status_code == 401


def test_unknown_or_not_allowed_model_is_404(client, key):
    response = post(client, key, {"model": "gpt-4o", "messages": HELLO})
    assert response.status_code == 404
    error = error_of(response)
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    response = client.get("/v1/models/gpt-4o", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 404 and error_of(response)["code"] == "model_not_found"


def test_models_lists_only_the_tiers_models(client, key, alice, settings):
    settings.INFERENCE_MODELS = {**settings.INFERENCE_MODELS, "other-model": {"source": "x"}}
    body = client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == [MODEL]
    assert body["data"][0]["object"] == "model"
    one = client.get(f"/v1/models/{MODEL}", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    assert one["id"] == MODEL and one["owned_by"] == "chatsite"
    assert client.get("/v1/models/other-model", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 404


def test_request_id_is_echoed_or_generated_on_every_response(client, key):
    response = client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_X_REQUEST_ID="abc-123")
    assert response["x-request-id"] == "abc-123"
    generated = client.get("/v1/nothing-here", HTTP_X_REQUEST_ID="bad id with spaces")
    assert generated.status_code == 404 and generated["x-request-id"].startswith("req_")
    assert client.get("/accounts/login/")["x-request-id"].startswith("req_")


def test_request_id_is_the_request_id_of_its_log_records_and_of_the_generation_task(
    client, key, alice, redis_clean, api_logs, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = post(client, key, {"model": MODEL, "messages": HELLO, "stream": True})
    request_id = response["x-request-id"]
    assert request_id.startswith("req_")
    reply = Message.objects.get(role="assistant", conversation__owner=alice)
    queued = [r for r in api_logs if r.getMessage().startswith("completion queued")]
    assert [(r.request_id, r.message_id, r.user_id) for r in queued] == [(request_id, reply.id, alice.pk)]
    # The task carries it to the worker, whose log context for the reply takes it (conversations/tasks.py).
    assert [h.get("request_id") for h in broker_take_headers(queue_for(MODEL))] == [request_id]


def test_rate_limit_is_429_with_retry_after_and_ratelimit_headers(client, key, alice, redis_clean):
    Tier.objects.filter(name="free").update(requests_per_minute=1, max_concurrent_generations=5)
    alice.refresh_from_db()
    completion_request(user=alice, model=MODEL, messages=HELLO, sampling={})
    response = post(client, key, {"model": MODEL, "messages": HELLO})
    assert response.status_code == 429
    error = error_of(response)
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")
    assert int(response["Retry-After"]) >= 1
    assert response["x-ratelimit-limit-requests"] == "1"
    assert response["x-ratelimit-remaining-requests"] == "0"
    assert response["x-ratelimit-reset-requests"].endswith("s")
    assert Message.objects.count() == 2  # only the first request's


def test_quota_used_up_is_429_insufficient_quota_not_retryable(client, key, alice, redis_clean):
    DailyQuota.objects.create(user=alice, day=quota_day(), used_tokens=alice.tier.tokens_per_day)
    response = post(client, key, {"model": MODEL, "messages": HELLO})
    assert response.status_code == 429
    assert error_of(response)["code"] == "insufficient_quota" and response["x-should-retry"] == "false"
    assert not Message.objects.exists()


def test_too_many_generations_is_429_with_retry_after(client, key, alice, redis_clean):
    completion_request(user=alice, model=MODEL, messages=HELLO, sampling={})
    response = post(client, key, {"model": MODEL, "messages": HELLO})
    assert response.status_code == 429 and error_of(response)["code"] == "too_many_generations"
    assert response["Retry-After"]


def test_overload_is_503_with_retry_after(client, key, redis_clean, settings):
    settings.ADMISSION_HARD_CAP_WAIT_S = -1  # any expected wait is over the hard cap: everyone is refused
    response = post(client, key, {"model": MODEL, "messages": HELLO})
    assert response.status_code == 503
    assert error_of(response)["code"] == "busy" and int(response["Retry-After"]) >= 1
    assert not Message.objects.exists()


def test_completion_stores_messages_system_prompt_and_sampling_on_the_reply(alice, redis_clean):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Again"},
    ]
    sampling = {"temperature": 0.0, "seed": 7, "stop": ["\n"], "max_tokens": 5}
    reply = completion_request(user=alice, model=MODEL, messages=messages, sampling=sampling)
    conversation = reply.conversation
    assert conversation.system_prompt == "Be brief." and conversation.stored is False
    assert [(m.role, m.content) for m in conversation.messages.order_by("id")] == [
        ("user", "Hello"),
        ("assistant", "Hi!"),
        ("user", "Again"),
        ("assistant", ""),
    ]
    reply.refresh_from_db()
    assert reply.status == "queued" and reply.sampling == sampling and reply.model_name == MODEL
    system, turns, _ids = generation_worker.generation_branch(message=reply)
    assert system == "Be brief." and [t["content"] for t in turns] == ["Hello", "Hi!", "Again"]


def test_unstored_completion_is_hidden_from_history_and_deleted_when_finished_usage_kept(
    client, alice, redis_clean
):
    hidden = completion_request(user=alice, model=MODEL, messages=HELLO, sampling={})
    kept = Conversation.objects.create(owner=alice, title="kept")
    client.force_login(alice)
    assert [c["id"] for c in client.get("/api/conversations").json()["items"]] == [kept.id]
    assert client.get(f"/api/conversations/{hidden.conversation_id}").status_code == 404

    started = generation_worker.generation_start(message_id=hidden.id)
    generation_worker.generation_finish(
        message=started,
        status="completed",
        text="Hello!",
        finish_reason="stop",
        prompt_tokens=9,
        completion_tokens=3,
    )
    assert not Conversation.objects.filter(pk=hidden.conversation_id).exists()
    record = UsageRecord.objects.get(user=alice)
    assert (record.prompt_tokens, record.completion_tokens, record.message_id) == (9, 3, None)


def test_stored_completion_appears_in_history(client, alice, redis_clean):
    reply = completion_request(user=alice, model=MODEL, messages=HELLO, sampling={}, store=True)
    client.force_login(alice)
    items = client.get("/api/conversations").json()["items"]
    assert [c["id"] for c in items] == [reply.conversation_id] and items[0]["title"] == "hi"


def test_cancel_of_queued_unstored_completion_deletes_it(alice, redis_clean):
    reply = completion_request(user=alice, model=MODEL, messages=HELLO, sampling={})
    message = completion_cancel(user=alice, message_id=reply.id)
    assert message.status == "cancelled"
    assert not Conversation.objects.filter(pk=reply.conversation_id).exists()


def test_api_sampling_overrides_chat_defaults_and_is_capped_by_the_tier(settings):
    settings.INFERENCE_TEMPERATURE, settings.INFERENCE_REPETITION_PENALTY = 0.7, 1.1
    browser = sampling_for(max_new_tokens=512)
    assert (browser.temperature, browser.repetition_penalty, browser.max_new_tokens) == (0.7, 1.1, 512)
    api = sampling_for(
        max_new_tokens=512,
        overrides={"temperature": 0.0, "seed": 3, "stop": ["x"], "max_tokens": 9999, "presence_penalty": 0.5},
    )
    assert (api.temperature, api.seed, api.stop, api.max_new_tokens) == (0.0, 3, ("x",), 512)
    assert (api.presence_penalty, api.repetition_penalty) == (0.5, 1.0)
    assert sampling_for(max_new_tokens=512, overrides={"max_tokens": 4}).max_new_tokens == 4


def test_history_api_pages_renames_deletes_over_session_with_csrf(alice):
    from django.test import Client

    conversation = Conversation.objects.create(owner=alice, title="first")
    for i in range(5):
        Message.objects.create(conversation=conversation, role="user", content=f"m{i}")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    body = browser.get(f"/api/conversations/{conversation.id}?per_page=2&page=3").json()
    assert body["messages"]["count"] == 5 and body["messages"]["pages"] == 3
    assert [m["content"] for m in body["messages"]["items"]] == ["m4"]
    refused = browser.patch(
        f"/api/conversations/{conversation.id}", {"title": "x"}, content_type="application/json"
    )
    assert refused.status_code in (401, 403)
    browser.get("/settings/api-keys/")  # a page with a form sets the csrftoken cookie
    token = browser.cookies["csrftoken"].value
    renamed = browser.patch(
        f"/api/conversations/{conversation.id}",
        {"title": "  renamed "},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=token,
    )
    assert renamed.status_code == 200 and renamed.json()["title"] == "renamed"
    conversation.refresh_from_db()
    assert conversation.title == "renamed"
    assert browser.delete(f"/api/conversations/{conversation.id}", HTTP_X_CSRFTOKEN=token).status_code == 204
    assert not Conversation.objects.filter(pk=conversation.pk).exists()


def test_history_list_is_newest_first_and_paginated(client, alice):
    ids = [Conversation.objects.create(owner=alice, title=f"c{i}").id for i in range(3)]
    client.force_login(alice)
    first = client.get("/api/conversations?per_page=2").json()
    assert (first["count"], first["pages"]) == (3, 2)
    assert [c["id"] for c in first["items"]] == ids[::-1][:2]
    assert client.get("/api/conversations").status_code == 200
    client.logout()
    assert client.get("/api/conversations").status_code == 401


def test_openapi_document_is_published(client):
    doc = client.get("/api/openapi.json").json()
    assert doc["info"]["title"] == "chatsite history API"
    assert "/api/conversations" in doc["paths"] and "/api/conversations/{conversation_id}" in doc["paths"]


def test_transaction_rolls_back_completion_when_admission_refuses(alice, settings):
    settings.ADMISSION_HARD_CAP_WAIT_S = -1  # any expected wait is over the hard cap: everyone is refused
    with pytest.raises(AdmissionRefused), transaction.atomic():
        completion_request(user=alice, model=MODEL, messages=HELLO, sampling={})
    assert not Conversation.objects.exists()


def test_request_id_is_on_redirects_and_csrf_failures_too(alice):
    from django.test import Client

    assert Client().get("/settings/api-keys")["x-request-id"]  # APPEND_SLASH redirect
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    refused = strict.post("/settings/api-keys/", {"name": "x"})
    assert refused.status_code == 403 and refused["x-request-id"]


def test_reaped_unstored_completion_is_deleted(alice, redis_clean):
    reply = completion_request(user=alice, model=MODEL, messages=HELLO, sampling={})
    generation_worker.generation_start(message_id=reply.id)
    reaped = reaper.generations_reap_interrupted(is_alive=lambda _id: False, grace_s=-1)
    assert reaped == [reply.id]
    assert not Conversation.objects.filter(pk=reply.conversation_id).exists()
