"""A WebSocket opened while PostgreSQL is unreachable (real database, cut the way the ``db_outage`` drill
cuts it) or while the channel layer's Redis is: the handshake succeeds, the socket gets an ``unavailable``
error frame and closes with 1013 (try again later), and a socket opened once the database is back works as
usual."""

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connections

from conversations.consumers import CLOSE_TRY_AGAIN_LATER
from devtools.drills.faults import database_cut, database_restore
from tests.db.test_consumer_hardening import cookie_for
from tests.live_stack import free_port
from tests.sockets import connect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def database_down():
    """``cut()`` makes the test database refuse connections (and ends its sessions); restored at teardown,
    with every thread's broken connection closed so the test's own teardown can flush."""
    name = settings.DATABASES["default"]["NAME"]
    cut = {"done": False}

    def do_cut():
        database_cut(name)
        cut["done"] = True

    yield do_cut
    if cut["done"]:
        database_restore(name)
    connections.close_all()


async def test_socket_opened_during_a_database_outage_is_told_unavailable_and_to_try_again_later(
    alice, redis_clean, database_down
):
    _, cookie = await sync_to_async(cookie_for)(alice)
    await sync_to_async(database_down)()
    ws = connect(cookie)
    connected, _ = await ws.connect(timeout=10)
    assert connected  # accepted, not a failed handshake (which the browser sees as 1006, no reason)
    frame = await ws.receive_json_from(timeout=10)
    assert (frame["type"], frame["code"], frame["message_id"]) == ("error", "unavailable", None)
    assert frame["retry_after"] > 0 and "Traceback" not in frame["message"]
    closed = await ws.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": CLOSE_TRY_AGAIN_LATER}
    await ws.wait()

    await sync_to_async(database_restore)(settings.DATABASES["default"]["NAME"])
    await database_sync_to_async(connections.close_all)()  # the executor thread's session was ended too
    ws = connect(cookie)
    connected, _ = await ws.connect(timeout=10)
    assert connected
    await ws.send_json_to({"type": "send", "conversation_id": None, "content": "after the outage"})
    assert (await ws.receive_json_from(timeout=10))["type"] == "queued"
    await ws.disconnect()


async def test_socket_opened_while_the_channel_layers_redis_is_down_is_told_to_try_again_later(
    alice, redis_clean, settings
):
    _, cookie = await sync_to_async(cookie_for)(alice)
    layer = {**settings.CHANNEL_LAYERS["default"]}
    layer["CONFIG"] = {**layer["CONFIG"], "hosts": [f"redis://127.0.0.1:{free_port()}/0"]}  # nothing listens
    settings.CHANNEL_LAYERS = {"default": layer}
    ws = connect(cookie)
    connected, _ = await ws.connect(timeout=10)
    assert connected
    frame = await ws.receive_json_from(timeout=10)
    assert (frame["type"], frame["code"]) == ("error", "unavailable")
    assert await ws.receive_output(timeout=5) == {"type": "websocket.close", "code": CLOSE_TRY_AGAIN_LATER}
