"""One client process of ``manage.py socket_capacity``: ``python -m devtools.drills.capacity_reader
CONFIG_JSON OUT_JSON``. The command starts several, so that reading 1,200 (or 2,400) sockets is not one
interpreter's work on one core, which would show as frame delay that daphne never caused.

CONFIG_JSON: ``{"url", "origin", "tls": bool, "cookies": [str], "idle": int, "watch": [[cookie index,
reply id]], "ready": path, "stop": path}``. The process opens ``idle`` sockets that only stay open and one
socket per ``watch`` entry that ``resume``s that reply from seq -1, writes ``{"opened", "refused"}`` to
``ready`` once every resume is sent (and 2 s passed for them to join their groups), then records when each
token frame arrives (``time.monotonic()``, one clock for every process of the machine) until the file
``stop`` exists. OUT_JSON: ``{"opened", "refused", "dropped", "error_frames", "received": {"mid:seq":
monotonic s}}``. No Django: it is a plain WebSocket client.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import time
from pathlib import Path

#: Handshakes in flight at once per process (a burst of hundreds would time out on a loaded machine).
CONNECTING = 20


async def _open(cfg: dict, cookie: str):
    import websockets

    kwargs = {}
    if cfg["tls"]:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        kwargs["ssl"] = ctx
    return await websockets.connect(
        cfg["url"], additional_headers={"Cookie": cookie}, origin=cfg["origin"], max_size=None,
        open_timeout=60, ping_interval=None, **kwargs,
    )  # fmt: skip


async def run(cfg: dict) -> dict:
    """Open, resume, signal ready, read until told to stop; the counts and arrival times (see module)."""
    import websockets

    out = {"opened": 0, "refused": 0, "dropped": 0, "error_frames": 0, "received": {}}
    gate = asyncio.Semaphore(CONNECTING)
    cookies = cfg["cookies"]

    async def open_one(cookie: str):
        async with gate:
            try:
                return await _open(cfg, cookie)
            except (TimeoutError, OSError, websockets.WebSocketException):
                out["refused"] += 1
                return None

    idle = await asyncio.gather(*(open_one(cookies[i % len(cookies)]) for i in range(cfg["idle"])))
    watched = await asyncio.gather(*(open_one(cookies[c]) for c, _ in cfg["watch"]))
    for ws, (_, mid) in zip(watched, cfg["watch"], strict=True):
        if ws is not None:
            await ws.send(json.dumps({"type": "resume", "message_id": mid, "after_seq": -1}))
    sockets = [ws for ws in (*idle, *watched) if ws is not None]
    out["opened"] = len(sockets)
    received = out["received"]

    async def reader(ws):
        try:
            async for payload in ws:
                frame = json.loads(payload)
                if frame.get("type") == "token":
                    received.setdefault(f"{frame['message_id']}:{frame['seq']}", time.monotonic())
                elif frame.get("type") == "error":
                    out["error_frames"] += 1
        except websockets.ConnectionClosed:
            pass
        out["dropped"] += 1  # the server ended it: every socket should stay open until told to stop

    readers = [asyncio.create_task(reader(ws)) for ws in sockets]
    await asyncio.sleep(2)  # the resumes have joined their groups
    Path(cfg["ready"]).write_text(json.dumps({"opened": out["opened"], "refused": out["refused"]}))
    while not Path(cfg["stop"]).exists():
        await asyncio.sleep(0.2)
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return out


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m devtools.drills.capacity_reader CONFIG_JSON OUT_JSON")
    cfg = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(asyncio.run(run(cfg))))


if __name__ == "__main__":
    main(sys.argv[1:])
