"""One request on the vLLM backend as the worker's reply runner sees it (:class:`VllmStream`): the events vLLM's
event loop puts, read blocking (``events``) or drained by one thread that follows many requests (``drain``,
``set_waker``; ``conversations.delta_publisher``)."""

from __future__ import annotations

import asyncio
import queue
from typing import TYPE_CHECKING

from inference.backends.base import EngineDead
from inference.engine import FinishEvent

if TYPE_CHECKING:
    from inference.backends.vllm import VllmEngine


class VllmStream:
    """One request on the vLLM backend (a :class:`~inference.backends.base.ReplyStream`)."""

    def __init__(self, engine: VllmEngine, request_id: str, prompt_tokens: int):
        self.request_id = request_id
        self._engine = engine
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._task: asyncio.Task | None = None
        self.prompt_tokens = prompt_tokens
        self.finished = False
        self._waker = None

    def events(self):
        """Text deltas then one ``FinishEvent``; raises :class:`EngineDead` if the engine core died."""
        while True:
            item = self._queue.get()
            if isinstance(item, EngineDead):
                raise item
            yield item
            if isinstance(item, FinishEvent):
                return

    def drain(self) -> list:
        """Items put so far and not yet taken, without blocking: text deltas, then one ``FinishEvent``, or an
        :class:`EngineDead` instance (not raised) where :meth:`events` would raise it."""
        taken = []
        while True:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                return taken

    def set_waker(self, waker) -> None:
        """Call ``waker()`` after each item put from now on (``None`` stops it); see ``RequestHandle.set_waker``."""
        self._waker = waker

    def put(self, item) -> None:
        """Deliver an event (or :class:`EngineDead`) to the caller; called on vLLM's event loop."""
        self._queue.put(item)
        waker = self._waker
        if waker is not None:
            waker()

    def cancel(self) -> bool:
        return self._engine.cancel(self.request_id)
