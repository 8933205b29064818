"""Request state, the events streamed to callers, and the caller-side :class:`RequestHandle`.

Threading: the engine loop thread is the only writer of a request's generation state; other
threads talk to a request only through its event queue (``queue.SimpleQueue``, one per
request) and through ``LLMEngine.cancel``.
"""

from __future__ import annotations

import asyncio
import enum
import queue
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from .detokenizer import OutputProcessor
from .sampling import SamplerState, SamplingParams

if TYPE_CHECKING:
    from .engine import LLMEngine

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True)
class Usage:
    """Token accounting of one request.

    Attributes:
        prompt_tokens: Length of the prompt.
        completion_tokens: Tokens sampled by the model for this request, including the EOS or
            the token that completed a stop string (each cost one forward step).
    """

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    """Latency breakdown in milliseconds, measured from ``submit``.

    Attributes:
        queue_ms: Time spent waiting for admission (until cancel/finish if never admitted).
        ttft_ms: Time to the first generated token; ``None`` if no token was generated.
        total_ms: Time until the request finished.
    """

    queue_ms: float
    ttft_ms: float | None
    total_ms: float


@dataclass(frozen=True)
class TokenEvent:
    """A streamed text delta.

    Attributes:
        request_id: The request.
        seq: 0, 1, 2, ... per emitted delta of this request.
        text: New text; never a partial UTF-8 character nor a possible prefix of a stop string.
            May be ``""`` only in the last event of a request, when its trailing tokens produced
            no visible text.
        token_ids: Tokens sampled since the previous event (the EOS token is never reported),
            so the ``token_ids`` of all events concatenate to the generated tokens minus EOS.
    """

    request_id: str
    seq: int
    text: str
    token_ids: list[int]


@dataclass(frozen=True)
class SampledTokenEvent:
    """One generated token, streamed the moment it is sampled (opt-in: ``submit(..., token_events=True)``).

    Unlike :class:`TokenEvent` (visible text, which may hold back tokens until they complete a character
    or rule out a stop string), there is exactly one of these per sampled token, special tokens and the EOS
    included, so inter-token latency and work are visible as they happen. It is always delivered before the
    ``TokenEvent`` carrying the same token's text.

    Attributes:
        request_id: The request.
        index: 0-based position of the token in the output.
        token_id: The sampled token id.
        time: ``time.perf_counter()`` seconds (monotonic) when the engine step that sampled it ended.
    """

    request_id: str
    index: int
    token_id: int
    time: float


@dataclass(frozen=True)
class FinishEvent:
    """Last event of a request.

    Attributes:
        finish_reason: ``"stop"`` (EOS or stop string), ``"length"`` (``max_new_tokens``),
            ``"cancelled"`` or ``"error"``.
        text: Full output text (== concatenation of all ``TokenEvent.text``).
        usage: Token counts.
        timings: Latencies.
        error: Error description when ``finish_reason == "error"``.
    """

    request_id: str
    finish_reason: FinishReason
    text: str
    usage: Usage
    timings: Timings
    error: str | None = None


Event = SampledTokenEvent | TokenEvent | FinishEvent


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """Engine-internal state of one generation request.

    ``num_cached`` counts tokens of ``prompt + output`` whose K/V are in the request's slot. While
    ``num_cached < len(prompt)`` the request is prefilling; afterwards it decodes one token per
    step (the last sampled token is fed at position ``num_cached``). ``prefix_hit_tokens`` of them
    came from the prefix cache at admission.

    ``rank`` is the admission order key (smaller first), fixed at submit: ``arrival_time /
    ageing_s - priority`` with priority ageing, ``-priority`` without. Ageing makes the effective
    priority ``priority + waited_s / ageing_s`` grow with time for every waiting request alike, so
    ranking by it at any instant ``t`` equals ranking by ``arrival_time / ageing_s - priority``,
    which does not change while the request waits (the queue stays a sorted list).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    arrival_seq: int
    sampler: SamplerState
    output: OutputProcessor
    arrival_time: float = field(default_factory=time.perf_counter)
    status: RequestStatus = RequestStatus.WAITING
    slot: int = -1
    num_cached: int = 0
    reserved_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    pending_token_ids: list[int] = field(default_factory=list)
    next_event_seq: int = 0
    admitted_time: float | None = None
    first_token_time: float | None = None
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    cache_salt: str | None = None
    token_events: bool = False
    rank: float = 0.0
    prefix_hit_tokens: int = 0
    # Set by RequestHandle.aevents(): wakes an asyncio consumer after each put (thread-safe call).
    waker: Callable[[], None] | None = None

    def put(self, event: Event) -> None:
        """Deliver an event to the caller (any thread)."""
        self.events.put(event)
        waker = self.waker
        if waker is not None:
            try:
                waker()
            except RuntimeError:  # the consumer's event loop is closed; nobody is listening
                pass

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_prefilling(self) -> bool:
        return self.num_cached < len(self.prompt_token_ids)

    @property
    def sort_key(self) -> tuple[float, int]:
        """Admission order: smaller ``rank`` first (higher aged priority), then FIFO."""
        return (self.rank, self.arrival_seq)


class RequestHandle:
    """Caller-side view of a submitted request (safe to use from any thread).

    Attributes:
        request_id: The id given to / generated by ``LLMEngine.submit``.
    """

    def __init__(self, engine: LLMEngine, request: Request) -> None:
        self.request_id = request.request_id
        self._engine = engine
        self._request = request
        self._events = request.events
        self._finish: FinishEvent | None = None

    def cancel(self) -> bool:
        """Cancel the request (see ``LLMEngine.cancel``). Returns ``False`` if already finished."""
        return self._engine.cancel(self.request_id)

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Yield ``TokenEvent`` s and finally one ``FinishEvent``, blocking for each.

        Args:
            timeout: Seconds to wait for *each* event; ``None`` waits forever.

        Raises:
            TimeoutError: no event arrived within ``timeout``.
        """
        while self._finish is None:
            try:
                event = self._events.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no event for request {self.request_id} within {timeout}s") from None
            if isinstance(event, FinishEvent):
                self._finish = event
            yield event

    def drain(self) -> list[Event]:
        """The events delivered so far and not yet taken, in order, without blocking (``[]`` when none). For a
        consumer that follows many requests from one thread, woken by :meth:`set_waker`; do not mix it with
        :meth:`events` or :meth:`aevents` on one handle."""
        taken: list[Event] = []
        while self._finish is None:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            if isinstance(event, FinishEvent):
                self._finish = event
            taken.append(event)
        return taken

    def set_waker(self, waker: Callable[[], None] | None) -> None:
        """Call ``waker()`` (no arguments, on the engine's loop thread, so it must be quick and must not raise)
        after each event is delivered from now on; ``None`` stops it. Events delivered before the call woke
        nobody: call :meth:`drain` once after setting it."""
        self._request.waker = waker

    async def aevents(self, timeout: float | None = None) -> AsyncIterator[Event]:
        """Async version of :meth:`events`: ``async for event in handle.aevents(): ...``.

        No thread per stream: the engine thread wakes the consuming event loop with
        ``loop.call_soon_threadsafe`` after each event, so one loop can follow thousands of streams.
        Use one consumer per handle (blocking and async iteration must not be mixed concurrently).
        Leaving the loop early does not cancel the request; call :meth:`cancel` for that.

        Args:
            timeout: Seconds to wait for *each* event; ``None`` waits forever.

        Raises:
            TimeoutError: no event arrived within ``timeout``.
        """
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        self._request.waker = lambda: loop.call_soon_threadsafe(ready.set)
        try:
            while self._finish is None:
                # Clear before looking: an event put after the look sets the flag again (no lost wake-up).
                ready.clear()
                try:
                    event = self._events.get_nowait()
                except queue.Empty:
                    try:
                        await asyncio.wait_for(ready.wait(), timeout)
                    except TimeoutError:
                        raise TimeoutError(
                            f"no event for request {self.request_id} within {timeout}s"
                        ) from None
                    continue
                if isinstance(event, FinishEvent):
                    self._finish = event
                yield event
        finally:
            self._request.waker = None

    def __aiter__(self) -> AsyncIterator[Event]:
        """``async for event in handle`` == ``async for event in handle.aevents()``."""
        return self.aevents()

    def result(self, timeout: float | None = None) -> FinishEvent:
        """Drain the stream and return the ``FinishEvent`` (``timeout`` as in :meth:`events`)."""
        for _ in self.events(timeout=timeout):
            pass
        assert self._finish is not None
        return self._finish

    @property
    def finished(self) -> bool:
        """``True`` once the ``FinishEvent`` has been consumed through this handle."""
        return self._finish is not None
