"""Logging filters."""

import logging

# Start-up lines nobody running chatsite can act on (daphne's optional HTTP/2 extras: TLS terminates at
# the proxy in production, and development is plain HTTP/1.1).
_NOISE = ("HTTP/2 support not enabled",)


class QuietStartup(logging.Filter):
    """Drops the start-up warnings listed in ``_NOISE``."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message.startswith(noise) for noise in _NOISE)
