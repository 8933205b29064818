"""The headers and cookie flags production answers with, table-driven, from a process started on
``chatsite.settings.prod`` with the environment it requires (SECRET_KEY, ALLOWED_HOSTS) and this test's
database. The process makes its requests with Django's test client (as HTTPS, as a proxy that terminates TLS
would say with ``X-Forwarded-Proto``) and prints what came back as JSON."""

import json
import subprocess
import sys

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from devtools.drills.processes import child_env

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = r"""
import json, django
django.setup()
from django.test import Client

https = {"secure": True, "HTTP_X_FORWARDED_PROTO": "https"}
client = Client()
out = {}
for name, response in {
    "healthz": client.get("/healthz", **https),
    "models": client.get("/v1/models", **https),
    "plain_http": client.get("/v1/models"),
    "plain_http_probe": client.get("/healthz"),
    "login": client.post("/accounts/login/", {"username": "alice", "password": "pw-Secret-123"}, **https),
}.items():
    out[name] = {
        "status": response.status_code,
        "location": response.get("Location", ""),
        "headers": {k.lower(): v for k, v in response.headers.items()},
        "cookies": {
            key: {"secure": bool(m["secure"]), "httponly": bool(m["httponly"]), "samesite": m["samesite"]}
            for key, m in response.cookies.items()
        },
    }
print(json.dumps(out))
"""


@pytest.fixture
def answers(alice):
    """What the production process answered, per request name (see PROBE)."""
    # Production verifies passwords with its own hashers (the test settings' MD5 is not among them).
    alice.password = PBKDF2PasswordHasher().encode("pw-Secret-123", "prodprobesalt", iterations=1000)
    alice.save(update_fields=["password"])
    env = child_env(
        DJANGO_SETTINGS_MODULE="chatsite.settings.prod",
        SECRET_KEY="k3y-" + "z9Q" * 20,
        ALLOWED_HOSTS="testserver",
        LOG_LEVEL="ERROR",
    )
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


HEADERS = [
    # (response, header, every one of these fragments must be in its value)
    ("healthz", "strict-transport-security", ["max-age=31536000", "includeSubDomains", "preload"]),
    ("healthz", "x-frame-options", ["DENY"]),
    ("healthz", "referrer-policy", ["same-origin"]),
    ("healthz", "x-content-type-options", ["nosniff"]),
    ("healthz", "cross-origin-opener-policy", ["same-origin"]),
    (
        "healthz",
        "content-security-policy",
        [
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'self'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ],
    ),
    ("models", "content-security-policy", ["frame-ancestors 'none'"]),
    ("models", "strict-transport-security", ["max-age=31536000"]),
    ("login", "content-security-policy", ["script-src 'self'"]),
]

COOKIES = [
    # (response, cookie, secure, httponly, samesite)
    ("login", "sessionid", True, True, "Lax"),
    ("login", "csrftoken", True, False, "Lax"),  # read by the page's script for its fetch() calls
]


def test_production_headers_cookie_flags_and_https_redirect(answers):
    failures = []
    for name, header, fragments in HEADERS:
        value = answers[name]["headers"].get(header, "")
        failures += [f"{name}: {header} lacks {f!r} (is {value!r})" for f in fragments if f not in value]
    for name in answers:
        policy = answers[name]["headers"].get("content-security-policy", "")
        if "unsafe-inline" in policy or "unsafe-eval" in policy:
            failures.append(f"{name}: the policy allows inline or eval'd script: {policy}")
    for name, cookie, secure, httponly, samesite in COOKIES:
        flags = answers[name]["cookies"].get(cookie)
        expected = {"secure": secure, "httponly": httponly, "samesite": samesite}
        if flags != expected:
            failures.append(f"{name}: cookie {cookie} is {flags}, expected {expected}")
    assert failures == [], "\n".join(failures)
    assert answers["login"]["status"] == 302  # the log-in happened, so its cookies are the real ones
    # Plain HTTP is sent to HTTPS, except the health probes a load balancer or kubelet sends inside the network.
    assert (answers["plain_http"]["status"], answers["plain_http"]["location"]) == (
        301,
        "https://testserver/v1/models",
    )
    assert (answers["plain_http_probe"]["status"], answers["plain_http_probe"]["location"]) == (200, "")
