"""The SSE body of a streamed completion: ``chat.completion.chunk`` events in OpenAI's order, fed by the
reply's frames (:mod:`api.follow`), and the cancellation of the generation however its client leaves.

A client can leave at three moments, all of which cancel the reply through its
:class:`~api.follow.ReplySubscription`:

* mid-stream: the ASGI handler sees ``http.disconnect`` and cancels the request's task; the
  ``CancelledError`` (or the ``GeneratorExit`` of ``aclose()``) reaches the generator, whose ``finally``
  closes the subscription;
* while the headers or the first chunk are being sent: with a server whose ``send`` waits for the socket,
  the task can be cancelled before the generator has started (or while it is parked at a ``yield``, which
  Django's ``aclosing`` does not reach through its wrappers). Django then closes the response, which calls
  :meth:`CompletionStream.close`: the subscription is closed there;
* before the reply was stored: handled by the view (``api.v1``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from api import chunks
from api.errors import ApiError, completion_failed
from api.follow import ReplyLost, ReplySubscription, reply_frames
from conversations.models import Message
from observability import tracing
from observability.metrics import sse_stream_open


class CompletionStream:
    """Async-iterable SSE body (bytes per event) for one reply; ``close()`` is called by Django when the
    response is closed (``StreamingHttpResponse`` registers an iterable's ``close`` as a resource closer).

    ``subscription``: the view's hold on the reply; ``ids``: ``id``, ``created``, ``model`` of every chunk;
    ``trace``: the request's span context (``tracing.current_context()``), parent of the ``sse.first_token``
    span (the first token received from the channel layer, then its chunk handed to daphne), or None."""

    def __init__(self, subscription: ReplySubscription, *, include_usage: bool, ids: dict, trace=None):
        self.subscription = subscription
        self.include_usage = include_usage
        self.ids = ids
        self.trace = trace

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._events()

    def close(self) -> None:
        """Cancel the reply unless it ended (sync: Django runs it in a thread). Idempotent."""
        self.subscription.close()

    def _chunk(self, **fields) -> bytes:
        return chunks.sse(chunks.chunk(include_usage=self.include_usage, **fields, **self.ids))

    async def _events(self) -> AsyncIterator[bytes]:
        sub = self.subscription
        sent = []
        with sse_stream_open():
            try:
                yield self._chunk(delta={"role": "assistant", "content": ""})
                async for frame in reply_frames(sub.layer, sub.channel, sub.message_id):
                    if frame["type"] == "token":
                        if frame["text"]:
                            received_ns = time.time_ns()
                            sent.append(frame["text"])
                            yield self._chunk(delta={"content": frame["text"]})
                            if self.trace is not None:  # pulled again: daphne took the first token's chunk
                                tracing.record_span(
                                    "sse.first_token", received_ns, time.time_ns(), parent=self.trace
                                )
                                self.trace = None
                        continue
                    done, sub.ended = frame, True
                    # A blocked reply ends like a completed one, with finish_reason "content_filter".
                    if done["status"] not in (Message.Status.COMPLETED, Message.Status.BLOCKED):
                        yield chunks.sse(completion_failed(done).body())
                        return
                    streamed = "".join(sent)
                    rest = done["content"][len(streamed) :] if done["content"].startswith(streamed) else ""
                    if rest:  # frames lost on the way (never expected; the stored text is the truth)
                        yield self._chunk(delta={"content": rest})
                    yield self._chunk(finish_reason=done["finish_reason"] or "stop")
                    if self.include_usage:
                        yield chunks.sse(
                            chunks.chunk(
                                usage=chunks.usage_of(done), include_usage=True, final_usage=True, **self.ids
                            )
                        )
                    yield chunks.DONE
            except ReplyLost as exc:
                sub.ended = True
                yield chunks.sse(ApiError(500, str(exc), type="server_error", code="reply_lost").body())
            finally:
                # Client gone (CancelledError / GeneratorExit) or the stream's end: cancel unless it ended.
                await sub.aclose()
