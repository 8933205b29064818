"""``manage.py loadtest_backends``: the product's load test (``manage.py loadtest``) against each serving backend,
side by side in one run, rounds interleaved (native, vLLM, native, vLLM, ...), so both meet the same host.

It starts its own web process (daphne on a free port) and one worker per backend, both serving the default
model's weights under a model alias of their own (``loadtest-native``, ``loadtest-vllm``: their own broker
queues, so the stack's usual worker, if one runs, takes none of these replies). The vLLM worker runs from
``.venv-vllm`` (``make install-vllm``). Both backends run the same dtype (``INFERENCE_DTYPE``).

Per round and backend: output tokens/s, client TTFT p50/p99 (``loadtest``'s own figures) and the worker's peak
RSS during the round (the kernel's high-water mark ``VmHWM``, reset before the round, summed over the worker
process and its children: vLLM's engine core and model worker). Printed as median [min-max] over ``--rounds``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from devtools.bench.metrics import read_status_mb, reset_peak_rss
from devtools.drills.processes import DrillWorker, child_env

VLLM_PYTHON = str(Path(settings.BASE_DIR) / ".venv-vllm" / "bin" / "python")


def alias(backend: str) -> str:
    return f"loadtest-{backend}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tree(pid: int) -> list[int]:
    """``pid`` and every descendant's pid."""
    proc = psutil.Process(pid)
    return [pid, *(p.pid for p in proc.children(recursive=True))]


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    """``median [min-max]``."""
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


class Command(BaseCommand):
    help = (
        "Run `loadtest` against a native and a vLLM worker, rounds interleaved; median [min-max] per backend."
    )

    def add_arguments(self, parser):
        parser.add_argument("--backends", default="native,vllm")
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--clients", type=int, default=8)
        parser.add_argument("--messages", type=int, default=2)
        parser.add_argument("--max-tokens", type=int, default=64)
        parser.add_argument("--json", dest="json_path", help="also write every round's figures here")

    def handle(self, *args, backends, rounds, clients, messages, max_tokens, json_path, **options):
        names = [b.strip() for b in backends.split(",") if b.strip()]
        if not names or any(b not in ("native", "vllm") for b in names) or rounds < 1:
            raise CommandError("--backends must name native and/or vllm, --rounds must be >= 1")
        if "vllm" in names and not os.path.exists(VLLM_PYTHON):
            raise CommandError("vLLM is not installed: run `make install-vllm` (makes .venv-vllm)")
        default = settings.INFERENCE_DEFAULT_MODEL
        aliases = ",".join(f"{alias(b)}={default}" for b in names)
        # This process's settings must know the aliases too: `loadtest` routes its tier to one.
        for b in names:
            settings.INFERENCE_MODELS[alias(b)] = {**settings.INFERENCE_MODELS[default], "alias_of": default}
        env = {"INFERENCE_MODEL_ALIASES": aliases, "METRICS_WORKER_PORT": "", "PYTHONUNBUFFERED": "1"}
        logs = Path(tempfile.mkdtemp(prefix="loadtest-backends-"))
        self.stdout.write(f"logs in {logs}")
        port = free_port()
        web = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"],
            cwd=settings.BASE_DIR,
            env=child_env(**env),
            stdout=open(logs / "daphne.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        workers: dict[str, DrillWorker] = {}
        try:
            for b in names:
                workers[b] = DrillWorker(
                    f"loadtest-{b}",
                    logs,
                    queues=[f"inference.{alias(b)}"],
                    extra_env={**env, "INFERENCE_BACKEND": b, "INFERENCE_DEFAULT_MODEL": alias(b)},
                    python=VLLM_PYTHON if b == "vllm" else None,
                )
            for b in names:
                workers[b].wait_ready(timeout=600)
            time.sleep(2)  # the fleet status of each worker is published
            rows = self.run_rounds(names, workers, rounds, clients, messages, max_tokens, port, logs)
        finally:
            for worker in workers.values():
                worker.stop()
            if web.poll() is None:
                os.killpg(web.pid, signal.SIGTERM)
                web.wait(20)
        self.print_table(names, rows, rounds, clients, messages, max_tokens)
        if json_path:
            with open(json_path, "w") as fh:
                json.dump(rows, fh, indent=2)

    def run_rounds(self, names, workers, rounds, clients, messages, max_tokens, port, logs) -> list[dict]:
        rows = []
        # A warm-up reply per backend: first-batch costs (allocator growth, kernel selection) stay out of round 1.
        for b in names:
            self.loadtest(b, 1, 1, max_tokens, port, logs / "warmup.json")
        for r in range(rounds):
            for b in names:
                pids = tree(workers[b].pid)
                for pid in pids:
                    reset_peak_rss(pid)
                summary = self.loadtest(b, clients, messages, max_tokens, port, logs / f"{b}-{r}.json")
                peak = sum(read_status_mb("VmHWM", pid) or 0.0 for pid in pids)
                row = {"backend": b, "round": r, "peak_rss_mb": peak, **summary}
                rows.append(row)
                self.stdout.write(
                    f"round {r} {b}: {summary['output_tokens_per_s']} tok/s, client TTFT p50 "
                    f"{summary['client_ttft_ms']['p50']:.0f} ms p99 {summary['client_ttft_ms']['p99']:.0f} ms, "
                    f"peak RSS {peak:.0f} MB, {summary['completed']}/{summary['replies']} completed"
                )
        return rows

    def loadtest(self, backend, clients, messages, max_tokens, port, json_path) -> dict:
        call_command(
            "loadtest",
            url=f"ws://127.0.0.1:{port}/ws/chat/",
            origin=f"http://127.0.0.1:{port}",
            clients=clients,
            messages=messages,
            max_tokens=max_tokens,
            model=alias(backend),
            json_path=str(json_path),
            stdout=open(os.devnull, "w"),
        )
        with open(json_path) as fh:
            return json.load(fh)["summary"]

    def print_table(self, names, rows, rounds, clients, messages, max_tokens) -> None:
        self.stdout.write(
            f"\n{clients} clients x {messages} messages, max {max_tokens} tokens, {rounds} rounds: median [min-max]"
        )
        self.stdout.write(
            f"{'backend':<8} {'tok/s':<18} {'TTFT p50 ms':<20} {'TTFT p99 ms':<20} {'peak RSS MB':<18}"
        )
        for b in names:
            mine = [r for r in rows if r["backend"] == b]
            self.stdout.write(
                f"{b:<8} {spread([r['output_tokens_per_s'] for r in mine], '{:.1f}'):<18} "
                f"{spread([r['client_ttft_ms']['p50'] for r in mine]):<20} "
                f"{spread([r['client_ttft_ms']['p99'] for r in mine]):<20} "
                f"{spread([r['peak_rss_mb'] for r in mine]):<18}"
            )
