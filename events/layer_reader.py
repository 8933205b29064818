"""Keep the channel layer's pub/sub reader awake in each web process (docs/overhead-levers.md, lever 12).

``channels_redis``' ``RedisPubSubChannelLayer`` reads its subscriptions in one task per event loop, and while
that loop's connection is subscribed to nothing the task sleeps 100 ms between looks
(``RedisSingleShardConnection._do_receiving``, channels_redis 4.3). A socket or an API stream that subscribes
during such a nap gets its first frames only when the nap ends: on a daphne whose sockets had all closed, the
first token of the next reply reached the consumer 54 ms p50 after the worker published it (``manage.py
reply_stages``). One subscription the process never leaves keeps the reader on its blocking read, which wakes
the moment a frame arrives.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

logger = logging.getLogger(__name__)

#: Event loops whose channel layer holds the keep-alive subscription.
_listening: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

#: Prefix of the keep-alive channel's name; nothing is ever sent to it.
KEEPALIVE_PREFIX = "keepalive."


async def keep_layer_listening(layer) -> None:
    """Subscribe ``layer`` (the running loop's channel layer, or ``None``) to one channel of its own, once per
    event loop, so its pub/sub reader never naps (module docstring). A no-op after the first call on a loop,
    and for a layer without subscriptions (channels_redis' list layer: ``new_channel`` only makes a name).

    Raises what ``layer.new_channel`` raises (Redis down: the caller's outage handling applies) and then
    tries again on the next call."""
    if layer is None:
        return
    loop = asyncio.get_running_loop()
    if loop in _listening:
        return
    _listening.add(loop)
    try:
        await layer.new_channel(KEEPALIVE_PREFIX)
    except BaseException:
        _listening.discard(loop)
        raise


async def release_channel(layer, channel: str) -> None:
    """Stop this process's subscription to ``channel``, a channel of ``layer`` that nothing will receive on
    again (an API stream's, once its reply's ``done`` frame was read). channels_redis' pub/sub layer drops a
    channel only when a ``receive`` on it is cancelled (its docstring: the way Channels' consumers leave); a
    stream that ended normally has no receive pending, so its channel stayed subscribed, one more per
    completion for the life of the process (found by ``manage.py bench_overhead``: 9 after 9 completions). A
    frame still buffered on the channel is dropped. Raises only the caller's own cancellation: on a Redis
    error the subscription ends with its connection."""
    while True:
        receive = asyncio.ensure_future(layer.receive(channel))
        try:
            await asyncio.sleep(0)  # it reaches its wait on the channel's queue (or takes a buffered frame)
        finally:
            if not receive.done():
                receive.cancel()
        try:
            await receive
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller itself is being cancelled: not swallowed
            return  # the layer unsubscribed the channel as the receive was cancelled
        except Exception:
            logger.warning("could not release channel-layer channel %s", channel, exc_info=True)
            return
