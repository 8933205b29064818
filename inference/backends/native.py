"""The native engine (:mod:`inference.engine`, continuous batching in this process) behind
:class:`~inference.backends.base.ServingEngine`, unchanged: this adapter only names the backend and reports
health. Anything else (``tokenizer``, ``prefix_cache``, ``kv``) is the engine's own, for tests and tools."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inference.engine import EngineConfig, LLMEngine, ModelSpec


class NativeEngine:
    """:class:`~inference.engine.LLMEngine` as a :class:`~inference.backends.base.ServingEngine`.

    The engine runs in this process: it cannot die apart from it, so :meth:`health` is ``"ok"`` until
    shutdown and :meth:`on_death` listeners are never called."""

    backend = "native"

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.context_length = engine.context_length

    @classmethod
    def from_spec(cls, spec: ModelSpec, config: EngineConfig, cache_dir) -> NativeEngine:
        """Load ``spec`` (preparing ``cache_dir/<name>`` if needed); raises ``UnknownModel``/``EngineError``."""
        return cls(LLMEngine.from_spec(spec, config, cache_dir))

    def __getattr__(self, name: str) -> Any:
        # submit, cancel, load, render_chat, start, shutdown, add_step_listener, ... are the engine's own.
        return getattr(self.engine, name)

    def submit(self, prompt_token_ids, params=None, *, priority=0, request_id=None, cache_salt=None, **kw):
        """:meth:`LLMEngine.submit` (its handle already is a ``ReplyStream``)."""
        return self.engine.submit(
            prompt_token_ids, params, priority=priority, request_id=request_id, cache_salt=cache_salt, **kw
        )

    def health(self) -> str:
        return "ok"

    def on_death(self, fn: Callable[[str], None]) -> None:
        """Never called: an in-process engine dies with its worker."""
