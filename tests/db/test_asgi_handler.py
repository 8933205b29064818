"""The HTTP handler daphne serves (``chatsite.asgi``'s ``InlineHooksASGIHandler``): Django's browser middleware
runs its hooks in place, and still takes a thread hop, and does its work, where a hook writes (a session
that changed, a CSRF check of a form post). Requests are driven through the real handler as a server does."""

import json
from http.cookies import SimpleCookie

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.sessions.models import Session
from django.utils.module_loading import import_string

import chatsite.asgi_handler as asgi_handler
from chatsite.asgi import django_asgi_app
from tests.db.api_asgi import asgi_messages, http_scope

pytestmark = pytest.mark.django_db(transaction=True)


def _scope(method: str, path: str, *, body: bytes = b"", cookies: str = "", content_type: str = "") -> dict:
    headers = [(b"content-length", str(len(body)).encode())]
    if cookies:
        headers.append((b"cookie", cookies.encode()))
    if content_type:
        headers.append((b"content-type", content_type.encode()))
    return http_scope(method, path, headers)


def _request(method: str, path: str, **kwargs) -> tuple[int, dict[str, list[str]], bytes]:
    """``(status, headers by lower-case name, body)`` of one request through the production handler."""

    sent = async_to_sync(asgi_messages)(
        django_asgi_app, _scope(method, path, **kwargs), kwargs.get("body", b"")
    )
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers: dict[str, list[str]] = {}
    for name, value in start["headers"]:
        headers.setdefault(name.decode().lower(), []).append(value.decode())
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], headers, body


@pytest.fixture
def hops(monkeypatch):
    """The hooks sent to a thread, by name (``sync_to_async`` as chatsite's in-place hooks and handler,
    Django's ``MiddlewareMixin`` and the input guard call it); each still runs."""
    import django.utils.deprecation as deprecation

    import chatsite.in_place_hooks as in_place_hooks
    import chatsite.input_guard as input_guard

    real = asgi_handler.sync_to_async
    called: list[str] = []

    def spy(func, **kwargs):
        called.append(func.__name__)
        return real(func, **kwargs)

    monkeypatch.setattr(asgi_handler, "sync_to_async", spy)
    monkeypatch.setattr(in_place_hooks, "sync_to_async", spy)
    monkeypatch.setattr(deprecation, "sync_to_async", spy)
    monkeypatch.setattr(input_guard, "sync_to_async", spy)
    return called


def test_every_django_middleware_of_the_settings_is_switched_in_chain_order():
    expected = [import_string(p) for p in settings.MIDDLEWARE if import_string(p) in asgi_handler.IN_PLACE]
    assert len(expected) == 7
    assert django_asgi_app.switched == expected
    csrf = [m for m in django_asgi_app._view_middleware if getattr(m, "__name__", "") == "aprocess_view"]
    assert len(csrf) == 1


def test_a_page_get_sends_no_hook_to_a_thread_and_keeps_every_header(hops):
    status, headers, body = _request("GET", "/accounts/login/")
    assert status == 200 and b"<form" in body
    assert hops == []
    assert headers["x-frame-options"] == ["DENY"]  # XFrameOptionsMiddleware
    assert headers["x-content-type-options"] == ["nosniff"]  # SecurityMiddleware
    assert "content-security-policy" in headers
    cookies = SimpleCookie("; ".join(headers["set-cookie"]))
    assert len(cookies["csrftoken"].value) == 32  # CsrfViewMiddleware's response hook set the cookie
    assert "Cookie" in ", ".join(headers["vary"])  # the session (accessed) and the CSRF cookie vary on it


def test_a_form_post_without_its_csrf_token_is_refused_through_a_thread(hops, alice):
    body = b"username=alice&password=pw-Secret-123"
    status, _, _ = _request(
        "POST", "/accounts/login/", body=body, content_type="application/x-www-form-urlencoded"
    )
    assert status == 403
    assert hops == ["process_view"]
    assert not Session.objects.exists()


def test_a_log_in_saves_its_session_through_a_thread(hops, alice):
    _, headers, _ = _request("GET", "/accounts/login/")
    token = SimpleCookie("; ".join(headers["set-cookie"]))["csrftoken"].value
    hops.clear()
    body = f"username=alice&password=pw-Secret-123&csrfmiddlewaretoken={token}".encode()
    status, headers, _ = _request(
        "POST",
        "/accounts/login/",
        body=body,
        cookies=f"csrftoken={token}",
        content_type="application/x-www-form-urlencoded",
    )
    assert status == 302
    assert "process_view" in hops and "process_response" in hops  # the CSRF check; the session's save
    session_key = SimpleCookie("; ".join(headers["set-cookie"]))[settings.SESSION_COOKIE_NAME].value
    store = import_string(settings.SESSION_ENGINE + ".SessionStore")(session_key)
    assert store.get("_auth_user_id") == str(alice.pk)


def test_the_api_path_sends_no_browser_hook_to_a_thread(hops):
    status, headers, _ = _request("GET", "/v1/models")
    assert status == 401
    assert hops == []
    assert headers["x-frame-options"] == ["DENY"]


@pytest.mark.parametrize("padding, thread", [(0, False), (70_000, True)])
def test_an_api_body_with_unstorable_text_is_refused_its_check_in_place_when_small(hops, padding, thread):
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "a\u0000b"}], "user": "x" * padding}
    ).encode()
    status, _, answer = _request("POST", "/v1/chat/completions", body=body, content_type="application/json")
    assert status == 400
    assert json.loads(answer)["error"]["param"] == "messages[0].content"
    assert ("check" in hops) is thread
