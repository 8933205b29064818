"""The bearer-key API (``/v1/``) skips Django's common, log-in and messages middleware
(chatsite/browser_middleware.py, lever 17 of docs/overhead.md); every other request still goes through them. Real database, Django's async test client (the
ASGI handler and its async middleware chain)."""

import pytest
from asgiref.sync import SyncToAsync
from channels.db import database_sync_to_async
from django.test import AsyncClient

from api.services import api_key_create

pytestmark = pytest.mark.django_db(transaction=True)

HOOKS = {"process_request", "process_view", "process_response"}


@pytest.fixture
def hooks_run(monkeypatch):
    """The names of the middleware hooks Django ran on a thread (``sync_to_async``) while a request went by."""
    original = SyncToAsync.__call__
    names: list[str] = []

    async def counted(self, *args, **kwargs):
        name = getattr(self.func, "__name__", "")
        if name in HOOKS:
            names.append(f"{getattr(self.func, '__self__', None).__class__.__name__}.{name}")
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    return names


SKIPPED_FOR_API = {
    "CommonMiddleware.process_request",
    "CommonMiddleware.process_response",
    "AuthenticationMiddleware.process_request",
    "MessageMiddleware.process_request",
    "MessageMiddleware.process_response",
}


async def test_an_api_request_skips_the_browser_middleware_and_keeps_its_security_headers(
    alice, hooks_run, settings
):
    settings.ALLOWED_HOSTS = ["testserver"]
    _, raw = await database_sync_to_async(api_key_create)(user=alice)
    response = await AsyncClient().get("/v1/models", headers={"Authorization": f"Bearer {raw}"})
    assert response.status_code == 200
    assert hooks_run and not SKIPPED_FOR_API & set(hooks_run), hooks_run
    assert not response.cookies  # no session or CSRF cookie for an API client
    assert "frame-ancestors 'none'" in response["Content-Security-Policy"]
    assert (response["X-Content-Type-Options"], response["X-Frame-Options"]) == ("nosniff", "DENY")

    anonymous = await AsyncClient().get("/v1/models")  # the key is still required
    assert anonymous.status_code == 401


async def test_a_page_request_still_runs_sessions_csrf_and_log_in(alice, hooks_run, settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    client = AsyncClient(enforce_csrf_checks=True)
    page = await client.get("/accounts/login/")
    assert page.status_code == 200 and "csrftoken" in page.cookies
    assert SKIPPED_FOR_API | {"SessionMiddleware.process_request", "CsrfViewMiddleware.process_view"} <= set(
        hooks_run
    ), hooks_run
    refused = await client.post("/accounts/login/", {"login": "alice", "password": "pw-Secret-123"})
    assert refused.status_code == 403  # no CSRF token in the form: still refused
