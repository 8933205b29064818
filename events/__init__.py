"""Events: what the product streams and signals through Redis and the channel layer.

Channel-layer group names, Redis keys, the frame shapes of ``docs/websocket-protocol.md``, the replay
streams, leases and the cancel pub/sub channel (:mod:`events.broadcast`). Imports no app but
``observability``; every app that streams to a browser or signals a worker goes through it.
"""
