"""``python -m devtools.bench.versus``: ours against vLLM's CPU build, side by side, interleaved round by round.

Each system runs in one long-lived process (:mod:`.serve`) started once (vLLM's start-up is ~90 s), vLLM from
its own virtualenv (``scripts/install_vllm.sh`` makes ``.venv-vllm``). Every round runs every (workload,
condition) cell on every system one after the other, so a slow patch of machine time (other users) hits both
systems alike; figures are reported as median [min-max] over the rounds, and the ratios ours ÷ vLLM are taken
per round before the median.

Workloads (same token ids for both; greedy, or the chat's sampling with ``+chat`` systems; exactly
``max_new_tokens``, EOS ignored):

* ``uniform1``, ``uniform8``, ``uniform32``: N requests at t=0, 128-token prompts, 128 new tokens;
* ``mixed``: Poisson arrivals at ``--rate`` req/s, prompts 20-1500 tokens, replies 16-512 tokens.

Conditions: ``quiet`` and ``busy`` (a CPU-bound neighbour process, ``python -c 'while True: pass'``, runs
during the cell: one core's worth of contention on a 2-core box).

Example::

    python -m devtools.bench.versus --rounds 3
    python -m devtools.bench.versus --systems ours --workloads uniform32 --conditions quiet,busy
    python -m devtools.bench.versus --systems ours,ours@2048,vllm   # ours at two per-step token budgets
    python -m devtools.bench.versus --systems ours,vllm,vllm:float32  # vLLM in bf16 and in float32
    python -m devtools.bench.versus --systems ours,ours+fixed,vllm  # ours with adaptive and with fixed threads
    python -m devtools.bench.versus --systems ours,ours+torch,vllm  # native kernels vs torch's SDPA + oneDNN
    python -m devtools.bench.versus --systems ours+chat,vllm+chat   # the chat's sampling instead of greedy
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime

from .loader import DEFAULT_SPEC, load_tokenizer, prepare
from .metrics import RequestRecord, summarize
from .workloads import RealisticParams, corpus_token_ids, realistic_workload, uniform_workload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VLLM_PYTHON = os.path.join(ROOT, ".venv-vllm", "bin", "python")
#: Seconds of quiet before each cell, so no system starts while the previous one still runs down.
SETTLE_S = 2.0


class Server:
    """A :mod:`.serve` process speaking JSON lines."""

    def __init__(self, system: str, model_dir: str, threads: int | None, python: str) -> None:
        # "ours@2048": ours with another per-step token budget (max_num_batched_tokens), as a system of its own;
        # "vllm:float32": another dtype than the default bfloat16.
        # "ours+fixed": ours with a fixed thread count (no adaptation to contention); "ours+torch": torch's SDPA
        # and oneDNN instead of the native kernels (EngineConfig.native_kernels=False); "ours+fixed+torch": both.
        # "+chat" (either system): the chat's sampling (temperature 0.7, top-p 0.9, repetition penalty 1.1)
        # instead of greedy.
        name, _, budget = system.partition("@")
        name, *variants = name.split("+")
        base, _, dtype = name.partition(":")
        cmd = [python, "-m", "devtools.bench.serve", "--system", base, "--model", model_dir]
        flags = {"fixed": ["--fixed-threads"], "torch": ["--torch"], "chat": ["--sampling", "chat"]}
        for variant in variants:
            if variant not in flags:
                raise SystemExit(
                    f"unknown system variant {variant!r} in {system!r} (known: fixed, torch, chat)"
                )
            cmd += flags[variant]
        if budget:
            cmd += ["--max-batch-tokens", budget]
        if dtype:
            cmd += ["--dtype", dtype]
        if threads:
            cmd += ["--threads", str(threads)]
        env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        if base == "vllm":
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "all" if not threads else f"0-{threads - 1}")
        self.system = system
        self.log = open(
            os.path.join(
                ROOT,
                "bench-results",
                f"serve-{system.replace('@', '-').replace(':', '-').replace('+', '-')}.log",
            ),
            "w",
        )  # noqa: SIM115
        t = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,  # its own process group: close() can end vLLM's engine-core children too
        )
        hello = self._read()
        self.startup_s = hello.get("startup_s", round(time.perf_counter() - t, 1))

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.system} server exited (see {self.log.name})")
        return json.loads(line)

    def run(self, workload: dict) -> dict:
        self.proc.stdin.write(json.dumps({"workload": workload}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except Exception:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever is left of the group (engine-core processes)
        except (ProcessLookupError, PermissionError):
            pass
        self.log.close()


def _records(reply: dict, wl) -> list[RequestRecord]:
    by_rid = {r.rid: r for r in wl.requests}
    out = []
    for r in reply["records"]:
        req = by_rid[r["rid"]]
        out.append(
            RequestRecord(
                rid=r["rid"],
                arrival=r["arrival"],
                prompt_len=req.prompt_len,
                max_new_tokens=req.max_new_tokens,
                token_times=r["token_times"],
                token_ids=r["token_ids"],
                error=r.get("error"),
            )
        )
    return out


def _med(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def build_workloads(names: list[str], tok, rate: float, mixed_n: int, seed: int) -> dict:
    corpus = corpus_token_ids(tok)
    out = {}
    for name in names:
        if name.startswith("uniform"):
            out[name] = uniform_workload(corpus, int(name[len("uniform") :]), 128, 128, seed)
        elif name == "mixed":
            params = RealisticParams(num_requests=mixed_n, rate=rate, prompt_max=1500, seed=seed)
            out[name] = realistic_workload(corpus, params)
        else:
            raise SystemExit(f"unknown workload {name!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.bench.versus", description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", default="ours,vllm")
    p.add_argument("--workloads", default="uniform1,uniform8,uniform32,mixed")
    p.add_argument("--conditions", default="quiet,busy", help="quiet, busy (a CPU-bound neighbour process)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--threads", type=int, default=2, help="CPU threads for both systems (0 = each one's default)"
    )
    p.add_argument("--rate", type=float, default=2.0, help="mixed workload arrival rate (req/s)")
    p.add_argument("--mixed-n", type=int, default=32, help="mixed workload request count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default="var/models")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    conditions = [c for c in args.conditions.split(",") if c]
    os.makedirs(os.path.join(ROOT, "bench-results"), exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_path = args.out or os.path.join(ROOT, "bench-results", f"versus-{stamp}.json")

    model_dir = str(prepare(dict(DEFAULT_SPEC, dtype="bfloat16"), args.cache_dir))
    wls = build_workloads(
        [w for w in args.workloads.split(",") if w],
        load_tokenizer(model_dir),
        args.rate,
        args.mixed_n,
        args.seed,
    )
    servers: dict[str, Server] = {}
    try:
        return _run(args, systems, conditions, wls, model_dir, servers, out_path)
    finally:
        for server in servers.values():
            server.close()


def _run(args, systems, conditions, wls, model_dir, servers, out_path) -> int:
    threads = args.threads or None
    for s in systems:
        python = VLLM_PYTHON if s.startswith("vllm") else sys.executable
        if s.startswith("vllm") and not os.path.exists(python):
            raise SystemExit("vLLM is not installed: run scripts/install_vllm.sh (makes .venv-vllm)")
        servers[s] = Server(s, model_dir, threads, python)
        print(f"# {s} ready in {servers[s].startup_s} s", file=sys.stderr, flush=True)
    # Warm-up: one small run each (kernel selection, allocator growth, vLLM's first-batch compile).
    warm = uniform_workload(corpus_token_ids(load_tokenizer(model_dir)), 4, 32, 16, 99)
    for server in servers.values():
        server.run(warm.to_dict())

    cells: list[dict] = []
    for rnd in range(args.rounds):
        for wname, wl in wls.items():
            for cond in conditions:
                for s, server in servers.items():
                    time.sleep(SETTLE_S)  # the previous cell's system winds down (vLLM's threads spin on)
                    neighbour = None
                    if cond == "busy":
                        neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                        time.sleep(0.5)
                    try:
                        reply = server.run(wl.to_dict())
                    finally:
                        if neighbour is not None:
                            neighbour.kill()
                            neighbour.wait()
                    cell = {"round": rnd, "system": s, "workload": wname, "condition": cond}
                    if "error" in reply:
                        cell["error"] = reply["error"]
                    else:
                        cell["summary"] = summarize(_records(reply, wl))
                        cell["peak_rss_mb"] = reply["peak_rss_mb"]
                        cell["token_ids"] = {r["rid"]: r["token_ids"] for r in reply["records"]}
                        cell.update({k: v for k, v in reply.items() if k not in ("records", "peak_rss_mb")})
                    cells.append(cell)
                    with open(out_path, "w") as f:  # after every cell: a cut-short run keeps what it measured
                        json.dump({"args": vars(args), "cells": cells}, f)
                    sm = cell.get("summary", {})
                    print(
                        f"# round {rnd} {s:5s} {wname:9s} {cond:5s} "
                        f"{sm.get('output_tok_s')} tok/s TTFT p99 {sm.get('ttft_ms_p99')} ms "
                        f"ITL p50 {sm.get('itl_ms_p50')} ms RSS {cell.get('peak_rss_mb')} MB "
                        f"{cell.get('steps', '')} {cell.get('error', '')}",
                        file=sys.stderr,
                        flush=True,
                    )
    print(report(cells, systems, list(wls), conditions, args.rounds))
    with open(out_path, "w") as f:
        json.dump(
            {"args": vars(args), "startup_s": {s: v.startup_s for s, v in servers.items()}, "cells": cells}, f
        )
    print(f"\nJSON: {out_path}")
    return 0


def report(
    cells: list[dict], systems: list[str], workloads: list[str], conditions: list[str], rounds: int
) -> str:
    """Markdown table: per (workload, condition, system) median [min-max] over rounds, then each of ours ÷
    each vLLM configuration (ratios taken per round)."""

    def get(s, w, c, key):
        return [
            x["summary"][key]
            for x in cells
            if (x["system"], x["workload"], x["condition"]) == (s, w, c) and "summary" in x
        ]

    def rss(s, w, c):
        return [
            x["peak_rss_mb"]
            for x in cells
            if (x["system"], x["workload"], x["condition"]) == (s, w, c) and "summary" in x
        ]

    lines = [
        f"{rounds} round(s); median [min-max]; tok/s = output tokens/s; TTFT and ITL in ms; RSS = peak MB of the "
        "serving process tree",
        "",
        "| workload | condition | system | tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in workloads:
        for c in conditions:
            for s in systems:
                lines.append(
                    f"| {w} | {c} | {s} | {_med(get(s, w, c, 'output_tok_s'))} | {_med(get(s, w, c, 'ttft_ms_p50'))} "
                    f"| {_med(get(s, w, c, 'ttft_ms_p99'))} | {_med(get(s, w, c, 'itl_ms_p50'))} "
                    f"| {_med(get(s, w, c, 'itl_ms_p99'))} | {_med(rss(s, w, c))} |"
                )
    ours_like = [s for s in systems if not s.startswith("vllm")]
    references = [s for s in systems if s.startswith("vllm")]  # "vllm", "vllm:float32", ...
    if ours_like and references:
        lines += [
            "",
            "| workload | condition | system | against | ÷ it tok/s | its p99 TTFT ÷ ours |",
            "|---|---|---|---|---|---|",
        ]
        for w in workloads:
            for c in conditions:
                for o in ours_like:
                    for ref in references:
                        tput, ttft = [], []
                        for rnd in range(rounds):
                            pick = {
                                x["system"]: x["summary"]
                                for x in cells
                                if (x["round"], x["workload"], x["condition"]) == (rnd, w, c)
                                and "summary" in x
                            }
                            if o in pick and ref in pick:
                                tput.append(pick[o]["output_tok_s"] / pick[ref]["output_tok_s"])
                                ttft.append(pick[ref]["ttft_ms_p99"] / pick[o]["ttft_ms_p99"])
                        lines.append(f"| {w} | {c} | {o} | {ref} | {_med2(tput)} | {_med2(ttft)} |")
        if "quiet" in conditions and "busy" in conditions:
            lines += [
                "",
                "| workload | " + " | ".join(f"busy ÷ quiet tok/s, {s}" for s in systems) + " |",
                "|---|" + "---|" * len(systems),
            ]
            for w in workloads:
                keep = []
                for s in systems:
                    q = get(s, w, "quiet", "output_tok_s")
                    b = get(s, w, "busy", "output_tok_s")
                    keep.append(_med2([bb / qq for qq, bb in zip(q, b, strict=False) if qq]))
                lines.append(f"| {w} | " + " | ".join(keep) + " |")
    return "\n".join(lines)


def _med2(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


if __name__ == "__main__":
    sys.exit(main())
