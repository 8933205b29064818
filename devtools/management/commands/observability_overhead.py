"""``manage.py observability_overhead``: decode throughput of the engine at N concurrent requests with and
without the per-reply metrics and tracing the adapter does, rounds alternating; prints median [min-max].

Each "on" round also accounts, in situ, the CPU time every piece of observability work took in that very
round (``time.thread_time`` around each call, on whichever thread runs it: the engine's step listener, the
consumers' ITL and finish metrics and spans, the span exporter, the scrapes) and relates it to the round's
wall time. That share is an upper bound on the throughput lost to observability (it assumes every
microsecond of it delayed the engine), and unlike the A/B it is not drowned by the box's round-to-round
noise."""

import statistics
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Measure the overhead of metrics + tracing on decode throughput: N requests (128-token prompts, "
        "exactly --new-tokens each, greedy) per round, rounds alternating off/on."
    )
    _collector_registered = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.meter = CpuMeter()
        self.in_situ: list[float] = []  # per "on" round: observability CPU seconds / wall seconds

    def add_arguments(self, parser):
        parser.add_argument("--n", type=int, default=32)
        parser.add_argument("--new-tokens", type=int, default=128)
        parser.add_argument("--prompt-tokens", type=int, default=128)
        parser.add_argument("--rounds", type=int, default=3, help="rounds per mode")
        parser.add_argument(
            "--micro",
            action="store_true",
            help="time the per-token and per-reply observability work alone and relate it to --tokens-per-s",
        )
        parser.add_argument(
            "--tokens-per-s",
            type=float,
            default=293.8,
            help="engine decode tok/s at N (docs/performance-history/round-01.md)",
        )
        parser.add_argument("--cores", type=int, default=2)

    def handle(self, *args, n, new_tokens, prompt_tokens, rounds, micro, tokens_per_s, cores, **options):
        if micro:
            self.micro(rounds=rounds, new_tokens=new_tokens, tokens_per_s=tokens_per_s, cores=cores)
            return
        from inference.engine import LLMEngine, SamplingParams
        from inference.registry import engine_config, model_spec

        engine = LLMEngine.from_spec(model_spec(), engine_config(), settings.MODEL_CACHE_DIR)
        engine.start()
        tracer = self.tracer()
        params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
        prompts = [[(97 + 31 * i + j) % 20000 + 100 for j in range(prompt_tokens)] for i in range(n)]
        self.run_round(
            engine, prompts, SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True), None
        )
        results = {"off": [], "on": []}
        for r in range(rounds):
            for mode in ("off", "on"):
                tps = self.run_round(engine, prompts, params, tracer if mode == "on" else None)
                results[mode].append(tps)
                self.stdout.write(f"round {r + 1} {mode:>3}: {tps:.1f} tok/s")
        engine.shutdown(timeout=5)
        for mode, values in results.items():
            self.stdout.write(
                f"{mode:>3}: median {statistics.median(values):.1f} tok/s "
                f"[{min(values):.1f}-{max(values):.1f}] over {rounds} rounds"
            )
        shares = [share * 100 for share in self.in_situ]
        self.stdout.write(
            f"in situ: observability CPU per second of wall time in the 'on' rounds: median "
            f"{statistics.median(shares):.3f} % [{min(shares):.3f}-{max(shares):.3f}] "
            f"(upper bound on the decode throughput lost; N={n})"
        )
        off, on = statistics.median(results["off"]), statistics.median(results["on"])
        self.stdout.write(f"overhead: {(off - on) / off * 100:+.2f} % (median off vs on; N={n})")
        paired = [(a - b) / a * 100 for a, b in zip(results["off"], results["on"], strict=True)]
        self.stdout.write(
            f"overhead per round (off then on): median {statistics.median(paired):+.2f} % "
            f"[{min(paired):+.2f} to {max(paired):+.2f}]"
        )

    def micro(self, *, rounds: int, new_tokens: int, tokens_per_s: float, cores: int) -> None:
        """CPU cost of the adapter's observability per token (ITL observation) and per reply (finish
        metrics + 7 spans, batch-exported as JSON), and of one scrape; expressed as a share of ``cores`` at
        ``tokens_per_s`` decode throughput with ``new_tokens``-token replies and a scrape every 5 s."""
        from prometheus_client import REGISTRY, generate_latest

        from observability.metrics import ReplyTimer

        tracer = self.tracer()
        per_token, per_reply, per_scrape = [], [], []
        for _ in range(rounds):
            timer = ReplyTimer(model="bench", tier="bench")
            started = time.perf_counter()
            for _ in range(100_000):
                timer.token(1)
            per_token.append((time.perf_counter() - started) / 100_000)
            started = time.perf_counter()
            for _ in range(2_000):
                with tracer.start_as_current_span("generation"):
                    for name in (
                        "context.assembly",
                        "engine.queue_wait",
                        "engine.prefill",
                        "engine.decode",
                        "generation.final_write",
                    ):
                        tracer.start_span(name, start_time=time.time_ns()).end()
                    timer.finish(
                        finish_reason="length",
                        prompt_tokens=128,
                        completion_tokens=new_tokens,
                        queue_ms=5.0,
                        ttft_ms=50.0,
                        total_ms=900.0,
                    )
            per_reply.append((time.perf_counter() - started) / 2_000)
            started = time.perf_counter()
            for _ in range(50):
                generate_latest(REGISTRY)
            per_scrape.append((time.perf_counter() - started) / 50)
        tok, rep, scr = (statistics.median(v) for v in (per_token, per_reply, per_scrape))
        for label, values, unit in (
            ("per token", per_token, 1e6),
            ("per reply", per_reply, 1e6),
            ("per scrape", per_scrape, 1e6),
        ):
            self.stdout.write(
                f"{label}: median {statistics.median(values) * unit:.2f} us "
                f"[{min(values) * unit:.2f}-{max(values) * unit:.2f}] over {rounds} rounds"
            )
        cpu_per_s = tokens_per_s * tok + tokens_per_s / new_tokens * rep + scr / 5
        self.stdout.write(
            f"at {tokens_per_s} tok/s, {new_tokens}-token replies: {cpu_per_s * 1000:.2f} ms CPU "
            f"per second = {cpu_per_s / cores * 100:.3f} % of {cores} cores"
        )

    def tracer(self):
        """A real SDK tracer exporting in batches (JSON serialisation included) to /dev/null; the exporter's
        CPU time is charged to :attr:`meter`."""
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from observability.tracing import JsonFileSpanExporter

        meter = self.meter
        exporter = JsonFileSpanExporter("/dev/null")
        export = exporter.export
        exporter.export = lambda spans: meter.call(export, spans)
        self.provider = TracerProvider()
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        return self.provider.get_tracer("overhead")

    def run_round(self, engine, prompts, params, tracer) -> float:
        """Submit every prompt at once; returns generated tokens per second of wall time."""
        from prometheus_client import REGISTRY, generate_latest

        from observability.metrics import EngineCollector, ReplyTimer, StepMetrics

        total = [0]
        lock = threading.Lock()
        stop = threading.Event()
        meter = self.meter
        meter.reset()

        def finish(timer, span, event, submitted_ns):
            timer.finish_event(event)
            for name in ("engine.queue_wait", "engine.prefill", "engine.decode"):
                tracer.start_span(name, start_time=submitted_ns).end()
            span.end()

        def consume(handle, submitted_ns):
            timer = meter.call(ReplyTimer, model="bench", tier="bench") if tracer else None
            span = meter.call(tracer.start_span, "generation") if tracer else None
            for event in handle.events():
                if type(event).__name__ == "TokenEvent":
                    if timer:
                        meter.call(timer.token, len(event.token_ids))
                else:
                    if timer:
                        meter.call(finish, timer, span, event, submitted_ns)
                    with lock:
                        total[0] += event.usage.completion_tokens

        def scrape():  # a Prometheus scrape every second (real deployments: every 5-15 s)
            while not stop.wait(1.0):
                meter.call(generate_latest, REGISTRY)

        listener = None
        if tracer:
            # The engine gauges (read only when scraped) and, for this round only, the per-step histograms:
            # "off" rounds run with no observability at all.
            if not self._collector_registered:
                REGISTRY.register(
                    EngineCollector(type("Host", (), {"engine": engine, "model_name": "bench"})())
                )
                self._collector_registered = True
            step_metrics = StepMetrics(model="bench")

            def listener(stats):
                meter.call(step_metrics, stats)

            engine.add_step_listener(listener)
            threading.Thread(target=scrape, daemon=True).start()
        started = time.perf_counter()
        threads = []
        for prompt in prompts:
            handle = engine.submit(prompt, params)
            thread = threading.Thread(target=consume, args=(handle, time.time_ns()))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        stop.set()
        if listener is not None:
            engine.remove_step_listener(listener)
            self.provider.force_flush()  # this round's spans exported (and charged) now
            self.in_situ.append(meter.seconds / elapsed)
        return total[0] / elapsed


class CpuMeter:
    """Sums the CPU time (``time.thread_time``, seconds, of the calling thread) of the calls made through
    :meth:`call`, from any number of threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self.seconds = 0.0

    def reset(self) -> None:
        """Start a new round at 0 s."""
        with self._lock:
            self.seconds = 0.0

    def call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, charging its thread CPU time; returns its result."""
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.thread_time() - started
            with self._lock:
                self.seconds += spent
