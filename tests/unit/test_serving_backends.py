"""Which backend a worker runs and with which vLLM arguments (``inference.backends.build``), and how the fleet
shows it (``manage.py fleet``)."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from inference import fleet
from inference.backends.build import CPU_VLLM_DEFAULTS, backend_for, vllm_options
from inference.backends.vllm_args import VllmOptions
from operations.management.commands.fleet import Command as FleetCommand

DEFAULT = "smollm2-135m-instruct"


def test_the_cpu_default_is_the_native_engine(settings):
    settings.INFERENCE_BACKEND = "auto"
    settings.INFERENCE_DEVICE = "cpu"
    assert backend_for(DEFAULT) == "native"


def test_the_switch_and_the_entry_choose_vllm(settings):
    settings.INFERENCE_DEVICE = "cpu"
    settings.INFERENCE_BACKEND = "vllm"
    assert backend_for(DEFAULT) == "vllm"
    settings.INFERENCE_BACKEND = "auto"
    settings.INFERENCE_MODELS = {
        **settings.INFERENCE_MODELS,
        "big": {"source": "/srv/big", "backend": "vllm"},
    }
    assert backend_for("big") == "vllm"


def test_an_unknown_backend_is_refused(settings):
    settings.INFERENCE_BACKEND = "auto"
    settings.INFERENCE_MODELS = {**settings.INFERENCE_MODELS, "odd": {"source": "/srv/odd", "backend": "tgi"}}
    with pytest.raises(ImproperlyConfigured, match="tgi"):
        backend_for("odd")


def test_vllm_arguments_layer_device_defaults_entry_and_environment(settings):
    settings.INFERENCE_DEVICE = "cpu"
    settings.INFERENCE_MODELS = {
        **settings.INFERENCE_MODELS,
        "big": {
            "source": "/srv/big",
            "context_length": 4096,
            "vllm": {"tensor_parallel_size": 4, "quantization": "awq"},
        },
    }
    settings.INFERENCE_VLLM_ARGS = {"tensor_parallel_size": 2, "swap_space": 1}
    options = vllm_options("big")
    assert options["tensor_parallel_size"] == 2 and options["quantization"] == "awq"
    assert options["max_model_len"] == 4096
    assert options["kv_cache_memory_bytes"] == CPU_VLLM_DEFAULTS["kv_cache_memory_bytes"]
    parsed = VllmOptions.from_dict(options)
    assert (parsed.tensor_parallel_size, parsed.quantization) == (2, "awq")
    assert dict(parsed.extra) == {"swap_space": 1}  # any other AsyncEngineArgs field passes through


def test_fleet_table_shows_each_workers_backend_and_health():
    workers = [
        fleet.WorkerStatus(worker_id="a:1", host="a", pid=1, model=DEFAULT, ready=True),
        fleet.WorkerStatus(
            worker_id="b:2", host="b", pid=2, model="qwen", backend="vllm", health="engine core died"
        ),
    ]
    lines = FleetCommand.workers_table(workers).splitlines()
    assert "backend" in lines[0] and "health" in lines[0]
    assert " native " in lines[1] and " ready " in lines[1] and lines[1].endswith("ok")
    assert " vllm " in lines[2] and " failed " in lines[2] and lines[2].endswith("engine core died")


def test_a_status_without_backend_fields_reads_as_a_healthy_native_worker():
    status = fleet.WorkerStatus.from_json('{"worker_id": "old:1", "host": "old", "pid": 1, "model": "m"}')
    assert (status.backend, status.health) == ("native", "ok")
