"""What a person sees while PostgreSQL is down, with the outage made the way it happens: the database's
address stops answering (a proxy in front of PostgreSQL is stopped, cutting open sessions and refusing new
ones). A page answers 503 saying the service is briefly unavailable and reloads itself; the API answers 503
in its own shape; a new WebSocket gets ``unavailable`` and close code 1013. Once the database is back,
everything works again."""

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from conversations.consumers import CLOSE_TRY_AGAIN_LATER
from tests.db.test_consumer_hardening import cookie_for
from tests.outage_proxy import TcpProxy, database_through
from tests.sockets import connect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def outage():
    """``outage.start()`` stops the database's address; the database is reachable again at teardown."""
    db = settings.DATABASES["default"]
    proxy = TcpProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)))
    with database_through(proxy):
        yield proxy
    connections.close_all()


@pytest.mark.asyncio
async def test_a_new_socket_during_an_outage_is_told_unavailable_and_to_try_again_later(
    alice, redis_clean, outage
):
    _, cookie = await sync_to_async(cookie_for)(alice)
    await sync_to_async(outage.stop)()
    try:
        ws = connect(cookie)
        connected, _ = await ws.connect(timeout=10)
        assert connected
        frame = await ws.receive_json_from(timeout=10)
        assert (frame["type"], frame["code"]) == ("error", "unavailable")
        assert await ws.receive_output(timeout=5) == {
            "type": "websocket.close",
            "code": CLOSE_TRY_AGAIN_LATER,
        }
    finally:
        # The shared sync thread's session went through the proxy and was cut: drop it there.
        await sync_to_async(connections.close_all)()


def test_a_page_during_an_outage_is_a_503_that_reloads_itself(client, alice, outage):
    client.force_login(alice)
    outage.stop()
    response = client.get("/chat/")
    assert response.status_code == 503 and response["Retry-After"] == str(settings.ADMISSION_RETRY_AFTER_S)
    body = response.content.decode()
    assert "briefly unavailable" in body and 'http-equiv="refresh"' in body


def test_a_page_script_asking_for_json_gets_json(client, alice, outage):
    client.force_login(alice)
    conversation_id = 1
    outage.stop()
    response = client.post(f"/chat/{conversation_id}/rename/", {"title": "x"}, HTTP_ACCEPT="application/json")
    assert response.status_code == 503 and "briefly unavailable" in response.json()["error"]
