"""The one engine interface of a worker: what the reply runner, admission, broadcast, persistence and fault
handling may use of whichever engine serves the model.

Two implementations (:mod:`.native`, :mod:`.vllm`) are picked once, when the worker loads its model
(:func:`inference.backends.engine_build`), in the manner of llama.cpp's backend registry and vLLM's
``CustomOp.dispatch_forward``: callers never branch on the backend.

Events are the native engine's own (:class:`~inference.engine.TokenEvent`, then exactly one
:class:`~inference.engine.FinishEvent`), so a reply is streamed, stored and billed the same way whichever
engine produced it. No Django imports here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from inference.engine import EngineError, EngineLoad, FinishEvent, SamplingParams, StepStats, TokenEvent

#: ``backend`` names a model registry entry may give (``INFERENCE_MODELS[name]["backend"]``).
BACKENDS = ("native", "vllm")


class EngineDead(EngineError):
    """The engine can serve no more requests (vLLM's engine core process died, or the model failed to load).

    Raised by :meth:`ReplyStream.events` after the tokens already streamed, and by :meth:`ServingEngine.submit`.
    ``text`` is what the request had produced before the engine died (``""`` if nothing)."""

    def __init__(self, message: str, *, text: str = "", completion_tokens: int = 0):
        super().__init__(message)
        self.text = text
        self.completion_tokens = completion_tokens


@runtime_checkable
class ReplyStream(Protocol):
    """One submitted request, as the caller sees it."""

    request_id: str

    def events(self) -> Iterator[TokenEvent | FinishEvent]:
        """Blocking iterator: text deltas, then one ``FinishEvent`` (``finish_reason`` ``stop``, ``length``,
        ``cancelled`` or ``error``). Raises :class:`EngineDead` instead of a finish event when the engine
        died under the request."""
        ...

    def drain(self) -> list:
        """The events delivered so far and not yet taken, without blocking, in :meth:`events`' order; an
        :class:`EngineDead` instance (not raised) stands where :meth:`events` would raise it."""
        ...

    def set_waker(self, waker: Callable[[], None] | None) -> None:
        """Call ``waker()`` after each event delivered from now on (on an engine thread: quick, never raising);
        for one thread following many requests with :meth:`drain`."""
        ...

    def cancel(self) -> bool:
        """Stop the request; its slot and KV cache are freed within one engine step. ``False`` once finished."""
        ...


@runtime_checkable
class ServingEngine(Protocol):
    """What a worker needs of an engine. Thread-safe: every method may be called from any task thread.

    Attributes:
        backend: ``"native"`` or ``"vllm"``.
        context_length: Maximum prompt + generated tokens per request.
    """

    backend: str
    context_length: int

    def start(self) -> None:
        """Begin stepping (the native loop thread; vLLM's engine core is running once built)."""
        ...

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Finish every request (``cancelled``), stop stepping and free the model."""
        ...

    def render_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of chat ``messages`` under the model's template, ending with the assistant prompt.
        Raises ``InvalidRequest`` when the template refuses them."""
        ...

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        request_id: str | None = None,
        cache_salt: str | None = None,
    ) -> ReplyStream:
        """Queue a request. ``priority``: higher is served first (paid tier 10, free 0). ``cache_salt``:
        prefix-cache namespace (one per user), vLLM's ``cache_salt``. Raises ``InvalidRequest``,
        ``QueueFull``, ``EngineStopped`` or :class:`EngineDead`."""
        ...

    def cancel(self, request_id: str) -> bool:
        """:meth:`ReplyStream.cancel` by request id; ``False`` when unknown or finished."""
        ...

    def load(self) -> EngineLoad:
        """Occupancy and monotonic counters now (admission control, fleet status, metrics)."""
        ...

    def add_step_listener(self, fn: Callable[[StepStats], None]) -> None:
        """Call ``fn(stats)`` after every engine step that ran a batch (cheap; exceptions are logged)."""
        ...

    def health(self) -> str:
        """``"ok"``, or why the engine serves nothing (``"engine core died"``, ``"model failed to load: …"``)."""
        ...

    def on_death(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(reason)`` once, from an engine thread, when the engine dies for good."""
        ...
