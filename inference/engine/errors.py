"""Exceptions raised by the inference engine.

All of them derive from :class:`EngineError` so callers (the Celery task, the API views)
can catch the whole family with one ``except`` clause and map them to HTTP status codes:
``InvalidRequest`` -> 400, ``QueueFull`` -> 429/503, ``UnknownModel`` -> 404,
``EngineStopped`` -> 503.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error raised by :mod:`inference.engine`."""


class InvalidRequest(EngineError, ValueError):
    """The request can never be served as given.

    Raised synchronously by ``LLMEngine.submit`` / ``SamplingParams.validate`` for an empty
    prompt, a prompt whose length plus ``max_new_tokens`` exceeds the context (or KV) capacity,
    token ids outside the vocabulary, or out-of-range sampling values. The message names the
    offending field.
    """


class QueueFull(EngineError):
    """The bounded waiting queue is full (back-pressure; retry later).

    Attributes:
        waiting: number of requests waiting for admission when the submit was refused.
        max_waiting: the configured bound (``EngineConfig.max_waiting``).
    """

    def __init__(self, waiting: int, max_waiting: int | None = None) -> None:
        self.waiting = waiting
        self.max_waiting = max_waiting
        bound = f" (max_waiting={max_waiting})" if max_waiting is not None else ""
        super().__init__(f"engine queue is full: {waiting} requests waiting{bound}")


class UnknownModel(EngineError, LookupError):
    """The model spec points at something that cannot be found (bad source, missing file)."""


class EngineStopped(EngineError):
    """The engine was shut down; it accepts no new requests."""
