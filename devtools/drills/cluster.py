"""Drills on the multi-host test bed (``devtools/bed``), run from its client host through the load
balancer: a worker host killed mid-stream, a worker host cut off from the data host, a web node killed
mid-stream under a browser, a rolling restart of the web tier. Each returns a :class:`DrillResult`."""

from __future__ import annotations

import asyncio
import signal
import time

from asgiref.sync import sync_to_async

from devtools.bed import netns, services
from devtools.bed.topology import DATA, GPU, WEB
from devtools.drills.bed_clients import LoadClient, http_load, open_socket, stored_reply
from devtools.drills.client import Socket, drill_users, wait_settled
from devtools.drills.replies import (
    LONG_PROMPT,
    SHORT_PROMPT,
    check_final,
    done_for,
    is_answer,
    send_frame,
    start_streaming,
)
from devtools.drills.report import DrillResult
from events import broadcast
from inference import fleet


def worker_of_reply(message_id: int) -> str | None:
    """The bed process name (``worker-gpuN``) holding ``message_id``'s lease, if one of the bed's workers."""
    holder = (broadcast.redis_client().get(broadcast.lease_key(message_id)) or b"").decode()
    for host in GPU:
        name = f"worker-{host.name}"
        if holder.endswith(f":{services.pid_of(name)}"):
            return name
    return None


def _rejoined_idle(name: str) -> bool:
    """Whether bed worker ``name`` is ready in the fleet, owns no reply, and runs no reply task. The last
    is asked over the broker (``inspect active``): a task thread that claimed its reply in the instant the
    link was cut sits in a database read until TCP's retransmission back-off gives up (up to ~50 s after
    a 60 s partition heals) before it takes the reply's lease, so the fleet's count does not show it yet,
    and its reply would be judged while the reapers' ``interrupted`` is about to be replaced."""
    from chatsite.celery import app

    pid = services.pid_of(name)
    if not any(w.pid == pid and w.ready and not w.active_replies for w in fleet.live_workers()):
        return False
    node = f"gpu@bed-{name.removeprefix('worker-')}"
    active = app.control.inspect(destination=[node], timeout=2).active() or {}
    return node in active and not active[node]


async def worker_host_kill(*, trials: int) -> DrillResult:
    """SIGKILL the worker host generating a reply mid-stream, send another reply 0.1 s later, restart the
    killed worker. Held as today's single-host drill: the killed reply ends ``interrupted`` with its streamed
    text (or completes), the later reply is served by the other host, nothing is left queued/streaming.
    Recovery: from the kill until both replies are final."""
    result = DrillResult("worker host SIGKILL mid-stream (bed)")
    cookies = await sync_to_async(drill_users)(2, max_reply_tokens=48, prefix="bed-kill")
    for trial in range(trials):
        a, b = await open_socket(cookies[0]), await open_socket(cookies[1])
        try:
            first, streamed = await start_streaming(a)
            victim = await sync_to_async(worker_of_reply)(first)
            if victim is None:
                result.notes.append(f"trial {trial + 1}: reply not held by a bed worker; skipped")
                continue
            result.trials += 1
            killed_at = time.monotonic()
            services.signal_proc(victim, signal.SIGKILL)
            await asyncio.sleep(0.1)
            await b.send(send_frame(SHORT_PROMPT))
            answer = await b.until(is_answer, timeout=30)
            second = answer.get("message_id") if answer["type"] == "queued" else None
            if second is None:
                result.failures.append(f"send after the kill refused: {answer}")
            done_a = await a.until(done_for(first), timeout=90)
            check_final(result, done_a, streamed, "killed reply")
            ids = [first] + ([second] if second else [])
            if second:
                done_b = await b.until(done_for(second), timeout=180)
                if done_b["status"] != "completed" or not done_b.get("content"):
                    result.failures.append(f"reply after the kill ended {done_b['status']}")
            state, _ = await wait_settled(ids, timeout=60)
            result.recovery_s.append(time.monotonic() - killed_at)
            result.stuck += state.active
            result.lost += state.missing
            result.notes.append(f"trial {trial + 1}: killed {victim}; its reply ended {done_a['status']}")
        finally:
            await a.close()
            await b.close()
            if result.trials and not services.alive(victim or ""):
                await asyncio.to_thread(_restart_worker, victim)
    return result


def _restart_worker(name: str) -> None:
    host = next(h for h in GPU if f"worker-{h.name}" == name)
    services.worker_start(host)
    services.worker_wait_ready(name)


async def partition(*, seconds: float, replies: int = 3) -> DrillResult:
    """Cut the worker host generating a reply off the data host (PostgreSQL, Redis, broker) for
    ``seconds`` (iptables DROP both ways), with ``replies`` replies in flight. Held when every reply reaches
    a final state with text, nothing stays queued/streaming, and the cut-off worker is ready again in the
    fleet by itself (no restart). Recovery: from the heal until all that is true."""
    result = DrillResult(f"worker host <-> data host partition {seconds:.0f} s (bed)")
    cookies = await sync_to_async(drill_users)(replies, max_reply_tokens=48, prefix="bed-part")
    sockets = [await open_socket(c) for c in cookies]
    try:
        first, _ = await start_streaming(sockets[0])
        victim = await sync_to_async(worker_of_reply)(first)
        ids = [first]
        for s in sockets[1:]:
            await s.send(send_frame(LONG_PROMPT))
            answer = await s.until(is_answer, timeout=30)
            if answer["type"] == "queued":
                ids.append(answer["message_id"])
        if victim is None:
            result.failures.append("the streaming reply is not held by a bed worker")
            return result
        host = next(h for h in GPU if f"worker-{h.name}" == victim)
        result.trials = 1
        netns.partition(host, DATA)
        try:
            await asyncio.sleep(seconds)
        finally:
            netns.heal(host, DATA)
        healed = time.monotonic()
        # The cut-off worker may still finish a reply the reapers already stored `interrupted` (its final
        # write replaces that, generation_worker.generation_finish): judge the replies once it has rejoined
        # and holds none.
        deadline = time.monotonic() + 240
        while not await sync_to_async(_rejoined_idle)(victim):
            if time.monotonic() > deadline or not services.alive(victim):
                result.failures.append(
                    f"{victim} did not rejoin the fleet by itself within 240 s of the heal"
                )
                break
            await asyncio.sleep(1)
        state, _ = await wait_settled(ids, timeout=240)
        result.stuck += state.active
        result.lost += state.missing
        for mid in ids:
            status, content = await stored_reply(mid)
            if status not in ("completed", "interrupted") or not content:
                result.failures.append(f"reply {mid} ended {status} with {len(content)} chars")
        result.recovery_s.append(time.monotonic() - healed)
        statuses = [(await stored_reply(mid))[0] for mid in ids]
        result.notes.append(f"cut off {victim}; replies ended {', '.join(statuses)}")
    finally:
        for s in sockets:
            await s.close()
    return result


async def rolling_web(*, clients: int = 4) -> DrillResult:
    """Restart every web node in turn while chat users and HTTP requests run through the load balancer:
    drain the node at the LB (runtime API), wait for its HTTP requests in flight, SIGTERM it, start it
    again, put it back once its checks pass, then the next node. Goal: 0 failed requests, 0 broken streams
    (a socket cut by the restart is reconnected and resumed, as the page does). Recovery: seconds the whole
    rollout took."""
    from devtools.drills.cluster_browser import wait_lb

    result = DrillResult("rolling restart of the web tier under load (bed)")
    cookies = await sync_to_async(drill_users)(clients, max_reply_tokens=24, prefix="bed-roll")
    users = [LoadClient(c) for c in cookies]
    counts = {"ok": 0, "failed": 0}
    stop = asyncio.Event()
    tasks = [asyncio.create_task(u.run(stop)) for u in users] + [asyncio.create_task(http_load(stop, counts))]
    await asyncio.sleep(5)
    started = time.monotonic()
    for host in WEB:
        services.lb_command(f"set server web/{host.name} state drain")
        await asyncio.sleep(2)
        await asyncio.to_thread(services.signal_proc, f"daphne-{host.name}", signal.SIGTERM)
        await asyncio.to_thread(services.web_start, host)
        services.lb_command(f"set server web/{host.name} state ready")
        await asyncio.to_thread(wait_lb, host.name, "UP")
    result.recovery_s.append(time.monotonic() - started)
    await asyncio.sleep(5)
    stop.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    result.trials = 1
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    ids = [mid for u in users for mid in u.ids]
    state, _ = await wait_settled(ids, timeout=120)
    result.stuck, result.lost = state.active, state.missing
    broken = sum(u.broken for u in users)
    if counts["failed"]:
        result.failures.append(f"{counts['failed']} failed HTTP requests of {sum(counts.values())}")
    if broken or errors:
        result.failures.append(f"{broken} broken streams, client errors {errors}")
    result.notes.append(
        f"{sum(counts.values())} HTTP requests, {counts['failed']} failed; {len(ids)} replies,"
        f" {sum(u.completed for u in users)} completed, {broken} broken;"
        f" {sum(u.reconnects for u in users)} reconnects"
    )
    return result


async def _ttft_round(socket: Socket, replies: int) -> tuple[list[float], list[int]]:
    """``replies`` short replies one after another: (client-side TTFT per reply in s, reply ids)."""
    ttfts, ids = [], []
    for _ in range(replies):
        sent = time.monotonic()
        await socket.send(send_frame(SHORT_PROMPT))
        answer = await socket.until(is_answer, timeout=60)
        if answer["type"] != "queued":
            raise RuntimeError(f"send refused: {answer}")
        mid = answer["message_id"]
        ids.append(mid)
        await socket.until(lambda f, mid=mid: f["type"] == "token" and f["message_id"] == mid, timeout=180)
        ttfts.append(time.monotonic() - sent)
        await socket.until(done_for(mid), timeout=180)
    return ttfts, ids


async def _watch_balancer(seen: set[str], every_s: float = 0.25) -> None:
    """Add to ``seen`` each ``"webN STATE"`` the balancer reports other than ``UP``, until cancelled."""
    while True:
        states = await asyncio.to_thread(services.lb_server_states)
        seen.update(f"{name} {state}" for name, state in states.items() if state != "UP")
        await asyncio.sleep(every_s)


async def lossy_broker(*, loss: float = 0.02, delay_ms: float = 100, replies: int = 12) -> DrillResult:
    """A slow, lossy broker link: every byte between the web/worker hosts and RabbitMQ ``delay_ms`` late
    each way (the delay proxies of ``devtools/bed/delay_proxy.py``, this kernel having no netem) and a
    random ``loss`` fraction of the packets to and from RabbitMQ's port dropped on the data, web and worker
    hosts (iptables' statistic match). ``replies`` short replies in each condition, in alternating blocks
    of 3 so that drift in the shared machine's load falls on both. Held when every reply completes; the
    note gives the client-side TTFT (send -> first token), median [min-max], on the clean and the impaired
    link, and the median cost."""
    import statistics

    from devtools.bed.topology import AMQP_PORT

    result = DrillResult(f"broker link {delay_ms:g} ms delay + {loss:.0%} packet loss (bed)")
    cookie = (await sync_to_async(drill_users)(1, max_reply_tokens=16, prefix="bed-lossy"))[0]
    socket = await open_socket(cookie)
    clean, impaired, ids = [], [], []
    # A slow broker link is no reason to take a web node out of the pool (and cut its sockets): every
    # state the balancer shows other than a plain UP is a failure.
    seen: set[str] = set()
    watching = asyncio.create_task(_watch_balancer(seen))
    try:
        while len(impaired) < replies:
            block = min(3, replies - len(impaired))
            ttfts, block_ids = await _ttft_round(socket, block)
            clean += ttfts
            rules = [(host, netns.lossy_port(host, AMQP_PORT, loss=loss)) for host in (DATA, *WEB, *GPU)]
            await asyncio.to_thread(services.broker_delay, delay_ms)
            try:
                ttfts, more_ids = await _ttft_round(socket, block)
            finally:
                await asyncio.to_thread(services.broker_delay, 0)
                for host, rule in rules:
                    netns.unlossy(host, rule)
            impaired += ttfts
            ids += block_ids + more_ids
    finally:
        watching.cancel()
        await socket.close()
    if seen:
        result.failures.append(f"the balancer saw web nodes as {sorted(seen)}")
    result.trials = len(impaired)
    state, _ = await wait_settled(ids, timeout=60)
    result.stuck, result.lost = state.active, state.missing
    for mid in ids:
        status, content = await stored_reply(mid)
        if status != "completed" or not content:
            result.failures.append(f"reply {mid} ended {status}")

    def fmt(values):
        values = sorted(values)
        return f"{statistics.median(values):.2f} [{values[0]:.2f}-{values[-1]:.2f}] s"

    cost = statistics.median(impaired) - statistics.median(clean)
    result.notes.append(
        f"client TTFT over {len(clean)} replies each: clean link {fmt(clean)}, impaired {fmt(impaired)};"
        f" median cost {cost * 1000:.0f} ms"
    )
    return result
