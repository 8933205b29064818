"""Prometheus metrics of the worker (engine) and web processes (prometheus-client).

Engine metrics are named and typed after vLLM's (``vllm:time_to_first_token_seconds`` ...,
https://docs.vllm.ai/en/latest/design/metrics.html) with a ``chatsite:`` prefix, so dashboards built for
vLLM carry over by swapping the prefix. Labels: ``model`` (registered model name) and ``tier`` where a
request has one.

Where the figures come from:

* per-request histograms and counters: :func:`observe_token` / :func:`observe_finish`, called by
  ``conversations/reply_runner.py`` for each engine ``TokenEvent`` / ``FinishEvent`` (engine timings in ms);
* gauges (running, waiting, KV cache use): :class:`EngineCollector`, which reads ``engine.load()`` at scrape
  time, so nothing is computed between scrapes;
* per-step histograms (step duration, batch size, tokens per step by phase): :class:`StepMetrics`, a step
  listener on the engine's loop thread (``LLMEngine.add_step_listener``), registered with the collector.

One scrape endpoint per worker *process* (:func:`start_worker_endpoint`): a GPU worker is one Celery
process with ``--pool threads``, so all its task threads share this module's default registry and a
single HTTP endpoint sees every reply of that engine. Prometheus' multiprocess mode exists for prefork
pools (many child processes, one port); it is not needed here. Several workers on one host use one port
each (``METRICS_WORKER_PORT``; ``0`` picks a free port, published in the fleet status).

Web metrics (WebSocket connections and frames, admissions, API requests, SSE streams, pipeline overhead)
live in the same default registry of each web process and are served at ``/metrics``
(:mod:`operations.views`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

logger = logging.getLogger(__name__)

# Buckets after vLLM's (seconds).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
)

# --- engine (worker process) -----------------------------------------------------------------------------
TTFT = Histogram(
    "chatsite:time_to_first_token_seconds",
    "Time to first token (engine: from entering the engine).",
    ["model", "tier"],
    buckets=TTFT_BUCKETS,
)
ITL = Histogram(
    "chatsite:inter_token_latency_seconds",
    "Time between two streamed deltas, per token.",
    ["model", "tier"],
    buckets=ITL_BUCKETS,
)
E2E = Histogram(
    "chatsite:e2e_request_latency_seconds",
    "Time from entering the engine to the finish event.",
    ["model", "tier"],
    buckets=REQUEST_BUCKETS,
)
QUEUE_TIME = Histogram(
    "chatsite:request_queue_time_seconds",
    "Time waiting in the engine's queue before admission.",
    ["model", "tier"],
    buckets=REQUEST_BUCKETS,
)
PROMPT_TOKENS = Counter("chatsite:prompt_tokens", "Prefill tokens processed.", ["model", "tier"])
GENERATION_TOKENS = Counter("chatsite:generation_tokens", "Tokens generated.", ["model", "tier"])
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# vLLM's buckets for iteration_tokens_total.
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
STEP_DURATION = Histogram(
    "chatsite:engine_step_duration_seconds",
    "Wall time of one engine step: scheduling, forward pass, sampling, detokenizing, streaming.",
    ["model"],
    buckets=STEP_BUCKETS,
)
STEP_BATCH_SIZE = Histogram(
    "chatsite:engine_step_batch_size",
    "Requests with tokens in one engine step.",
    ["model"],
    buckets=BATCH_BUCKETS,
)
ITERATION_TOKENS = Histogram(  # vLLM's name (a histogram despite the _total)
    "chatsite:iteration_tokens_total",
    "Tokens through the model in one engine step (prefill + decode).",
    ["model"],
    buckets=ITERATION_TOKEN_BUCKETS,
)
STEP_TOKENS = Histogram(
    "chatsite:engine_step_tokens",
    "Tokens of one engine step by phase (prefill: prompt tokens computed; decode: one per decoding request); "
    "both phases are observed every step, zeros included.",
    ["model", "phase"],
    buckets=(0, *ITERATION_TOKEN_BUCKETS),
)
REQUEST_SUCCESS = Counter(
    "chatsite:request_success", "Finished requests by finish_reason.", ["model", "tier", "finish_reason"]
)

# --- web process -----------------------------------------------------------------------------------------
WS_OPEN = Gauge("chatsite:websocket_connections_open", "Chat WebSocket connections open.")
WS_FRAMES = Counter(
    "chatsite:websocket_frames", "WebSocket frames by direction and type.", ["direction", "type"]
)
ADMISSIONS = Counter("chatsite:admissions", "Generations admitted.", ["tier"])
ADMISSION_REJECTIONS = Counter(
    "chatsite:admission_rejections", "Generations refused by admission control.", ["tier", "reason"]
)
API_REQUESTS = Counter("chatsite:api_requests", "API requests by HTTP status.", ["status"])
SSE_OPEN = Gauge("chatsite:sse_streams_open", "Server-sent event streams open.")
PIPELINE_OVERHEAD = Histogram(
    "chatsite:pipeline_overhead_seconds",
    "Client-visible TTFT (send frame in -> first token frame out) minus the engine's TTFT.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
WS_REFUSAL = Histogram(
    "chatsite:websocket_refusal_seconds",
    "Admission refusal on the chat WebSocket: the consumer starts on the frame -> the error frame is handed to "
    "the server. decided: memory (cached figures, on the event loop) or read (after a database read).",
    ["decided"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)

KNOWN_FRAME_TYPES = frozenset(
    {"send", "stop", "resume", "regenerate", "queued", "started", "token", "done", "error", "session_ended"}
)


def frame_type(frame) -> str:
    """A frame's ``type`` for a label, bounded to known types (``other``) so bad input cannot blow up the
    label cardinality."""
    kind = frame.get("type") if isinstance(frame, dict) else None
    return kind if kind in KNOWN_FRAME_TYPES else "other"


def observe_ws_frame(direction: str, frame) -> None:
    """Count one WebSocket frame; ``direction`` is ``in`` or ``out``."""
    WS_FRAMES.labels(direction, frame_type(frame)).inc()


def observe_admission(*, tier: str, refused_code: str | None = None) -> None:
    """Count an admitted generation, or a refusal with its ``AdmissionRefused.code``."""
    if refused_code:
        ADMISSION_REJECTIONS.labels(tier, refused_code).inc()
    else:
        ADMISSIONS.labels(tier).inc()


def observe_api_request(status: int) -> None:
    """Count one API request by HTTP status (for the ``/v1`` API; see :class:`ApiMetricsMiddleware`)."""
    API_REQUESTS.labels(str(status)).inc()


@contextmanager
def sse_stream_open() -> Iterator[None]:
    """Wrap the body of an SSE response generator: the stream counts as open while the block runs."""
    SSE_OPEN.inc()
    try:
        yield
    finally:
        SSE_OPEN.dec()


class ApiMetricsMiddleware:
    """Counts requests under ``/v1/`` by status (sync and async views alike; Django middleware)."""

    prefix = "/v1/"
    # Both: a sync-only middleware would put the chain in a thread and stop a disconnect's cancellation there.
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        from asgiref.sync import iscoroutinefunction, markcoroutinefunction

        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.async_mode:
            return self._acall(request)
        response = self.get_response(request)
        if request.path.startswith(self.prefix):
            observe_api_request(response.status_code)
        return response

    async def _acall(self, request):
        response = await self.get_response(request)
        if request.path.startswith(self.prefix):
            observe_api_request(response.status_code)
        return response


class ReplyTimer:
    """Per-reply observer used by the reply runner (``conversations.reply_runner``): ITL between deltas and
    the finish event's figures.

    ``model``/``tier`` are label values. Costs one ``perf_counter`` call and one histogram observation per
    delta (measured in docs/operations.md, "Overhead of metrics and tracing")."""

    __slots__ = ("_itl", "_last", "model", "tier")

    def __init__(self, *, model: str, tier: str):
        self.model, self.tier = model, tier
        self._itl = ITL.labels(model, tier)
        self._last: float | None = None

    def token(self, n_tokens: int) -> None:
        """A delta of ``n_tokens`` tokens arrived now."""
        now = time.perf_counter()
        if self._last is not None and n_tokens > 0:
            gap = (now - self._last) / n_tokens
            for _ in range(n_tokens):
                self._itl.observe(gap)
        self._last = now

    def finish(
        self,
        *,
        finish_reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        queue_ms: float,
        ttft_ms: float | None,
        total_ms: float,
    ) -> None:
        """The engine's ``FinishEvent`` (timings in milliseconds)."""
        labels = (self.model, self.tier)
        if ttft_ms is not None:
            TTFT.labels(*labels).observe(ttft_ms / 1000)
        E2E.labels(*labels).observe(total_ms / 1000)
        QUEUE_TIME.labels(*labels).observe(queue_ms / 1000)
        PROMPT_TOKENS.labels(*labels).inc(prompt_tokens)
        GENERATION_TOKENS.labels(*labels).inc(completion_tokens)
        REQUEST_SUCCESS.labels(*labels, finish_reason).inc()

    def finish_event(self, event) -> None:
        """:meth:`finish` from an engine ``FinishEvent`` (its ``finish_reason``, ``usage`` and ``timings``)."""
        t = event.timings
        self.finish(
            finish_reason=event.finish_reason,
            prompt_tokens=event.usage.prompt_tokens,
            completion_tokens=event.usage.completion_tokens,
            queue_ms=t.queue_ms,
            ttft_ms=t.ttft_ms,
            total_ms=t.total_ms,
        )


class EngineCollector:
    """Scrape-time gauges from a worker host's ``engine.load()``: ``num_requests_running``,
    ``num_requests_waiting``, ``kv_cache_usage_perc`` (0..1, as vLLM) and ``num_preemptions_total``.

    The engine reserves each request's whole KV budget at admission and never preempts, so the preemption
    counter stays 0; it is exported so vLLM dashboards find it. ``host`` needs ``engine``, ``model_name``."""

    def __init__(self, host):
        self.host = host

    def collect(self):
        model = self.host.model_name
        load = self.host.engine.load()
        running = GaugeMetricFamily(
            "chatsite:num_requests_running", "Requests holding a KV slot.", labels=["model"]
        )
        running.add_metric([model], load.running)
        waiting = GaugeMetricFamily(
            "chatsite:num_requests_waiting", "Requests waiting for admission.", labels=["model"]
        )
        waiting.add_metric([model], load.waiting)
        kv = GaugeMetricFamily(
            "chatsite:kv_cache_usage_perc", "KV cache tokens reserved / budget (0..1).", labels=["model"]
        )
        kv.add_metric([model], load.kv_used_tokens / load.kv_total_tokens if load.kv_total_tokens else 0.0)
        preemptions = CounterMetricFamily(
            "chatsite:num_preemptions",
            "Requests preempted (never: the engine reserves KV at admission).",
            labels=["model"],
        )
        preemptions.add_metric([model], getattr(load, "num_preemptions", 0))
        yield from (running, waiting, kv, preemptions)


class StepMetrics:
    """Step listener feeding the per-step histograms of one engine serving ``model``
    (``engine.add_step_listener(StepMetrics(model=...))``).

    Runs on the engine's loop thread after every step, so it stays cheap: five observations on label
    children bound once, no allocation, no lock of ours (each observation takes prometheus-client's own
    short lock). ``StepStats.duration_s`` is measured before the listeners run."""

    __slots__ = ("_batch", "_decode", "_duration", "_prefill", "_tokens")

    def __init__(self, *, model: str):
        self._duration = STEP_DURATION.labels(model)
        self._batch = STEP_BATCH_SIZE.labels(model)
        self._tokens = ITERATION_TOKENS.labels(model)
        self._prefill = STEP_TOKENS.labels(model, "prefill")
        self._decode = STEP_TOKENS.labels(model, "decode")

    def __call__(self, stats) -> None:
        """Observe one :class:`~inference.engine.StepStats`."""
        self._duration.observe(stats.duration_s)
        self._batch.observe(stats.batch_size)
        self._tokens.observe(stats.num_prefill_tokens + stats.num_decode_tokens)
        self._prefill.observe(stats.num_prefill_tokens)
        self._decode.observe(stats.num_decode_tokens)


_collector: EngineCollector | None = None


def register_engine(host, *, registry=REGISTRY) -> None:
    """Export ``host``'s engine gauges from ``registry`` (this process's by default) and feed the per-step
    histograms from its engine's steps (:class:`StepMetrics`). Once per process: later calls do nothing."""
    global _collector
    if _collector is None:
        _collector = EngineCollector(host)
        registry.register(_collector)
        host.engine.add_step_listener(StepMetrics(model=host.model_name))


def start_worker_endpoint(port: int, addr: str = "127.0.0.1") -> int:
    """Serve this process's registry over HTTP on ``addr``:``port`` (``0``: a free port; loopback unless
    told otherwise, since the endpoint has no authentication). Returns the bound port."""
    server, _thread = start_http_server(port, addr=addr)
    bound = server.server_address[1]
    logger.info("metrics endpoint on %s:%d", addr, bound)
    return bound
