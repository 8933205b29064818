"""The chat consumer's web metrics: open sockets, frames by direction and type, admissions."""

import pytest
from channels.db import database_sync_to_async
from prometheus_client import REGISTRY

from tests.db.test_consumer import session_cookie  # noqa: F401
from tests.sockets import open_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_socket_and_frames_are_counted_and_bad_types_stay_bounded(session_cookie, redis_clean):  # noqa: F811
    open_before = sample("chatsite:websocket_connections_open")
    other_before = sample("chatsite:websocket_frames_total", direction="in", type="other")
    errors_before = sample("chatsite:websocket_frames_total", direction="out", type="error")
    admitted_before = sample("chatsite:admissions_total", tier="free")
    ws = await open_socket(session_cookie)
    assert sample("chatsite:websocket_connections_open") == open_before + 1
    await ws.send_json_to({"type": "no-such-type-" + "x" * 100})
    assert (await ws.receive_json_from())["type"] == "error"
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "Hi"})
    assert (await ws.receive_json_from())["type"] == "queued"
    assert sample("chatsite:websocket_frames_total", direction="in", type="other") == other_before + 1
    assert sample("chatsite:websocket_frames_total", direction="out", type="error") == errors_before + 1
    assert sample("chatsite:admissions_total", tier="free") == admitted_before + 1
    await ws.disconnect()
    assert sample("chatsite:websocket_connections_open") == open_before
    from conversations.models import Message

    assert await database_sync_to_async(Message.objects.filter(status="queued").count)() == 1
