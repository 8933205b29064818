"""``request_started`` under the production ASGI handler (``chatsite.request_started``, lever 41): Django's own
receivers run in place on the event loop's thread, with no thread hop before the request is built; any other
receiver brings back Django's ``asend`` (the hop), and every receiver still runs once per request."""

import threading

import pytest
from asgiref.sync import async_to_sync
from django.core import signals

import chatsite.request_started as request_started
from chatsite.asgi import django_asgi_app
from tests.db.api_asgi import asgi_messages, http_scope

pytestmark = pytest.mark.django_db(transaction=True)


def _get(path: str, receiver=None) -> tuple[int, int]:
    """``(status, the event loop's thread id)`` of one GET through the production handler, with ``receiver``
    connected to ``request_started`` for that request when given."""

    async def run():
        sent = await asgi_messages(django_asgi_app, http_scope("GET", path, []))
        start = next(m for m in sent if m["type"] == "http.response.start")
        return start["status"], threading.get_ident()

    if receiver is None:
        return async_to_sync(run)()
    signals.request_started.connect(receiver)
    try:
        return async_to_sync(run)()
    finally:
        signals.request_started.disconnect(receiver)


@pytest.fixture
def signal_hops(monkeypatch):
    """Names of the functions Django's signal dispatcher sends to a thread (``asend``'s ``sync_send``)."""
    import django.dispatch.dispatcher as dispatcher

    real = dispatcher.sync_to_async
    called: list[str] = []

    def spy(func, *args, **kwargs):
        called.append(func.__name__)
        return real(func, *args, **kwargs)

    monkeypatch.setattr(dispatcher, "sync_to_async", spy)
    return called


def test_the_handler_installs_the_in_place_send():
    assert getattr(signals.request_started.asend, "in_place", False) is True
    sync_receivers, async_receivers = signals.request_started._live_receivers(None)
    assert set(sync_receivers) == set(request_started.IN_PLACE_RECEIVERS) and not async_receivers


def test_a_request_sends_request_started_without_a_thread_hop(signal_hops):
    assert _get("/healthz")[0] == 200
    assert "sync_send" not in signal_hops


def test_a_listed_receiver_runs_once_per_request_on_the_event_loops_thread(signal_hops, monkeypatch):
    ran_on: list[int] = []

    def receiver(sender, **kwargs):
        ran_on.append(threading.get_ident())

    monkeypatch.setattr(
        request_started, "IN_PLACE_RECEIVERS", request_started.IN_PLACE_RECEIVERS | {receiver}
    )
    status, loop_thread = _get("/healthz", receiver)
    assert status == 200
    assert ran_on == [loop_thread]
    assert "sync_send" not in signal_hops


def test_any_other_receiver_brings_back_djangos_hop_and_still_runs(signal_hops):
    ran_on: list[int] = []

    def receiver(sender, **kwargs):
        ran_on.append(threading.get_ident())

    status, loop_thread = _get("/healthz", receiver)
    assert status == 200
    assert len(ran_on) == 1 and ran_on[0] != loop_thread
    assert "sync_send" in signal_hops


def test_an_async_receiver_brings_back_djangos_send_and_is_awaited(signal_hops):
    awaited: list[str] = []

    async def receiver(sender, **kwargs):
        awaited.append(kwargs["scope"]["path"])

    assert _get("/healthz", receiver)[0] == 200
    assert awaited == ["/healthz"]
    assert "sync_send" in signal_hops
