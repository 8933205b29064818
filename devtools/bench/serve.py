"""One long-lived serving process of ``python -m devtools.bench.versus``: ours or vLLM, started once.

``python -m devtools.bench.serve --system ours|vllm --model DIR --threads N`` loads the model, prints one
JSON line ``{"ready": true, "startup_s": ...}``, then answers each JSON line on stdin
(``{"workload": Workload.to_dict()}``) with one JSON line: per-request records (``arrival`` and
``token_times`` in seconds relative to the run's start, ``token_ids``), the peak RSS of this process and its
children during the run (MB), and engine counters. vLLM's start-up (~90 s) is paid once per process, and it
runs in its own virtualenv (``scripts/install_vllm.sh``), so this module imports only the standard library,
``psutil`` and the system under test.

Both systems get the same token ids, greedy decoding, exactly ``max_new_tokens`` (``ignore_eos``), the same
bf16 weights (the prepared model directory) and ``--threads`` CPU threads. Each token is stamped with
``time.perf_counter()`` when this process (the client) receives it. Prefix caches are cleared before every
run, and before its peak RSS is reset, so no run profits from an earlier one or carries its cache in its peak.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from .metrics import read_status_mb, reset_peak_rss
from .workloads import Workload


class PeakRss:
    """Peak RSS of this process and its children during a run, summed (MB, 10**6 bytes): ``peak_mb``.

    Read from the kernel's per-process high-water mark (``VmHWM``, reset through ``/proc/PID/clear_refs`` on
    entry), which costs the measured system nothing while it runs: an earlier version sampled the process tree
    with psutil every 20 ms, ~1.7 ms of CPU and of this process's GIL each time, which slowed the engine thread of
    ``ours`` (same process) and not vLLM's engine core (its own processes). The sum of per-process peaks is an
    upper bound of the tree's peak (exact for one process). Where ``clear_refs`` is refused, it falls back to
    that sampling.
    """

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _tree(self) -> list:
        return [self._proc, *self._proc.children(recursive=True)]

    def _sample(self) -> None:
        total = 0
        for p in self._tree():
            try:
                total += p.memory_info().rss
            except Exception:  # a child may exit between listing and reading
                pass
        self.peak_mb = max(self.peak_mb, total / 1e6)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def __enter__(self) -> PeakRss:
        self._pids = [p.pid for p in self._tree()]
        if not all(reset_peak_rss(pid) for pid in self._pids):
            self._pids = []
            self._sample()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()
        else:
            self.peak_mb = sum(read_status_mb("VmHWM", pid) or 0.0 for pid in self._pids)


def step_summary(steps: list) -> dict:
    """Where a run's engine time went, from its :class:`~inference.engine.StepStats`: decode-only steps (count,
    summed seconds, p50 ms, mean batch), steps with prefill tokens (count, summed seconds, prefill tokens), and
    the share of steps run at each intra-op thread count."""
    decode = sorted(s.duration_s for s in steps if s.num_prefill_tokens == 0)
    prefill = [s for s in steps if s.num_prefill_tokens]
    threads: dict[str, int] = {}
    for s in steps:
        threads[str(s.num_threads)] = threads.get(str(s.num_threads), 0) + 1
    return {
        "decode_steps": len(decode),
        "decode_s": round(sum(decode), 3),
        "decode_step_ms_p50": round(decode[len(decode) // 2] * 1e3, 1) if decode else None,
        "decode_batch_mean": round(
            sum(s.num_decode_tokens for s in steps if not s.num_prefill_tokens) / max(1, len(decode)), 1
        ),
        "prefill_steps": len(prefill),
        "prefill_s": round(sum(s.duration_s for s in prefill), 3),
        "prefill_tokens": sum(s.num_prefill_tokens for s in prefill),
        "threads_share": {k: round(v / max(1, len(steps)), 3) for k, v in sorted(threads.items())},
    }


#: ``--sampling chat``: the chat's sampling (``INFERENCE_TEMPERATURE``, ``INFERENCE_TOP_P`` and
#: ``INFERENCE_REPETITION_PENALTY``'s defaults, ``chatsite/settings/base.py``), no seed, as the product sends it.
CHAT_SAMPLING = {"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1}


def sampling_fields(sampling: str) -> dict:
    """Sampling fields shared by both systems: greedy (``temperature`` 0) or the chat's (:data:`CHAT_SAMPLING`)."""
    return dict(CHAT_SAMPLING) if sampling == "chat" else {"temperature": 0.0}


class OursBackend:
    """``inference.engine.LLMEngine`` in its background thread, followed by one asyncio loop (no thread per
    stream), with per-token events (``token_events=True``) so every token is stamped as it arrives."""

    #: The requests' sampling fields (:func:`sampling_fields`; set by ``main`` from ``--sampling``).
    sampling: dict = {"temperature": 0.0}

    def __init__(
        self,
        model_dir: str,
        threads: int | None,
        max_seqs: int,
        max_batch_tokens: int | None,
        dtype: str,
        adaptive_threads: bool = True,
        native_kernels: bool = True,
    ) -> None:
        from inference.engine import EngineConfig, LLMEngine, ModelSpec, load_model

        # bfloat16 runs as float32 on a CPU without native bf16 (inference.engine.loader.compute_dtype).
        spec = ModelSpec(name=os.path.basename(model_dir.rstrip("/")), source=model_dir, dtype=dtype)
        loaded = load_model(spec, os.path.dirname(model_dir.rstrip("/")), device="cpu", num_threads=threads)
        config = EngineConfig(
            max_num_seqs=max_seqs,
            max_num_batched_tokens=max_batch_tokens,
            device="cpu",
            num_threads=threads,
            adaptive_threads=adaptive_threads,
            native_kernels=native_kernels,
        )
        self.engine = LLMEngine(loaded, config, owns_model=True)
        self.steps: list = []
        self.engine.add_step_listener(self.steps.append)
        self.engine.start()

    def reset(self) -> None:
        """Empty the prefix cache (no run profits from an earlier one); called before the run's peak RSS is reset."""
        self.engine.prefix_cache.clear()

    def run(self, wl: Workload) -> tuple[list[dict], dict]:
        import asyncio

        from inference.engine import SampledTokenEvent, SamplingParams

        self.steps.clear()
        before = self.engine.load()
        records: list[dict] = []
        t0 = time.perf_counter() + 0.05

        async def one(req) -> None:
            rec = {
                "rid": req.rid,
                "arrival": req.arrival_s,
                "token_times": [],
                "token_ids": [],
                "error": None,
            }
            records.append(rec)
            await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.perf_counter()))
            params = SamplingParams(**self.sampling, max_new_tokens=req.max_new_tokens, ignore_eos=True)
            handle = self.engine.submit(list(req.prompt_token_ids), params, token_events=True)
            async for ev in handle:
                if isinstance(ev, SampledTokenEvent):
                    rec["token_times"].append(time.perf_counter() - t0)
                    rec["token_ids"].append(ev.token_id)
                elif getattr(ev, "error", None):
                    rec["error"] = ev.error

        async def main() -> None:
            await asyncio.gather(*(one(r) for r in wl.requests))

        asyncio.run(main())
        after = self.engine.load()
        extra = {
            "prefix_cache_hit_tokens": after.prefix_cache_hit_tokens_total
            - before.prefix_cache_hit_tokens_total,
            "prefix_cache_query_tokens": after.prefix_cache_query_tokens_total
            - before.prefix_cache_query_tokens_total,
            "threads_now": self.engine.num_threads,
            "steps": step_summary(self.steps),
        }
        return records, extra

    def close(self) -> None:
        self.engine.shutdown()


class VllmBackend:
    """vLLM's ``LLMEngine`` (V1, engine core in its own process as vLLM runs by default), stepped by this
    process; requests are added at their arrival times and outputs come back as deltas."""

    #: As :attr:`OursBackend.sampling`.
    sampling: dict = {"temperature": 0.0}

    def __init__(
        self, model_dir: str, threads: int | None, max_seqs: int, max_batch_tokens: int | None, dtype: str
    ) -> None:
        from vllm import EngineArgs, LLMEngine

        args = EngineArgs(
            model=model_dir,
            dtype=dtype,
            max_model_len=4096,
            max_num_seqs=max_seqs,
            seed=0,
            disable_log_stats=True,
        )
        self.engine = LLMEngine.from_engine_args(args)

    def reset(self) -> None:
        """Empty vLLM's prefix cache, as :meth:`OursBackend.reset`."""
        self.engine.reset_prefix_cache()

    def run(self, wl: Workload) -> tuple[list[dict], dict]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        pending = sorted(wl.requests, key=lambda r: (r.arrival_s, r.rid))
        recs = {
            str(r.rid): {
                "rid": r.rid,
                "arrival": r.arrival_s,
                "token_times": [],
                "token_ids": [],
                "error": None,
            }
            for r in pending
        }
        t0 = time.perf_counter() + 0.05
        i = 0
        while i < len(pending) or self.engine.has_unfinished_requests():
            now = time.perf_counter()
            while i < len(pending) and t0 + pending[i].arrival_s <= now:
                r = pending[i]
                params = SamplingParams(
                    **self.sampling,
                    max_tokens=r.max_new_tokens,
                    ignore_eos=True,
                    output_kind=RequestOutputKind.DELTA,
                )
                self.engine.add_request(
                    str(r.rid), TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)), params
                )
                i += 1
            if not self.engine.has_unfinished_requests():
                time.sleep(max(0.0, min(0.005, t0 + pending[i].arrival_s - time.perf_counter())))
                continue
            outputs = self.engine.step()
            stamp = time.perf_counter() - t0
            for out in outputs:
                rec = recs[out.request_id]
                new = list(out.outputs[0].token_ids) if out.outputs else []
                rec["token_ids"].extend(new)
                rec["token_times"].extend([stamp] * len(new))
        return list(recs.values()), {}

    def close(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown:
            shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.serve")
    p.add_argument("--system", choices=["ours", "vllm"], required=True)
    p.add_argument("--model", required=True, help="prepared model directory (config.json + safetensors)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-seqs", type=int, default=32)
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="ours: per-step token budget (default: the engine's for this CPU)",
    )
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument(
        "--fixed-threads", action="store_true", help="ours: keep --threads (no adaptation to contention)"
    )
    p.add_argument(
        "--torch", action="store_true", help="ours: torch's SDPA and oneDNN only (no native kernels)"
    )
    p.add_argument(
        "--sampling",
        choices=["greedy", "chat"],
        default="greedy",
        help="greedy, or the chat's temperature, top-p and repetition penalty (both systems)",
    )
    args = p.parse_args(argv)
    # The protocol gets a private copy of stdout; fd 1 itself now points at stderr, so prints and logs of
    # libraries and of child processes (vLLM's engine core) cannot corrupt it.
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    started = time.perf_counter()
    if args.system == "ours":
        backend = OursBackend(
            args.model,
            args.threads,
            args.max_seqs,
            args.max_batch_tokens,
            args.dtype,
            adaptive_threads=not args.fixed_threads,
            native_kernels=not args.torch,
        )
    else:
        backend = VllmBackend(args.model, args.threads, args.max_seqs, args.max_batch_tokens, args.dtype)
    backend.sampling = sampling_fields(args.sampling)
    print(
        json.dumps({"ready": True, "startup_s": round(time.perf_counter() - started, 1)}),
        file=out,
        flush=True,
    )
    for line in sys.stdin:
        if not line.strip():
            continue
        wl = Workload.from_dict(json.loads(line)["workload"])
        try:
            # The caches are emptied before the peak is reset, so a run's peak holds none of an earlier run's cache.
            backend.reset()
            with PeakRss() as rss:
                records, extra = backend.run(wl)
            reply = {"records": records, "peak_rss_mb": round(rss.peak_mb, 1), **extra}
        except Exception as exc:  # report, keep serving
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), file=out, flush=True)
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
