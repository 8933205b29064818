"""daphne's start-up log: ``Server.run`` logs "HTTP/2 support enabled" when ``twisted.web.http.H2_ENABLED``,
else "HTTP/2 support not enabled (install the http2 and tls Twisted extras)", a notice a newcomer reading
``make run``'s log cannot act on. requirements.txt installs Twisted's ``http2`` extra (h2, priority)."""

import os
import subprocess
import sys


def test_twisted_http2_extra_is_installed_so_daphne_starts_without_the_http2_notice():
    from twisted.web import http

    assert http.H2_ENABLED, "install Twisted[http2] (h2, priority) from requirements.txt"


def test_the_asgi_module_sets_the_gil_switch_interval_from_settings():
    """daphne imports ``chatsite.asgi``: its event loop gets the GIL back from busy threads within
    ``WEB_GIL_SWITCH_INTERVAL_MS`` (docs/overhead.md, refusals under load)."""
    code = "import chatsite.asgi, sys; print(sys.getswitchinterval())"
    env = {**os.environ, "WEB_GIL_SWITCH_INTERVAL_MS": "0.5"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert abs(float(out.stdout.split()[-1]) - 0.0005) < 1e-9
