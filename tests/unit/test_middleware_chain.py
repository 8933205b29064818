"""The middleware chain runs async end to end under ASGI: no sync-only middleware puts it in a thread, where a
client's disconnect (Django cancels the request's task) would stop instead of reaching the view."""

import logging

from django.core.handlers.asgi import ASGIHandler


def test_no_middleware_is_adapted_between_sync_and_async(caplog, settings):
    settings.DEBUG = True  # Django logs each adaptation only in debug mode
    with caplog.at_level(logging.DEBUG, logger="django.request"):
        ASGIHandler()  # builds the chain from settings.MIDDLEWARE (load_middleware(is_async=True))
    adapted = [r.getMessage() for r in caplog.records if "adapted" in r.getMessage()]
    assert adapted == []
