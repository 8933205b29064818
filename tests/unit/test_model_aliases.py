"""Model aliases (``INFERENCE_MODEL_ALIASES``): more names for registered weights, each routed on its own."""

import os
import subprocess
import sys
from types import SimpleNamespace

from django.conf import settings

from conversations.token_budget import count_tokens
from inference.registry import model_spec, models_for_tier

DEFAULT = "smollm2-135m-instruct"


def test_an_alias_loads_its_targets_prepared_weights():
    # The test settings register the fault drills' names as aliases of the default model.
    assert settings.INFERENCE_MODELS["killdrill"]["alias_of"] == DEFAULT
    assert model_spec("killdrill") == model_spec(DEFAULT)


def test_an_alias_is_a_model_of_its_own_to_routing_with_a_priority_queue():
    tier = SimpleNamespace(model_name="killdrill", degrade_to_model="")
    assert models_for_tier(tier) == ["killdrill"]
    queue = next(q for q in settings.CELERY_TASK_QUEUES if q.name == "inference.killdrill")
    assert queue.queue_arguments == {"x-max-priority": settings.INFERENCE_QUEUE_MAX_PRIORITY}


def test_an_alias_counts_tokens_with_its_targets_tokenizer():
    text = "Tokens are counted the same under either name."
    assert count_tokens(text, model_name="killdrill") == count_tokens(text, model_name=DEFAULT)


def test_an_alias_of_an_unregistered_model_stops_start_up():
    env = dict(os.environ, INFERENCE_MODEL_ALIASES="gpt-4o=no-such-model")
    done = subprocess.run(
        [sys.executable, "-c", "import chatsite.settings.base"],
        env=env,
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
    )
    assert done.returncode != 0
    assert "INFERENCE_MODEL_ALIASES: gpt-4o=no-such-model names no registered model" in done.stderr
