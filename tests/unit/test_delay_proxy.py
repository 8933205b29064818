"""The bed's TCP delay proxy (``devtools/bed/delay_proxy.py``, the stand-in for ``tc netem delay``): bytes
cross it intact and in order, each direction ``delay`` late, the delay follows its file, and a client whose
upstream cannot be reached is closed rather than left hanging. Real sockets on loopback."""

import asyncio
import os
import time

import pytest

from devtools.bed import delay_proxy


async def echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def through_proxy(tmp_path):
    """``connect()`` -> (reader, writer) to an echo server through a proxy whose delay file is ``delay``."""
    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    delay = delay_proxy.Delay(tmp_path / "delay-ms")
    proxy = await asyncio.start_server(
        delay_proxy.handler(upstream.sockets[0].getsockname()[:2], delay), "127.0.0.1", 0
    )
    follower = asyncio.create_task(delay.follow())

    async def connect():
        return await asyncio.open_connection(*proxy.sockets[0].getsockname()[:2])

    yield connect, delay.path
    follower.cancel()
    proxy.close()
    upstream.close()


async def round_trip(reader, writer, payload: bytes) -> tuple[bytes, float]:
    started = time.monotonic()
    writer.write(payload)
    await writer.drain()
    got = await reader.readexactly(len(payload))
    return got, time.monotonic() - started


async def test_each_direction_is_delayed_and_the_bytes_arrive_intact_in_order(through_proxy):
    connect, delay_file = through_proxy
    reader, writer = await connect()
    fast, fast_s = await round_trip(reader, writer, b"ping")
    assert fast == b"ping" and fast_s < 0.1
    delay_file.write_text("100")
    await asyncio.sleep(2 * delay_proxy.POLL_S + 0.05)
    payload = os.urandom(1_000_000)  # many chunks: order across chunks matters
    got, slow_s = await round_trip(reader, writer, payload)
    assert got == payload
    assert 0.2 <= slow_s < 1.5  # 100 ms each way
    delay_file.write_text("0")
    await asyncio.sleep(2 * delay_proxy.POLL_S + 0.05)
    _, again_s = await round_trip(reader, writer, b"pong")
    assert again_s < 0.1
    writer.close()


def test_a_delay_file_that_does_not_parse_counts_as_no_delay(tmp_path):
    delay = delay_proxy.Delay(tmp_path / "delay-ms", seconds=0.5)
    (tmp_path / "delay-ms").write_text("fast please")
    delay.read()
    assert delay.seconds == 0.0


async def test_a_client_whose_upstream_is_unreachable_is_closed():
    with_nothing = await asyncio.start_server(echo, "127.0.0.1", 0)
    dead = with_nothing.sockets[0].getsockname()[:2]
    with_nothing.close()
    await with_nothing.wait_closed()
    proxy = await asyncio.start_server(delay_proxy.handler(dead, delay_proxy.Delay(None)), "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*proxy.sockets[0].getsockname()[:2])
    assert await asyncio.wait_for(reader.read(10), timeout=delay_proxy.CONNECT_TIMEOUT_S + 2) == b""
    writer.close()
    proxy.close()


def test_a_malformed_address_is_refused_with_its_shape():
    with pytest.raises(SystemExit):
        delay_proxy.main(["--listen", "5673", "--upstream", "10.231.0.2:5672"])
