"""schemathesis against both OpenAPI documents, the history API's (``/api/openapi.json``, django-ninja) and
the OpenAI-compatible API's (``/v1/openapi.json``), over a real daphne, PostgreSQL, Redis and a Celery worker
running the real model. Fixed seed and a bounded number of examples per operation, so a run is the same each
time and fits the suite's time budget.

Checked (``--checks all``): no 5xx, no status the document does not declare, every body, content type and
header as declared, invalid input refused with a 4xx, no operation usable without the key, a deleted
conversation gone. Not checked: ``positive_data_acceptance`` (a request the schema allows may still be
refused for reasons no schema states: a model the plan may not use, admission control, the quota).
"""

import subprocess
import sys

import pytest

from api.services import api_key_create
from billing.models import Tier
from conversations.services import conversation_create, message_create

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SEED = 20261126


@pytest.fixture
def fuzz_key(make_user, redis_clean):
    """The key of a user whose plan neither rate-limits nor runs out during the run, with short replies (a
    reply costs a decode step per token on two shared cores), and two conversations to read and rename."""
    user = make_user("fuzzer")
    tier = Tier.objects.get(name="free")
    tier.pk, tier.name = None, "fuzz"
    tier.requests_per_minute, tier.tokens_per_day = 100_000, 2_000_000_000
    tier.max_reply_tokens, tier.max_concurrent_generations = 8, 8
    tier.save()
    user.tier = tier
    user.save(update_fields=["tier"])
    for title in ("first", "second"):
        conversation = conversation_create(owner=user, title=title)
        message_create(conversation=conversation, role="user", content="hello")
    _key, secret = api_key_create(user=user, name="fuzz")
    return secret


def schemathesis(url: str, document: str, key: str, *, max_examples: int, cwd) -> subprocess.CompletedProcess:
    """Run the schemathesis CLI against ``url + document`` in ``cwd`` (where it keeps its cache); its output
    is shown when the test fails."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{url}{document}",
            "--url",
            url,
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--seed",
            str(SEED),
            "--generation-deterministic",
            "--max-examples",
            str(max_examples),
            "--workers",
            "1",
            "--request-timeout",
            "120",
            "--no-shrink",
            "--header",
            f"Authorization: Bearer {key}",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_history_api_matches_its_openapi_document(live_server_url, fuzz_key, tmp_path):
    run = schemathesis(live_server_url, "/api/openapi.json", fuzz_key, max_examples=15, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]


def test_openai_compatible_api_matches_its_openapi_document(
    celery_worker, live_server_url, fuzz_key, tmp_path
):
    run = schemathesis(live_server_url, "/v1/openapi.json", fuzz_key, max_examples=8, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]
