"""``manage.py observability_overhead``: decode throughput of the engine at N concurrent requests with and
without the per-reply metrics and tracing the adapter does, rounds alternating; prints median [min-max]."""

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

    def add_arguments(self, parser):
        parser.add_argument("--n", type=int, default=32)
        parser.add_argument("--new-tokens", type=int, default=128)
        parser.add_argument("--prompt-tokens", type=int, default=128)
        parser.add_argument("--rounds", type=int, default=3, help="rounds per mode")

    def handle(self, *args, n, new_tokens, prompt_tokens, rounds, **options):
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
        off, on = statistics.median(results["off"]), statistics.median(results["on"])
        self.stdout.write(f"overhead: {(off - on) / off * 100:+.2f} % (median off vs on; N={n})")

    @staticmethod
    def tracer():
        """A real SDK tracer exporting in batches (JSON serialisation included) to /dev/null."""
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from observability.tracing import JsonFileSpanExporter

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(JsonFileSpanExporter("/dev/null")))
        return provider.get_tracer("overhead")

    def run_round(self, engine, prompts, params, tracer) -> float:
        """Submit every prompt at once; returns generated tokens per second of wall time."""
        from prometheus_client import REGISTRY, generate_latest

        from observability.metrics import ReplyTimer, register_engine

        total = [0]
        lock = threading.Lock()
        stop = threading.Event()

        def consume(handle, submitted_ns):
            timer = ReplyTimer(model="bench", tier="bench") if tracer else None
            span = tracer.start_span("generation") if tracer else None
            for event in handle.events():
                if type(event).__name__ == "TokenEvent":
                    if timer:
                        timer.token(len(event.token_ids))
                else:
                    t = event.timings
                    if timer:
                        timer.finish(
                            finish_reason=event.finish_reason,
                            prompt_tokens=event.usage.prompt_tokens,
                            completion_tokens=event.usage.completion_tokens,
                            queue_ms=t.queue_ms,
                            ttft_ms=t.ttft_ms,
                            total_ms=t.total_ms,
                        )
                        for name in ("engine.queue_wait", "engine.prefill", "engine.decode"):
                            tracer.start_span(name, start_time=submitted_ns).end()
                        span.end()
                    with lock:
                        total[0] += event.usage.completion_tokens

        def scrape():  # a Prometheus scrape every second (real deployments: every 5-15 s)
            while not stop.wait(1.0):
                generate_latest(REGISTRY)

        if tracer:
            register_engine(type("Host", (), {"engine": engine, "model_name": "bench"})())
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
        return total[0] / elapsed
