"""Browser-layer fixtures: one Chromium for this package's tests (Debian's, driven by Playwright), a fresh context per
test, log-in by session cookie, axe-core injected from the vendored file (no network at test time)."""

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
AXE_JS = Path(__file__).parent / "vendor" / "axe.min.js"
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="package")
def chromium():
    """Package-scoped: sync Playwright keeps an event loop running in the test thread while it lives, which
    would stop pytest-asyncio's tests (tests/integration) collected after this package."""
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in the test thread; the tests' own ORM calls are plain
    # blocking queries between browser steps, so Django's async-safety guard does not apply to them.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
            ],
        )
        yield browser
        browser.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def is_csp_violation(text: str) -> bool:
    """Whether a console message is Chromium's report of a Content-Security-Policy violation."""
    return "Content Security Policy" in text


@pytest.fixture
def open_page(chromium, live_server_url, redis_clean):
    """``open_page(user=None, viewport=None, color_scheme=None)`` -> a Playwright page in a new context,
    logged in as ``user`` when given. Every browser test fails when any of its pages reports a
    Content-Security-Policy violation in the console (the policy: chatsite/content_security.py)."""
    from django.conf import settings
    from django.test import Client

    contexts = []
    violations: list[str] = []

    def watch(message) -> None:
        if is_csp_violation(message.text):
            violations.append(f"{message.page.url if message.page else '?'}: {message.text}")

    def make(user=None, *, viewport=None, color_scheme="light"):
        context = chromium.new_context(
            base_url=live_server_url,
            viewport=viewport or {"width": 1280, "height": 860},
            color_scheme=color_scheme,
        )
        context.set_default_timeout(30_000)
        contexts.append(context)
        if user is not None:
            client = Client()
            client.force_login(user)
            context.add_cookies(
                [
                    {
                        "name": settings.SESSION_COOKIE_NAME,
                        "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
                        "url": live_server_url,
                    }
                ]
            )
        page = context.new_page()
        page.on("console", watch)
        return page

    yield make
    for context in contexts:
        context.close()
    assert violations == [], "Content-Security-Policy violations:\n" + "\n".join(violations)


@pytest.fixture(scope="session")
def shots_dir(tmp_path_factory):
    """Where screenshots go: ``$BROWSER_SCREENSHOT_DIR`` when set (to look at them), else a temp dir."""
    path = Path(os.environ.get("BROWSER_SCREENSHOT_DIR") or tmp_path_factory.mktemp("shots"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def axe_violations(page, *, impacts=("serious", "critical")) -> list[dict]:
    """Run axe-core in the page; the violations of the given impacts (id, impact, help, first targets)."""
    # Evaluated through the DevTools protocol, which the page's Content-Security-Policy does not govern (an
    # inline <script> tag would be refused by it, as it should be).
    page.evaluate(AXE_JS.read_text())
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "help": v["help"],
            "targets": [n["target"] for n in v["nodes"][:3]],
        }
        for v in result["violations"]
        if v["impact"] in impacts
    ]
