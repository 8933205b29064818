"""daphne's start-up log: ``Server.run`` logs "HTTP/2 support enabled" when ``twisted.web.http.H2_ENABLED``,
else "HTTP/2 support not enabled (install the http2 and tls Twisted extras)", a notice a newcomer reading
``make run``'s log cannot act on. requirements.txt installs Twisted's ``http2`` extra (h2, priority)."""


def test_twisted_http2_extra_is_installed_so_daphne_starts_without_the_http2_notice():
    from twisted.web import http

    assert http.H2_ENABLED, "install Twisted[http2] (h2, priority) from requirements.txt"
