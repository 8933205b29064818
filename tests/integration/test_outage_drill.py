"""Drill: PostgreSQL becomes unreachable under a running daphne, then comes back. The outage is made the way
it happens (daphne reaches the database through a TCP proxy that is stopped: open sessions are cut, new
connections refused). During it, every door answers "try again shortly" in its own words instead of an
error: the chat page a 503 that says it is briefly unavailable and reloads itself, the OpenAI-compatible API
and the history API a 503 with ``Retry-After``, a new chat socket an ``unavailable`` frame and close code
1013 through daphne itself. After it, the same requests work again."""

import asyncio
import http.client
import json
from urllib.parse import urlparse

import pytest
import websockets

from api.services import api_key_create
from tests.db.test_consumer_hardening import cookie_for
from tests.live_stack import daphne_server
from tests.outage_proxy import TcpProxy, database_target, database_url_through

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(tmp_path, redis_clean):
    """A daphne whose database is reached through a proxy: ``(base_url, proxies)``; ``proxies[-1]`` is the
    current one (stop it for the outage, append a new one on its port to end it)."""
    proxies = [TcpProxy(database_target())]
    with daphne_server(tmp_path / "daphne.log", DATABASE_URL=database_url_through(proxies[0])) as url:
        yield url, proxies
    proxies[-1].stop()


def get(base_url: str, path: str, headers: dict) -> tuple[int, dict, str]:
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    body = response.read().decode()
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, body


async def socket_answer(
    base_url: str, cookie: str, frame: dict | None = None
) -> tuple[list[dict], int | None]:
    """Open the chat socket with ``cookie``, send ``frame`` if given; the frames received and the close code
    (None while the socket stays open after the first frame)."""
    host = urlparse(base_url).netloc
    frames = []
    async with websockets.connect(
        f"ws://{host}/ws/chat/", origin=base_url, additional_headers={"Cookie": cookie}
    ) as ws:
        if frame is not None:
            await ws.send(json.dumps(frame))
        try:
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
            if frame is None:
                await asyncio.wait_for(ws.recv(), 20)
        except websockets.ConnectionClosed as closed:
            return frames, closed.rcvd.code if closed.rcvd else None
    return frames, None


def test_database_outage_drill(stack, alice):
    base_url, proxies = stack
    _, cookie = cookie_for(alice)
    _, key = api_key_create(user=alice, name="drill")
    page = {"Cookie": cookie}
    bearer = {"Authorization": f"Bearer {key}"}
    assert get(base_url, "/chat/", page)[0] == 200

    proxies[-1].stop()  # PostgreSQL is unreachable from here on

    status, headers, body = get(base_url, "/chat/", page)
    assert status == 503 and headers["retry-after"] == "5"
    assert "briefly unavailable" in body and '<meta http-equiv="refresh" content="5">' in body
    assert "script-src 'self'" in headers["content-security-policy"]

    status, headers, body = get(base_url, "/v1/models", bearer)
    assert (status, headers["retry-after"]) == (503, "5")
    assert json.loads(body)["error"]["code"] == "unavailable"

    status, headers, body = get(base_url, "/api/conversations", bearer)
    assert (status, headers["retry-after"]) == (503, "5") and "briefly unavailable" in json.loads(body)[
        "detail"
    ]

    frames, code = asyncio.run(socket_answer(base_url, cookie))
    assert [(f["type"], f["code"]) for f in frames] == [("error", "unavailable")] and code == 1013

    proxies.append(TcpProxy(database_target(), port=proxies[-1].port))  # PostgreSQL is back

    assert get(base_url, "/chat/", page)[0] == 200
    assert get(base_url, "/v1/models", bearer)[0] == 200
    assert get(base_url, "/api/conversations", bearer)[0] == 200
    frames, code = asyncio.run(socket_answer(base_url, cookie, {"type": "stop", "message_id": 999_999}))
    assert [(f["type"], f["code"]) for f in frames] == [("error", "not_found")] and code is None
