"""The vLLM test layer (``make test-vllm``, ``scripts/test_vllm.sh``): one Celery worker whose engine is vLLM's
CPU build, behind the real web tier (daphne), PostgreSQL, Redis and RabbitMQ. Runs from ``.venv-vllm``.

The worker has one sequence slot (``max_num_seqs`` 1), so a second reply waits in vLLM's own queue: that is
what makes Stop's freed slot and paid-before-free visible, and what the engine-core kill leaves queued."""

import json

import psutil
import pytest

MODEL = "smollm2-135m-instruct"
#: The worker's environment: the vLLM backend on the prepared (dequantized) weights in float32, one slot.
VLLM_WORKER_ENV = {
    "INFERENCE_BACKEND": "vllm",
    "INFERENCE_DTYPE": "float32",
    "INFERENCE_VLLM_ARGS": json.dumps({"max_num_seqs": 1, "max_model_len": 2048}),
    "METRICS_WORKER_PORT": "0",
}


@pytest.fixture(scope="session")
def vllm_worker(worker_factory):
    """The one vLLM-backed worker of this layer (started once, ~1-2 min on two shared cores)."""
    return worker_factory("vllm", env=VLLM_WORKER_ENV)


def engine_core_pids(worker) -> list[int]:
    """Processes vLLM started under the worker (its engine core and the core's model worker)."""
    return [
        p.pid
        for p in psutil.Process(worker.pid).children(recursive=True)
        if "VLLM" in p.name() + " ".join(p.cmdline())
    ]
