"""Helpers of the billing and SSO tests: background server processes (the Stripe fake, the loopback
identity provider), waiting for state that another process writes, Stripe webhook signatures, and a
``requests`` session signed in as a user."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.live_stack import ROOT, stack_env, wait_port


@contextlib.contextmanager
def server_process(args: list[str], *, port: int, log_path: Path, env: dict | None = None):
    """``python <args>`` in the repository root, waited for on 127.0.0.1:``port``; killed on exit."""
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**stack_env(), **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        try:
            wait_port(port, proc, timeout=120)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{args} did not start ({exc}):\n{log_path.read_text()[-3000:]}") from exc
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        log.close()


def eventually(check, *, timeout: float = 20.0, interval: float = 0.2):
    """Call ``check()`` until it returns a truthy value (returned) or ``timeout`` seconds pass (the last
    value's AssertionError is raised). For state that a webhook delivered by another process writes."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {timeout} s")
        time.sleep(interval)


def stripe_signature(payload: bytes, secret: str, timestamp: int | None = None) -> str:
    """A ``Stripe-Signature`` header for ``payload``: ``t=<ts>,v1=<HMAC-SHA256(secret, "<ts>.<payload>")>``."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), b"%d.%s" % (timestamp, payload), hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def stripe_event(
    event_type: str, obj: dict, *, event_id: str | None = None, created: int | None = None
) -> bytes:
    """The body of a Stripe event of ``event_type`` about ``obj``."""
    return json.dumps(
        {
            "id": event_id or f"evt_test_{time.monotonic_ns()}",
            "object": "event",
            "type": event_type,
            "created": created or int(time.time()),
            "data": {"object": obj},
        }
    ).encode()


def signed_in(base_url: str, user) -> requests.Session:
    """A ``requests`` session carrying a new signed-in session cookie of ``user`` for ``base_url``."""
    from accounts.sessions import session_cookie_for

    name, _, value = session_cookie_for(user).partition("=")
    web = requests.Session()
    web.cookies.set(name, value, domain="127.0.0.1", path="/")
    web.base_url = base_url
    return web


def post_form(
    web: requests.Session, page: str, data: dict, *, action: str | None = None
) -> requests.Response:
    """GET ``page`` for its CSRF token, then POST ``data`` to ``action`` (default: the page); no redirects
    followed."""
    html = web.get(web.base_url + page).text
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
    return web.post(
        web.base_url + (action or page),
        data={"csrfmiddlewaretoken": token, **data},
        headers={"Referer": web.base_url + page},
        allow_redirects=False,
    )
