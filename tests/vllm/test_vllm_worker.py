"""A worker whose engine is vLLM, end to end: the page's WebSocket and the OpenAI-compatible API stream from it,
Stop frees its one slot, a paid reply overtakes earlier free ones, usage is recorded, greedy output equals the
native engine's on the same weights, and killing vLLM's engine core mid-stream leaves nothing stuck.

The engine-core kill ends the worker, so that test runs last in this module."""

import asyncio
import os
import signal
import threading
import time
import urllib.request

import openai
import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from accounts.sessions import session_cookie_for
from api.services import api_key_create
from billing.models import Tier, UsageRecord
from conversations.models import Message
from events import broadcast
from inference import fleet
from tests.conftest import broker_take
from tests.sockets import open_socket
from tests.vllm.conftest import MODEL, engine_core_pids

# redis_clean: message ids restart with each test database, so an earlier run's replay streams must go.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("redis_clean"),
]

LONG = "Write a very long, detailed story about a dragon who learns to bake bread. Use many paragraphs."
#: The fixed prompt set of the greedy comparison.
GREEDY_PROMPTS = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Explain in one sentence what a CPU does.",
    "Write a haiku about the sea.",
    "List the first five prime numbers.",
    "Who wrote Romeo and Juliet?",
]


def client_for(user, base_url) -> openai.OpenAI:
    _, key = api_key_create(user=user, name="vllm-tests")
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=180)


def wait_for(predicate, timeout=60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def vllm_status() -> fleet.WorkerStatus | None:
    return next((w for w in fleet.live_workers() if w.backend == "vllm"), None)


def test_the_worker_announces_its_backend_and_serves_vllms_metrics(vllm_worker, client, redis_clean):
    # The metrics endpoint starts just after the engine is ready; its port is published once it listens.
    assert wait_for(lambda: (s := vllm_status()) is not None and s.metrics_port, 30)
    status = vllm_status()
    assert status.ready and status.health == "ok" and status.model == MODEL
    # vLLM's own Prometheus series and chatsite's engine gauges, on the worker's one metrics port.
    metrics = (
        urllib.request.urlopen(f"http://127.0.0.1:{status.metrics_port}/metrics", timeout=10).read().decode()
    )
    assert "vllm:num_requests_running" in metrics and "vllm:kv_cache_usage_perc" in metrics
    assert 'chatsite:num_requests_running{model="smollm2-135m-instruct"}' in metrics
    body = client.get("/readyz").json()
    assert {"backend": "vllm", "health": "ok", "ready": True}.items() <= next(
        w for w in body["workers"] if w["worker"] == status.worker_id
    ).items()


@pytest.fixture
def session_cookie(alice, client):
    client.force_login(alice)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


@pytest.mark.asyncio
async def test_the_page_streams_a_reply_from_vllm_and_records_usage(
    vllm_worker, alice, session_cookie, redis_clean
):
    cookie = session_cookie
    await database_sync_to_async(Tier.objects.filter(name="free").update)(max_reply_tokens=24)
    ws = await open_socket(cookie)
    await ws.send_json_to(
        {"type": "send", "conversation_id": None, "content": "What is the capital of France?"}
    )
    queued = await ws.receive_json_from(timeout=60)
    frames = []
    while not frames or frames[-1]["type"] != "done":
        frames.append(await ws.receive_json_from(timeout=120))
    tokens = [f for f in frames if f["type"] == "token"]
    assert frames[0]["type"] == "started" and tokens
    assert [t["seq"] for t in tokens] == list(range(len(tokens)))
    done = frames[-1]
    message = await database_sync_to_async(Message.objects.get)(pk=queued["message_id"])
    assert done["status"] == message.status == "completed"
    assert (
        message.content == "".join(t["text"] for t in tokens) == done["content"] and message.content.strip()
    )
    assert 0 < message.completion_tokens <= 24 and message.prompt_tokens > 0 and message.ttft_ms is not None
    record = await database_sync_to_async(UsageRecord.objects.get)(message_id=message.id)
    assert (record.user_id, record.prompt_tokens, record.completion_tokens) == (
        alice.id,
        message.prompt_tokens,
        message.completion_tokens,
    )
    await ws.disconnect()


def test_the_api_streams_from_vllm_with_usage(vllm_worker, make_user, live_server_url):
    carol = make_user("carol", tier="paid")
    api = client_for(carol, live_server_url)
    stream = api.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colours of the rainbow."}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        store=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    reply = Message.objects.get(conversation__owner=carol, role="assistant")
    assert text.strip() and reply.content == text and reply.status == "completed"
    assert usage.completion_tokens == reply.completion_tokens and usage.prompt_tokens == reply.prompt_tokens
    assert UsageRecord.objects.get(message=reply).completion_tokens == usage.completion_tokens


def test_stop_frees_the_one_slot_for_the_next_reply(vllm_worker, make_user, live_server_url):
    dave, erin = make_user("dave", tier="paid"), make_user("erin", tier="paid")
    stream = client_for(dave, live_server_url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": LONG}], max_tokens=1500, stream=True, store=True
    )
    got = 0
    for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got >= 3:
            break
    stream.close()  # the client hangs up: the reply is stopped and vLLM aborts the request
    long_reply = Message.objects.get(conversation__owner=dave, role="assistant")
    assert wait_for(lambda: Message.objects.get(pk=long_reply.pk).status == "cancelled", 30)
    assert wait_for(lambda: (s := vllm_status()) is not None and s.running == 0 and s.waiting == 0, 15)
    # The slot is free: the next reply completes though the stopped one had 1,500 tokens to go.
    answer = client_for(erin, live_server_url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8
    )
    long_reply.refresh_from_db()
    assert answer.choices[0].message.content and long_reply.completion_tokens < 1500
    assert UsageRecord.objects.get(message=long_reply).completion_tokens == long_reply.completion_tokens


def test_a_paid_reply_overtakes_free_replies_queued_before_it(vllm_worker, make_user, live_server_url):
    """One slot, held by a free reply; two free replies wait in vLLM's queue, then a paid one joins them; the
    slot's holder hangs up once all three wait in the engine, and the paid reply is served first."""
    users = [make_user(f"free{i}") for i in range(3)]
    frank = make_user("frank", tier="paid")
    # The slot's holder asks for a reply longer than the free plan's default limit (a larger max_tokens is a 400).
    Tier.objects.filter(name="free").update(max_reply_tokens=1500)
    done_at: dict[str, float] = {}
    release = threading.Event()

    def hold_the_slot():
        stream = client_for(users[0], live_server_url).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": LONG}],
            max_tokens=1500,
            # Greedy with no penalty: this prompt then runs to the 1500-token limit (the native engine's float32
            # greedy reply does). The chat's sampling ended it after 557-1500 tokens in six draws, and a holder
            # that ends early lets the free replies through before the paid one arrives.
            temperature=0,
            presence_penalty=0,
            stream=True,
            store=True,
        )
        next(iter(stream))
        release.wait(120)
        stream.close()  # the client hangs up: the reply is stopped and its slot freed

    def ask(name, user):
        client_for(user, live_server_url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, store=True
        )
        done_at[name] = time.monotonic()

    def claimed(owners) -> int:
        return Message.objects.filter(
            conversation__owner__in=owners, role="assistant", status="streaming"
        ).count()

    threads = [threading.Thread(target=hold_the_slot)]
    threads[0].start()
    assert wait_for(lambda: claimed(users[:1]) == 1)
    for i in (1, 2):
        threads.append(threading.Thread(target=ask, args=(f"free{i}", users[i])))
        threads[-1].start()
    assert wait_for(lambda: claimed(users[1:]) == 2, 60)  # the free replies are in the engine first
    threads.append(threading.Thread(target=ask, args=("paid", frank)))
    threads[-1].start()
    # All three wait in the engine behind the slot's holder (the worker's published load counts them).
    assert wait_for(lambda: claimed([frank]) == 1 and (s := vllm_status()) is not None and s.waiting >= 3, 60)
    release.set()
    for t in threads:
        t.join(300)
    assert set(done_at) == {"free1", "free2", "paid"}
    assert done_at["paid"] < min(done_at["free1"], done_at["free2"]), done_at


def native_greedy(prompts: list[str], model_dir: str, cache_dir: str) -> list[list[int]]:
    """The native engine's greedy first 32 tokens of each prompt, float32 on the same prepared weights."""
    from inference.engine import EngineConfig, LLMEngine, ModelSpec, SamplingParams, TokenEvent

    spec = ModelSpec(name="greedy-reference", source=model_dir, dtype="float32", context_length=2048)
    engine = LLMEngine.from_spec(spec, EngineConfig(max_num_seqs=8, prefix_cache_tokens=0), cache_dir)
    engine.start()
    try:
        out = []
        for prompt in prompts:
            ids = engine.render_chat([{"role": "user", "content": prompt}])
            handle = engine.submit(ids, SamplingParams(temperature=0.0, max_new_tokens=32))
            out.append([t for e in handle.events() if isinstance(e, TokenEvent) for t in e.token_ids])
        return out
    finally:
        engine.shutdown()


def test_greedy_output_equals_the_native_engines_for_32_tokens(
    vllm_worker, make_user, live_server_url, tmp_path
):
    from transformers import AutoTokenizer

    from inference.backends.build import vllm_weights

    model_dir = str(vllm_weights(MODEL))
    reference = native_greedy(GREEDY_PROMPTS, model_dir, str(tmp_path / "native-cache"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    api = client_for(make_user("gina", tier="paid"), live_server_url)
    matches = []
    for prompt, native_ids in zip(GREEDY_PROMPTS, reference, strict=True):
        reply = api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=32,
            temperature=0,
            presence_penalty=0,  # an OpenAI penalty turns chatsite's default repetition penalty off
        )
        vllm_text = reply.choices[0].message.content
        native_text = tokenizer.decode(native_ids, skip_special_tokens=True)
        vllm_ids = tokenizer.encode(vllm_text, add_special_tokens=False)
        native_ids = tokenizer.encode(native_text, add_special_tokens=False)
        same = next(
            (i for i, (a, b) in enumerate(zip(vllm_ids, native_ids, strict=False)) if a != b),
            min(len(vllm_ids), len(native_ids)),
        )
        matches.append((prompt, same, vllm_text == native_text))
    print("\ngreedy first-32-token matches, vLLM vs native (float32, same weights):")
    for prompt, same, equal in matches:
        ended = " (both ended at EOS)" if equal and same < 32 else ""
        print(f"  {same:>2}/32 tokens match{ended}, text {'identical' if equal else 'DIFFERENT'}: {prompt}")
    assert all(equal for _, _, equal in matches), matches


@pytest.mark.asyncio
async def test_killing_the_engine_core_mid_stream_leaves_nothing_stuck(
    vllm_worker, make_user, live_server_url
):
    """The streaming reply ends ``interrupted`` with its text, the reply waiting behind it goes back to
    ``queued`` with its task back in the broker, and the worker leaves the fleet and exits."""
    hank = await database_sync_to_async(make_user)("hank", tier="paid")
    ivy = await database_sync_to_async(make_user)("ivy", tier="paid")
    api_h = await database_sync_to_async(client_for)(hank, live_server_url)

    def stream_long():
        try:
            for _ in api_h.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": LONG}],
                max_tokens=1500,
                stream=True,
                store=True,
            ):
                pass
        except openai.APIError:
            pass

    long_task = asyncio.create_task(asyncio.to_thread(stream_long))

    def has_streamed() -> bool:
        reply = Message.objects.filter(conversation__owner=hank, role="assistant", status="streaming").first()
        return reply is not None and bool(broadcast.stream_text(reply.id))

    streaming = database_sync_to_async(has_streamed)
    deadline = time.monotonic() + 120
    while not await streaming():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    # The reply behind it comes from the page: a browser keeps waiting, where an API client that timed out
    # would cancel its reply.
    ws = await open_socket(await database_sync_to_async(session_cookie_for)(ivy))
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Say hello."})
    assert (await ws.receive_json_from(timeout=60))["type"] == "queued"
    waiting = database_sync_to_async(
        lambda: Message.objects.filter(conversation__owner=ivy, role="assistant", status="streaming").exists()
    )
    while not await waiting():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    pids = engine_core_pids(vllm_worker)
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    await asyncio.to_thread(vllm_worker.proc.wait, 90)  # the worker shuts itself down
    await long_task
    streamed = await database_sync_to_async(Message.objects.get)(conversation__owner=hank, role="assistant")
    queued = await database_sync_to_async(Message.objects.get)(conversation__owner=ivy, role="assistant")
    assert streamed.status == "interrupted" and streamed.content and streamed.error
    assert queued.status == "queued"
    # Its task is back in the broker for the next worker (taken here so no later test meets it).
    tasks = await asyncio.to_thread(broker_take, f"inference.{MODEL}")
    assert [args for args, _ in tasks] == [[queued.id]]
    assert "engine died" in vllm_worker.log_path.read_text()
    assert await asyncio.to_thread(vllm_status) is None  # it left the fleet
    await ws.disconnect()
