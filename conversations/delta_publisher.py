"""One publisher thread per worker process for every reply's text deltas (docs/overhead-levers.md, lever 50).

Before, each reply's task thread woke for each of its deltas (``ReplyStream.events``), ran it past the reply's
``OutputMonitor`` and published it in a Redis round trip of its own: at 32 replies decoding, 32 thread wake-ups,
each waiting for the GIL beside the engine's loop, and 32 round trips per engine step, about 0.5 ms of the
worker's CPU per token. Now the engine wakes this thread (``ReplyStream.set_waker``); it takes what every
followed reply has delivered (``ReplyStream.drain``) and publishes the lot with ``events.broadcast.publish_many``:
one wake-up and one round trip per engine step, the engine's batch streamed as one batch, as vLLM's output
processor hands a step's outputs on together.

Output moderation stays off this thread, which never runs a guard: a delta at which the reply's monitor is due
for a check (``OutputMonitor.due``: a sentence end, or every N tokens) is handed to the reply's own task thread
with every later delta of that reply, in order, until the thread has caught up; the thread runs the check,
publishes those deltas itself (or cuts the reply) and hands the reply back. So a slow guard delays only its own
reply, as before, and no delta is published before the check that covers it.

The reply's task thread waits on :meth:`ReplyFeed.signals`: ``"first"`` once its first delta is published (it
records the reply's context then, lever 15), the handed deltas, and at the end the engine's ``FinishEvent``,
passed on only after every delta before it is published.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator

from events import broadcast
from inference.backends import EngineDead
from inference.engine import FinishEvent, TokenEvent
from observability import tracing

logger = logging.getLogger(__name__)

REDIS_ERRORS = broadcast.REDIS_ERRORS

#: Who handles a reply's next delta: this module's thread, or the reply's own task thread (a check is due).
PUBLISHER, THREAD = "publisher", "thread"


class ReplyFeed:
    """One followed reply: its stream, monitor and metrics timer, and the queue its task thread reads.

    ``first_publish``: ``(ns, ns)`` (``time.time_ns``) around the round trip that published its first delta, or
    None. ``blocked``: the monitor's blocking verdict once a check cut the reply (the request is cancelled
    then and nothing more is published). ``final``: the ``FinishEvent``, once :meth:`signals` has ended."""

    def __init__(self, stream, *, message_id: int, monitor, timer):
        self.stream = stream
        self.message_id = message_id
        self.monitor = monitor
        self.timer = timer
        self.owner = PUBLISHER
        self.lock = threading.Lock()  # guards `owner`, `handed` and `done`
        self.handed = 0  # deltas the publisher decided to hand to the task thread
        self.done = 0  # of those, the ones the task thread has handled
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # ("first"|"token"|"finish"|"error", item)
        self.first_publish: tuple[int, int] | None = None
        self.blocked = None
        self.final: FinishEvent | None = None
        self.publish_failures = 0

    def signals(self) -> Iterator[str]:
        """On the reply's task thread: yields ``"first"`` once the first delta is published, and returns after
        the ``FinishEvent`` (in :attr:`final`). Handed deltas are checked and published here. Raises
        ``EngineDead`` when the engine died under the reply, and what the publisher thread met for it."""
        while True:
            kind, item = self.inbox.get()
            if kind == "finish":
                self.final = item
                return
            if kind == "error":
                raise item
            if kind == "first":
                yield "first"
                continue
            published = self._publish_handed(item)
            with self.lock:
                self.done += 1
                # Caught up with every delta handed so far (some may still be on their way, queued behind the
                # publisher's round trip): the publisher takes the next one.
                if self.blocked is None and self.done == self.handed:
                    self.owner = PUBLISHER
            if published:
                yield "first"

    def _publish_handed(self, event: TokenEvent) -> bool:
        """Check and publish one handed delta on the task thread; True when it was the reply's first one."""
        self.timer.token(len(event.token_ids))
        if self.blocked is not None:
            return False  # deltas the engine made before the cancel reached it: never published
        self.blocked = self.monitor.feed(event.text, len(event.token_ids))
        if self.blocked is not None:
            self.stream.cancel()
            return False
        started = time.time_ns()
        try:
            broadcast.publish(
                self.message_id,
                broadcast.frame_token(message_id=self.message_id, seq=event.seq, text=event.text),
            )
        except REDIS_ERRORS:
            self.publish_failed()
            return False
        if self.first_publish is None:
            self.first_publish = (started, time.time_ns())
            return True
        return False

    def publish_failed(self) -> None:
        """Redis is restarting: live viewers miss this delta, but the generation goes on and its final text
        reaches them in ``done`` (and from the database on ``resume``)."""
        self.publish_failures += 1
        if self.publish_failures == 1:
            logger.warning("could not publish a delta of message %s", self.message_id, exc_info=True)


class DeltaPublisher:
    """The process's publisher thread (see the module docstring); started on the first :meth:`follow`."""

    def __init__(self):
        self._cond = threading.Condition()
        self._ready: dict[int, ReplyFeed] = {}  # id(feed) -> feed, woken since the last round
        self._thread: threading.Thread | None = None

    def follow(self, stream, *, message_id: int, monitor, timer) -> ReplyFeed:
        """Publish ``stream``'s deltas from now on; the caller waits on the returned feed's
        :meth:`ReplyFeed.signals`. ``stream``: a ``ReplyStream`` nothing else reads."""
        feed = ReplyFeed(stream, message_id=message_id, monitor=monitor, timer=timer)
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="delta-publisher", daemon=True)
                self._thread.start()
        stream.set_waker(lambda: self._wake(feed))
        self._wake(feed)  # what the engine delivered before the waker was set
        return feed

    def _wake(self, feed: ReplyFeed) -> None:
        # On the engine's thread, once per event: a dict store and, when the thread sleeps, one notify.
        with self._cond:
            empty = not self._ready
            self._ready[id(feed)] = feed
            if empty:
                self._cond.notify()

    def _run(self) -> None:
        with tracing.quiet():  # one Redis span per step would drown the traces
            while True:
                with self._cond:
                    while not self._ready:
                        self._cond.wait()
                    feeds, self._ready = list(self._ready.values()), {}
                try:
                    self.publish_round(feeds)
                except Exception as exc:  # never reached by design; a reply must not wait forever if it is
                    logger.exception("the delta publisher's round failed")
                    for feed in feeds:
                        feed.inbox.put(("error", exc))

    def publish_round(self, feeds: list[ReplyFeed]) -> None:
        """Take every event the ``feeds`` have, publish the deltas this thread may publish in one round trip,
        then pass on what their task threads wait for. A failure other than Redis being unreachable fails
        only the replies it concerns (their task threads raise it)."""
        frames: list[tuple[int, dict]] = []
        published: dict[int, ReplyFeed] = {}  # id(feed) -> feed with a delta in `frames`, in order
        after: list[tuple[ReplyFeed, tuple[str, object]]] = []
        for feed in feeds:
            try:
                self._take(feed, frames, published, after)
            except Exception as exc:
                logger.exception("publishing the deltas of message %s failed", feed.message_id)
                feed.stream.set_waker(None)
                feed.stream.cancel()
                after.append((feed, ("error", exc)))
        if frames:
            started = time.time_ns()
            try:
                broadcast.publish_many(frames)
            except REDIS_ERRORS:
                for feed in published.values():
                    feed.publish_failed()
                published = {}
            except Exception as exc:
                logger.exception("publishing a step's deltas failed")
                for feed in published.values():
                    feed.inbox.put(("error", exc))
                published = {}
            ended = time.time_ns()
            for feed in published.values():
                if feed.first_publish is None:
                    feed.first_publish = (started, ended)
                    feed.inbox.put(("first", None))
        for feed, signal in after:
            feed.inbox.put(signal)

    def _take(self, feed: ReplyFeed, frames: list, published: dict, after: list) -> None:
        for event in feed.stream.drain():
            if isinstance(event, TokenEvent):
                with feed.lock:
                    mine = feed.owner == PUBLISHER and not feed.monitor.due(event.text, len(event.token_ids))
                    if not mine:
                        feed.owner = THREAD
                        feed.handed += 1
                if not mine:
                    # The task thread checks it, and every later delta until it has caught up; handed after
                    # this round's round trip, which may hold earlier deltas of the same reply.
                    after.append((feed, ("token", event)))
                    continue
                feed.timer.token(len(event.token_ids))
                feed.monitor.feed(event.text, len(event.token_ids))  # not due: appends, checks nothing
                frames.append(
                    (
                        feed.message_id,
                        broadcast.frame_token(message_id=feed.message_id, seq=event.seq, text=event.text),
                    )
                )
                published[id(feed)] = feed
            elif isinstance(event, FinishEvent):
                feed.stream.set_waker(None)
                after.append((feed, ("finish", event)))
            elif isinstance(event, EngineDead):
                feed.stream.set_waker(None)
                after.append((feed, ("error", event)))


_publisher = DeltaPublisher()


def follow(stream, *, message_id: int, monitor, timer) -> ReplyFeed:
    """:meth:`DeltaPublisher.follow` on this process's publisher."""
    return _publisher.follow(stream, message_id=message_id, monitor=monitor, timer=timer)
