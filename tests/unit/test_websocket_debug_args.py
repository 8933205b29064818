"""Autobahn's per-frame debug-log arguments are not formatted for every frame daphne writes or reads
(``chatsite/websocket_debug_args.py``, lever 59): frames still go out and come in whole, and a debug line, when
Autobahn's debug log is on, still names the peer and the byte count."""

import subprocess
import sys
from pathlib import Path
from unittest import mock

import click
import pytest
import txaio
from twisted.logger import globalLogPublisher

from chatsite import websocket_debug_args
from devtools.ws_frames import client_frame, open_socket

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def applied():
    import autobahn.twisted.websocket as twisted_ws
    import autobahn.websocket.protocol as protocol

    saved = {(m, h): getattr(m, h) for m in (protocol, twisted_ws) for h in websocket_debug_args.HELPERS}
    websocket_debug_args.apply()
    yield
    for (module, helper), value in saved.items():
        setattr(module, helper, value)


def test_frames_written_and_read_style_no_log_arguments(applied):
    received = []
    protocol, transport = open_socket(received.append)
    with mock.patch.object(click, "style", wraps=click.style) as style:
        protocol.sendMessage(b'{"type":"token","seq":1,"text":" hi"}')
        protocol.dataReceived(client_frame(b'{"type":"resume","message_id":7}'))
    assert style.call_count == 0
    assert transport.value() == b"\x81\x25" + b'{"type":"token","seq":1,"text":" hi"}'
    assert received == [b'{"type":"resume","message_id":7}']


def test_without_it_each_frame_styles_its_log_arguments():
    """What lever 59 takes away: Autobahn as installed styles the arguments of a debug line that is not
    written (``click.style`` once per argument), for every frame written and read."""
    import autobahn.websocket.protocol as protocol_module

    if protocol_module.hltype is websocket_debug_args.as_is:
        pytest.skip("applied in this process already")
    protocol, _transport = open_socket()
    with mock.patch.object(click, "style", wraps=click.style) as style:
        protocol.sendMessage(b"{}")
    assert style.call_count >= 3


def test_a_debug_line_still_names_the_peer_and_the_byte_count(applied):
    lines = []

    def observer(event):
        if "sent {data_len} bytes" in (event.get("log_format") or ""):
            lines.append(event)

    protocol, _transport = open_socket()
    globalLogPublisher.addObserver(observer)
    level = txaio.get_global_log_level()
    txaio.set_global_log_level("debug")
    try:
        protocol.log = txaio.make_logger()  # a logger made while debug is on writes debug lines
        protocol.sendMessage(b"{}")
    finally:
        txaio.set_global_log_level(level)
        globalLogPublisher.removeObserver(observer)
    (event,) = lines
    assert str(event["data_len"]) == "4"  # the frame: 2 header bytes and the payload
    assert str(event["peer"]) == str(protocol.peer)
    assert "sendData" in str(event["func"])


def test_daphnes_application_applies_it_at_start():
    code = (
        "import chatsite.asgi, autobahn.websocket.protocol as p, autobahn.twisted.websocket as t;"
        "from chatsite.websocket_debug_args import as_is;"
        "print(all(m.hltype is as_is and m.hlval is as_is for m in (p, t)))"
    )
    out = subprocess.check_output([sys.executable, "-c", code], cwd=ROOT, text=True, timeout=120)
    assert out.strip().splitlines()[-1] == "True"
