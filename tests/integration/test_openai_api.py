"""The OpenAI-compatible API end to end, with real clients (the official ``openai`` package and LangChain's
``ChatOpenAI``) against a real daphne serving ``chatsite.asgi``, a real Celery worker running the real default
model, PostgreSQL and Redis. Replies are kept to a few tokens (two shared CPU cores)."""

import http.client
import json
import socket
import struct
import time
from urllib.parse import urlparse

import openai
import pytest

from api.services import api_key_create
from billing.models import DailyQuota, Tier, UsageRecord
from billing.quota import quota_day
from conversations.models import Conversation, Message
from inference import fleet
from tests.live_stack import live_server_url  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

MODEL = "smollm2-135m-instruct"
PROMPT = [{"role": "user", "content": "Name three colours of the rainbow."}]
GREEDY = {"temperature": 0, "seed": 42}


@pytest.fixture
def carol(make_user):
    """A paid user (60 requests/minute, 4 replies at once)."""
    return make_user("carol", tier="paid")


@pytest.fixture
def api(celery_worker, live_server_url, carol, redis_clean):  # noqa: F811
    """An ``openai.OpenAI`` client with carol's key, no retries (so error statuses surface as they are)."""
    _, key = api_key_create(user=carol, name="tests")
    client = openai.OpenAI(base_url=f"{live_server_url}/v1", api_key=key, max_retries=0, timeout=120)
    client.raw_key = key
    yield client
    client.close()


def raw_sse(base_url, key, body):
    """POST a streaming completion with http.client; returns (status, headers, list of data payloads)."""
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    response = conn.getresponse()
    payloads = [
        line[len("data: ") :] for line in response.read().decode().splitlines() if line.startswith("data: ")
    ]
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, payloads


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_non_streaming_completion_returns_usage_and_is_not_stored(api, carol, celery_worker):  # noqa: F811
    raw = api.chat.completions.with_raw_response.create(model=MODEL, messages=PROMPT, max_tokens=8, **GREEDY)
    completion = raw.parse()
    assert completion.object == "chat.completion" and completion.model == MODEL
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage.completion_tokens <= 8 and completion.usage.prompt_tokens > 0
    assert (
        completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    record = UsageRecord.objects.get(user=carol)
    assert (record.prompt_tokens, record.completion_tokens) == (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
    )
    assert not Conversation.objects.filter(owner=carol).exists()  # store defaults to false
    # One grep follows the completion: the worker's line for the reply carries the response's x-request-id.
    request_id, message_id = raw.headers["x-request-id"], completion.id.removeprefix("chatcmpl-")
    finished = [
        line
        for line in celery_worker.log_path.read_text().splitlines()
        if "reply finished" in line and f"message_id={message_id} " in line
    ]
    assert len(finished) == 1 and f"request_id={request_id} " in finished[0], finished


def test_stream_is_in_openais_order_with_include_usage_and_equals_non_streamed_text(api, live_server_url):  # noqa: F811
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 12, **GREEDY}
    plain = api.chat.completions.create(**body)
    status, headers, payloads = raw_sse(
        live_server_url, api.raw_key, {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert headers["x-request-id"] and int(headers["x-ratelimit-remaining-requests"]) < 60
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["id"].startswith("chatcmpl-") and chunks[0]["id"] != plain.id
    assert len({(c["id"], c["created"]) for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    first, *middle, finish, usage = chunks
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert all(
        "role" not in c["choices"][0]["delta"] and c["choices"][0]["finish_reason"] is None for c in middle
    )
    assert finish["choices"][0]["finish_reason"] == plain.choices[0].finish_reason
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == plain.usage.total_tokens
    assert all(c["usage"] is None for c in chunks[:-1])
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert streamed == plain.choices[0].message.content

    # The official client reads the same stream.
    parts, usage_seen = [], None
    for chunk in api.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        else:
            usage_seen = chunk.usage
    assert "".join(parts) == plain.choices[0].message.content
    assert usage_seen.completion_tokens == plain.usage.completion_tokens


def test_finish_reason_length_and_stop_sequences(api):
    long = api.chat.completions.create(model=MODEL, messages=PROMPT, max_completion_tokens=4, **GREEDY)
    assert long.choices[0].finish_reason == "length" and long.usage.completion_tokens == 4

    reference = api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=12, **GREEDY)
    text = reference.choices[0].message.content
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    stopped = api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=12, stop=[stop], **GREEDY)
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(stop)]
    assert stop not in stopped.choices[0].message.content


def test_store_true_completion_appears_in_history(api, carol, live_server_url):  # noqa: F811
    completion = api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=4, store=True, **GREEDY)
    conversation = Conversation.objects.get(owner=carol)
    assert conversation.stored
    reply = conversation.messages.get(role="assistant")
    assert reply.content == completion.choices[0].message.content and reply.status == "completed"
    assert reply.sampling == {"temperature": 0.0, "seed": 42, "max_tokens": 4}
    url = urlparse(live_server_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("GET", "/api/conversations", headers={"Authorization": f"Bearer {api.raw_key}"})
    history = json.loads(conn.getresponse().read())
    conn.close()
    assert [c["id"] for c in history["items"]] == [conversation.id]


def test_error_rows_with_the_official_client(api, carol, make_user):
    with pytest.raises(openai.AuthenticationError) as exc:
        openai.OpenAI(base_url=api.base_url, api_key="cs-bad_key", max_retries=0).models.list()
    assert exc.value.status_code == 401 and exc.value.code == "invalid_api_key"
    assert exc.value.response.headers["x-request-id"]

    with pytest.raises(openai.NotFoundError) as exc:
        api.chat.completions.create(model="gpt-4o", messages=PROMPT)
    assert exc.value.code == "model_not_found" and exc.value.param == "model"

    with pytest.raises(openai.BadRequestError) as exc:
        api.chat.completions.create(model=MODEL, messages=PROMPT, n=2)
    assert exc.value.param == "n" and exc.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as exc:
        api.chat.completions.create(
            model=MODEL, messages=PROMPT, tools=[{"type": "function", "function": {"name": "f"}}]
        )
    assert exc.value.param == "tools"

    # The day's quota ledger (billing/quota.py) is full: admission reserves against it, not the usage rows.
    DailyQuota.objects.update_or_create(
        user=carol, day=quota_day(), defaults={"used_tokens": carol.tier.tokens_per_day}
    )
    with pytest.raises(openai.RateLimitError) as exc:
        api.chat.completions.create(model=MODEL, messages=PROMPT)
    assert exc.value.code == "insufficient_quota"
    assert exc.value.response.headers["x-should-retry"] == "false"
    DailyQuota.objects.filter(user=carol).update(used_tokens=0)

    Tier.objects.filter(name="paid").update(requests_per_minute=1)
    api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as exc:
        api.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=1)
    headers = exc.value.response.headers
    assert exc.value.code == "rate_limit_exceeded" and int(headers["retry-after"]) >= 1
    assert headers["x-ratelimit-limit-requests"] == "1" and headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    Tier.objects.filter(name="paid").update(requests_per_minute=60)

    # Overload: 256 paid replies of another user are queued ahead, far beyond the hard cap on expected wait.
    dave = make_user("dave", tier="paid")
    conversation = Conversation.objects.create(owner=dave, title="backlog")
    Message.objects.bulk_create(
        [
            Message(conversation=conversation, role="assistant", status="queued", model_name=MODEL)
            for _ in range(256)
        ]
    )
    time.sleep(1.5)  # the web process reads the load through a 1 s cache
    with pytest.raises(openai.InternalServerError) as exc:
        api.chat.completions.create(model=MODEL, messages=PROMPT)
    assert exc.value.status_code == 503 and exc.value.code == "busy"
    assert int(exc.value.response.headers["retry-after"]) >= 1
    conversation.delete()
    time.sleep(1.5)  # the next test must not meet the backlog in the web process's load cache


def test_max_tokens_above_the_plans_reply_limit_is_a_400_naming_the_parameter(api, carol):
    limit = carol.tier.max_reply_tokens
    for name in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(openai.BadRequestError) as exc:
            api.chat.completions.create(model=MODEL, messages=PROMPT, **{name: limit + 1})
        assert (exc.value.status_code, exc.value.param, exc.value.code) == (400, name, "invalid_value")
        assert f"at most {limit} completion tokens" in exc.value.message
    assert not Message.objects.filter(conversation__owner=carol).exists()


def test_user_and_metadata_are_stored_with_the_completion(api, carol):
    api.chat.completions.create(
        model=MODEL,
        messages=PROMPT,
        max_tokens=1,
        store=True,
        user="end-user-42",
        metadata={"ticket": "T-7", "team": "support"},
    )
    reply = Message.objects.get(conversation__owner=carol, role="assistant")
    assert reply.api_user == "end-user-42"
    assert reply.api_metadata == {"ticket": "T-7", "team": "support"}
    with pytest.raises(openai.BadRequestError) as exc:
        api.chat.completions.create(model=MODEL, messages=PROMPT, metadata={f"k{i}": "v" for i in range(17)})
    assert exc.value.param == "metadata"


def engine_idle():
    return all(w.running == 0 and w.waiting == 0 for w in fleet.live_workers())


def test_disconnect_mid_stream_cancels_frees_the_slot_and_records_usage(api, carol):
    stream = api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a very long story about a dragon who bakes bread."}],
        max_tokens=400,
        store=True,
        temperature=0,
        stream=True,
    )
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
            if got >= 3:
                break
    stream.close()
    reply = Message.objects.get(conversation__owner=carol, role="assistant")
    assert wait_for(lambda: Message.objects.get(pk=reply.pk).status == "cancelled", 30)
    assert wait_for(engine_idle, 10)
    reply.refresh_from_db()
    assert reply.finish_reason == "cancelled" and 3 <= reply.completion_tokens < 400
    record = UsageRecord.objects.get(message=reply)
    assert record.completion_tokens == reply.completion_tokens


def send_and_hang_up(base_url, key, body, *, before_close=None):
    """Send a completion request on a raw socket and close it without reading a byte of the answer;
    ``before_close()`` runs (and may wait) between the two."""
    url = urlparse(base_url)
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.hostname}:{url.port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(head + payload)
        if before_close is not None:
            before_close()
        # Reset rather than FIN, as a client that crashed or was killed would: nothing unread lingers.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


LONG_STREAM = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Write a very long story about a dragon who bakes bread."}],
    "max_tokens": 400,
    "store": True,
    "temperature": 0,
    "stream": True,
}


def test_disconnect_right_after_the_request_cancels_and_frees_the_slot(api, carol, live_server_url):  # noqa: F811
    # The client hangs up as soon as its reply exists (before the response headers or the first chunk can
    # have been read): the generation is cancelled, not left running for nobody.
    replies = Message.objects.filter(conversation__owner=carol, role="assistant")
    send_and_hang_up(
        live_server_url, api.raw_key, LONG_STREAM, before_close=lambda: wait_for(replies.exists, 10)
    )
    reply = replies.get()
    assert wait_for(lambda: Message.objects.get(pk=reply.pk).status == "cancelled", 10)
    assert wait_for(engine_idle, 5)
    reply.refresh_from_db()
    assert reply.completion_tokens < 400


def test_hang_up_with_the_request_leaves_nothing_generating(api, carol, live_server_url):  # noqa: F811
    # The client closes the moment its request is sent: whichever stage the view was at (authenticating,
    # storing the reply, sending headers), no generation runs on for nobody and any reply is cancelled.
    send_and_hang_up(live_server_url, api.raw_key, LONG_STREAM)
    replies = Message.objects.filter(conversation__owner=carol, role="assistant")
    time.sleep(1.0)
    assert wait_for(lambda: not replies.exclude(status="cancelled").exists(), 10), list(
        replies.values_list("status", flat=True)
    )
    assert wait_for(engine_idle, 5)


def test_non_streaming_client_timeout_cancels_the_generation(api, carol):
    impatient = api.with_options(timeout=1.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Write a very long story about a dragon who bakes bread."}],
            max_tokens=400,
            store=True,
            temperature=0,
        )
    assert wait_for(lambda: Message.objects.filter(conversation__owner=carol, role="assistant").exists(), 10)
    reply = Message.objects.get(conversation__owner=carol, role="assistant")
    assert wait_for(lambda: Message.objects.get(pk=reply.pk).status == "cancelled", 30)
    assert wait_for(engine_idle, 10)
    assert Message.objects.get(pk=reply.pk).completion_tokens < 400


def test_langchain_chat_openai_plain_and_streamed(api):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=MODEL,
        base_url=str(api.base_url),
        api_key=api.raw_key,
        max_tokens=8,
        temperature=0,
        seed=42,
        max_retries=0,
    )
    plain = llm.invoke("Name three colours of the rainbow.")
    assert plain.content
    streamed = "".join(chunk.content for chunk in llm.stream("Name three colours of the rainbow."))
    assert streamed == plain.content


def test_error_after_the_stream_began_is_an_error_event(api, live_server_url):  # noqa: F811
    # The reply fails in the worker (its prompt does not fit the tier's context), after the role chunk.
    Tier.objects.filter(name="paid").update(max_context_tokens=64)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 200}], "stream": True}
    status, _headers, payloads = raw_sse(live_server_url, api.raw_key, body)
    assert status == 200
    first, last = json.loads(payloads[0]), json.loads(payloads[-1])
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert last["error"]["code"] == "failed" and "context" in last["error"]["message"]
    assert "[DONE]" not in payloads

    with pytest.raises(openai.APIError):
        for _ in api.chat.completions.create(**{k: v for k, v in body.items() if k != "stream"}, stream=True):
            pass
    Tier.objects.filter(name="paid").update(max_context_tokens=8192)
