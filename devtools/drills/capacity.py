"""Socket capacity of the web tier on the multi-host bed: ``idle`` chat sockets that only stay open plus
``streaming`` sockets each watching a reply whose token frames are published the way a worker publishes
them (``events.broadcast.publish``: replay stream + channel-layer group send), at ``rate`` tokens/s per
reply. Reports what the daphne processes hold (RSS, CPU), the frame delay from publish to client (p50/p99:
the publisher and the client processes share the machine's monotonic clock; the figure includes the
clients' own scheduling delay on this machine, so it is an upper bound), and refusals, errors and drops.
The sockets are read by ``clients`` processes (``devtools/drills/capacity_reader.py``) and the frames
published by one more (``devtools/drills/capacity_publisher.py``).

The replies are real rows (``streaming`` assistant messages in conversations of their own) and carry a
lease refreshed here, so the workers' reapers leave them alone while they stream."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from devtools.bed import services
from devtools.bed.topology import LB, WEB, WEB_PORT
from devtools.drills.client import drill_users
from events import broadcast


@dataclass
class CapacityResult:
    target: str
    idle: int
    streaming: int
    opened: int = 0
    refused: int = 0
    dropped: int = 0
    error_frames: int = 0
    frames_expected: int = 0
    frames_received: int = 0
    delays_ms: list[float] = field(default_factory=list)
    daphne: dict[str, dict[str, float]] = field(default_factory=dict)
    round_s: list[float] = field(default_factory=list)  # seconds each publishing round took

    def p(self, q: float) -> float:
        return statistics.quantiles(self.delays_ms, n=100)[q - 1] if len(self.delays_ms) > 1 else float("nan")

    def text(self) -> str:
        procs = "; ".join(
            f"{name}: {v['sockets']:.0f} sockets, RSS {v['rss_mb']:.0f} MB, CPU {v['cpu_pct']:.0f} %"
            for name, v in self.daphne.items()
        )
        return (
            f"{self.target}: {self.opened}/{self.idle + self.streaming} sockets held ({self.idle} idle +"
            f" {self.streaming} streaming), refused {self.refused}, dropped {self.dropped}, error frames"
            f" {self.error_frames}; frames {self.frames_received}/{self.frames_expected}; publish->client delay"
            f" p50 {self.p(50):.0f} ms, p99 {self.p(99):.0f} ms; {procs}; a publishing round took"
            f" {statistics.median(self.round_s or [0]) * 1000:.0f} ms median, {max(self.round_s or [0]) * 1000:.0f} max"
        )


def _make_replies(count: int) -> list[tuple[int, int]]:
    """``count`` streaming replies, one conversation each, spread over the capacity users; [(user index, id)]."""
    from django.contrib.auth import get_user_model

    from conversations.models import Conversation, Message

    out = []
    by_name = {u.username: u for u in get_user_model().objects.filter(username__startswith="bed-cap-")}
    owners = [by_name[f"bed-cap-{i}"] for i in range(len(by_name))]  # the order of drill_users' cookies
    for i in range(count):
        owner = owners[i % len(owners)]
        conv = Conversation.objects.create(owner=owner, title=f"capacity {i}")
        msg = Message.objects.create(conversation=conv, role="assistant", status="streaming", content="")
        out.append((i % len(owners), msg.pk))
    return out


def _finish_replies(ids: list[int]) -> None:
    from conversations.models import Message

    Message.objects.filter(pk__in=ids).update(status="completed", content="capacity run")


def _proc_sample(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds so far) of ``pid`` from /proc."""
    import os

    rss_kb = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS"))
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss_kb / 1024, cpu


def _socket_count(pid: int) -> int:
    import os

    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:  # closed while we looked
            pass
    return count


async def _publish_elsewhere(ids, *, tokens: int, rate: float, start: float, published: dict) -> list[float]:
    """Run :mod:`devtools.drills.capacity_publisher` in its own process; fill ``published``; returns the
    seconds each round of publishes (one token to every reply) took."""
    import json
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        ids_path, out_path = Path(tmp) / "ids.json", Path(tmp) / "published.json"
        ids_path.write_text(json.dumps(ids))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "devtools.drills.capacity_publisher", str(ids_path), str(tokens), str(rate),
            repr(start), str(out_path),
        )  # fmt: skip
        if await proc.wait() != 0:
            raise RuntimeError("the capacity publisher failed")
        out = json.loads(out_path.read_text())
        for key, at in out["published"].items():
            mid, seq = key.split(":")
            published[(int(mid), int(seq))] = at
        return out["round_s"]


def _split(items: list, parts: int) -> list[list]:
    return [items[i::parts] for i in range(parts)]


async def _start_readers(tmp, *, url: str, origin: str, tls: bool, cookies: list[str], idle: int,
                         replies: list[tuple[int, int]], clients: int):  # fmt: skip
    """Start ``clients`` reader processes sharing the sockets; wait until each has opened and resumed its
    share. Returns ``(processes, config paths, out paths, stop path)``; RuntimeError if one exits early."""
    import json
    import sys

    stop = tmp / "stop"
    procs, readies, outs = [], [], []
    idle_shares = [len(x) for x in _split(list(range(idle)), clients)]
    for i, (share, watch) in enumerate(zip(idle_shares, _split(replies, clients), strict=True)):
        cfg = {"url": url, "origin": origin, "tls": tls, "cookies": cookies, "idle": share,
               "watch": [list(w) for w in watch], "ready": str(tmp / f"ready{i}"), "stop": str(stop)}  # fmt: skip
        (tmp / f"cfg{i}.json").write_text(json.dumps(cfg))
        readies.append(tmp / f"ready{i}")
        outs.append(tmp / f"out{i}.json")
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, "-m", "devtools.drills.capacity_reader", str(tmp / f"cfg{i}.json"), str(outs[-1])))  # fmt: skip
    deadline = time.monotonic() + 600
    while not all(r.exists() for r in readies):
        if any(p.returncode is not None for p in procs) or time.monotonic() > deadline:
            stop.touch()
            raise RuntimeError("a capacity reader exited (or took 10 min) before opening its sockets")
        await asyncio.sleep(0.5)
    return procs, outs, stop


async def run(
    *, idle: int, streaming: int, through_lb: bool, tokens: int = 40, rate: float = 4.0, clients: int = 4
) -> CapacityResult:
    """Open ``idle`` + ``streaming`` sockets on web1 directly (or through the load balancer) from
    ``clients`` processes, stream ``tokens`` tokens at ``rate`` per second to each streaming socket's
    reply, and measure."""
    import json
    import tempfile
    from pathlib import Path

    if through_lb:
        url, origin, tls = f"wss://{LB.addr}/ws/chat/", f"https://{LB.addr}", True
        webs = list(WEB)
    else:
        url, origin, tls = (
            f"ws://{WEB[0].addr}:{WEB_PORT}/ws/chat/",
            f"http://{WEB[0].addr}:{WEB_PORT}",
            False,
        )
        webs = [WEB[0]]
    result = CapacityResult("LB, 2 web nodes" if through_lb else "one daphne process", idle, streaming)
    cookies = await sync_to_async(drill_users)(50, max_reply_tokens=64, prefix="bed-cap")
    replies = await sync_to_async(_make_replies)(streaming)
    ids = [mid for _, mid in replies]
    stop_lease = threading.Event()

    def hold_leases():
        client = broadcast.redis_client()
        while not stop_lease.is_set():
            pipe = client.pipeline(transaction=False)
            for mid in ids:
                pipe.set(broadcast.lease_key(mid), "capacity:0", ex=10)
            pipe.execute()
            stop_lease.wait(2)

    threading.Thread(target=hold_leases, daemon=True).start()
    published: dict[tuple[int, int], float] = {}  # filled by the publisher process
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            procs, outs, stop = await _start_readers(
                tmp,
                url=url,
                origin=origin,
                tls=tls,
                cookies=cookies,
                idle=idle,
                replies=replies,
                clients=clients,
            )
            pids = {f"daphne-{w.name}": services.pid_of(f"daphne-{w.name}") for w in webs}
            before = {n: _proc_sample(p) for n, p in pids.items()}
            t0 = time.monotonic()
            result.round_s = await _publish_elsewhere(
                ids, tokens=tokens, rate=rate, start=t0 + 2, published=published
            )
            await asyncio.sleep(3)
            wall = time.monotonic() - t0
            for name, pid in pids.items():
                rss, cpu = _proc_sample(pid)
                result.daphne[name] = {
                    "rss_mb": rss,
                    "cpu_pct": 100 * (cpu - before[name][1]) / wall,
                    "sockets": _socket_count(pid),
                }
            stop.touch()
            for proc in procs:
                await proc.wait()
            received: dict[tuple[int, int], float] = {}
            for out in outs:
                got = json.loads(out.read_text())
                for key in ("opened", "refused", "dropped", "error_frames"):
                    setattr(result, key, getattr(result, key) + got[key])
                for key, at in got["received"].items():
                    mid, seq = key.split(":")
                    received[(int(mid), int(seq))] = at
    finally:
        stop_lease.set()
    result.frames_expected = len(ids) * tokens
    result.frames_received = len(received)
    result.delays_ms = [1000 * (received[k] - published[k]) for k in received if k in published]
    await sync_to_async(_finish_replies)(ids)
    client = broadcast.redis_client()
    client.delete(*[broadcast.lease_key(m) for m in ids], *[broadcast.stream_key(m) for m in ids])
    return result
