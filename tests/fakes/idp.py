"""The loopback OpenID Connect identity provider of the SSO tests (settings in tests/idp/): a fresh SQLite
database and RSA signing key, ``runserver`` as its own process, and the whole log-in at the provider done
over real HTTP like a browser would (its log-in form, then the authorization redirect)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlparse

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.fakes.stack import server_process
from tests.live_stack import ROOT, free_port, stack_env

CLIENT_ID, CLIENT_SECRET = "chatsite", "chatsite-secret"
PERSON, PASSWORD = "ivy", "ivy-Secret-123"


@contextlib.contextmanager
def identity_provider(workdir: Path, redirect_uris: list[str]):
    """Yields the provider's issuer URL (``http://127.0.0.1:<port>/o``) with chatsite registered as a
    client for ``redirect_uris``."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_file = workdir / "idp-key.pem"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.idp.settings",
        "IDP_DB": str(workdir / "idp.sqlite3"),
        "IDP_RSA_KEY_FILE": str(key_file),
    }
    subprocess.run(
        [sys.executable, "-m", "tests.idp.setup", *redirect_uris],
        cwd=ROOT,
        env={**stack_env(), **env},
        check=True,
    )
    port = free_port()
    args = ["-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"]
    with server_process(args, port=port, log_path=workdir / "idp.log", env=env) as url:
        yield f"{url}/o"


def sso_settings(settings, issuer: str, **extra) -> None:
    """Point this process's chatsite settings at ``issuer`` (what SSO_OIDC_* do in chatsite/settings)."""
    settings.SSO_OIDC_ISSUER = issuer
    settings.SOCIALACCOUNT_PROVIDERS = {
        "openid_connect": {
            "OAUTH_PKCE_ENABLED": True,
            "APPS": [
                {
                    "provider_id": settings.SSO_PROVIDER_ID,
                    "name": "Corp SSO",
                    "client_id": CLIENT_ID,
                    "secret": CLIENT_SECRET,
                    "settings": {
                        "server_url": issuer,
                        "oauth_pkce_enabled": True,
                        "scope": ["openid", "profile", "email"],
                    },
                }
            ],
        }
    }
    for name, value in extra.items():
        setattr(settings, name, value)


def provider_login(authorize_url: str, *, username: str = PERSON, password: str = PASSWORD) -> str:
    """Sign in at the provider (its log-in form over HTTP) and follow its authorization endpoint; returns
    the redirect back to chatsite (callback URL with ``code`` and ``state``)."""
    web = requests.Session()
    to_login = web.get(authorize_url, allow_redirects=False)
    login_url = urljoin(authorize_url, to_login.headers["Location"])
    form = web.get(login_url).text
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    signed_in = web.post(
        login_url,
        data={
            "csrfmiddlewaretoken": token,
            "username": username,
            "password": password,
            "next": parse_qs(urlparse(login_url).query)["next"][0],
        },
        allow_redirects=False,
    )
    assert signed_in.status_code == 302, signed_in.text[:500]
    authorized = web.get(urljoin(login_url, signed_in.headers["Location"]), allow_redirects=False)
    assert authorized.status_code == 302, authorized.text[:500]
    return authorized.headers["Location"]
