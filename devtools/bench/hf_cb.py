"""``hf_cb``: transformers' built-in continuous batching (``transformers.generation.continuous_batching``).

Uses the manager API (``model.init_continuous_batching(...)`` -> ``ContinuousBatchingManager``) rather than
``generate_batch`` so requests can be fed as they arrive: a feeder thread calls ``add_request`` at each
request's arrival time while the main thread drains ``get_result``. The manager runs its own background
generation thread (paged KV cache, FIFO scheduler, chunked prefill within ``max_batch_tokens``).

Settings, matched to our engine's defaults where an equivalent exists:

* ``max_batch_tokens`` = 512 (our ``max_num_batched_tokens``), ``max_requests_per_batch`` = 32 (our
  ``max_num_seqs``);
* ``num_blocks`` sized so every request that can be active at once fits (at most 32 of the workload's longest):
  on CPU the manager would otherwise reserve 60 % of system RAM for KV;
* attention stays ``sdpa`` (flash-attention kernels do not exist on CPU; no CUDA graphs, no async batching);
* ignore-EOS: ``add_request(..., eos_token_id=-1)`` (negative ids are dropped, so nothing stops early).

Token timestamps are the manager's own (``record_timestamps=True``: stamped in ``update_batch`` when each token
is produced, server side); ours are stamped when the client receives the token, which slightly favours hf_cb.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

from .common import System, sleep_until
from .metrics import RequestRecord
from .workloads import Request


def num_blocks_for(requests: Sequence[Request], page_size: int, max_concurrent: int) -> int:
    """KV blocks (``page_size`` tokens each) enough for ``max_concurrent`` of the longest requests at once."""
    lens = sorted((r.prompt_len + r.max_new_tokens for r in requests), reverse=True)[:max_concurrent]
    return sum(math.ceil(n / page_size) + 1 for n in lens) + 1


class HfCbSystem(System):
    """transformers' built-in continuous batching manager, fed requests as they arrive."""

    name = "hf_cb"

    def __init__(self, bm, opts):
        super().__init__(bm, opts)
        self.max_batch_tokens = int(opts.get("max_batch_tokens", 512))
        self.max_seqs = int(opts.get("max_seqs", 32))
        self.page_size = int(opts.get("page_size", 256))
        self.manager = None

    def _start(self, requests: Sequence[Request]) -> None:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        num_blocks = num_blocks_for(requests, self.page_size, self.max_seqs)
        cb = ContinuousBatchingConfig(
            page_size=self.page_size,
            num_blocks=num_blocks,
            max_batch_tokens=self.max_batch_tokens,
            max_requests_per_batch=self.max_seqs,
            seed=0,
        )
        gen = GenerationConfig(
            do_sample=False,
            max_new_tokens=max(r.max_new_tokens for r in requests),
            eos_token_id=-1,
            pad_token_id=self.bm.pad_token_id,
        )
        self.manager = self.bm.model.init_continuous_batching(
            generation_config=gen, continuous_batching_config=cb
        )
        self.manager.start()
        self.notes.append(
            f"num_blocks={num_blocks}x{self.page_size} max_batch_tokens={self.max_batch_tokens}"
        )

    def _drain(self, expected: set[str], timeout_s: float) -> dict:
        results = {}
        deadline = time.perf_counter() + timeout_s
        while expected - results.keys():
            r = self.manager.get_result(timeout=1.0)
            if r is not None and r.is_finished():
                results[r.request_id] = r
            elif r is None and not self.manager.is_running():
                break
            if time.perf_counter() > deadline:
                break
        return results

    def warmup(self, requests: Sequence[Request]) -> None:
        self._start(requests)
        ids = []
        for i, r in enumerate(requests[:2]):
            rid = f"warmup-{i}"
            self.manager.add_request(
                list(r.prompt_token_ids[: 16 + 8 * i]), request_id=rid, max_new_tokens=4, eos_token_id=-1
            )
            ids.append(rid)
        self._drain(set(ids), 300)

    def run(self, requests: Sequence[Request], t0: float) -> list[RequestRecord]:
        if self.manager is None:
            self._start(requests)
        ordered = sorted(requests, key=lambda r: (r.arrival_s, r.rid))
        feed_errors: dict[int, str] = {}

        def feeder():
            for r in ordered:
                sleep_until(t0 + r.arrival_s)
                try:
                    rid = self.manager.add_request(
                        list(r.prompt_token_ids),
                        request_id=f"r{r.rid}",
                        max_new_tokens=r.max_new_tokens,
                        record_timestamps=True,
                        eos_token_id=-1,
                    )
                    if rid is None:
                        feed_errors[r.rid] = "manager refused the request"
                except Exception as e:
                    feed_errors[r.rid] = f"{type(e).__name__}: {e}"

        th = threading.Thread(target=feeder, name="hf-cb-feeder", daemon=True)
        th.start()
        expected = {f"r{r.rid}" for r in ordered}
        results = self._drain(expected, float(self.opts.get("timeout_s", 3600)))
        th.join(timeout=5)
        records = []
        for r in ordered:
            rec = RequestRecord(r.rid, t0 + r.arrival_s, r.prompt_len, r.max_new_tokens)
            out = results.get(f"r{r.rid}")
            if out is None:
                rec.error = feed_errors.get(r.rid, "no result")
            elif out.error:
                rec.error = str(out.error)
            else:
                rec.token_times = list(out.timestamps or [])
                rec.token_ids = list(out.generated_tokens)
                if len(rec.token_times) != len(rec.token_ids):
                    self.notes.append(
                        f"r{r.rid}: {len(rec.token_times)} timestamps for {len(rec.token_ids)} tokens"
                    )
            records.append(rec)
        return records

    def close(self) -> None:
        if self.manager is not None:
            try:
                self.manager.stop(block=True, timeout=60)
            finally:
                self.manager = None
