"""The in-process benchmark commands still run against the product as it is now.

They print figures and assert nothing, and nothing else runs them, so a change to what they call can break them
unnoticed: ``bench_fixed_sql`` raised a ``TypeError`` once the API key statement's builder took a new argument
(docs/overhead.md, round 37). Each runs here at the smallest sizes it takes; the tests check that it completes, prints
the rows of its table and leaves nothing stored, never its figures. The commands that drive a running stack
(``--origin``) are not run here; their helpers have unit tests (tests/unit/test_bench_burst.py,
tests/unit/test_overhead_bench_gaps.py).
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from conversations.models import Conversation


@pytest.fixture
def tiers():
    """The plans the data migration made: the transactional tests flush its tables."""
    from billing.services import tiers_ensure

    tiers_ensure()


def run(name: str, **options) -> str:
    out = io.StringIO()
    call_command(name, stdout=out, **options)
    return out.getvalue()


@pytest.mark.django_db
def test_bench_fixed_sql_times_every_statement_and_stores_nothing():
    out = run("bench_fixed_sql", rounds=1, calls=2)

    variants = {
        "the worker's claim": 2,
        "a conversation's totals": 2,
        "the API key read": 3,
        "a message read": 2,
    }
    for case, count in variants.items():  # before and after its lever (the key read: a middle step too)
        assert len([line for line in out.splitlines() if line.startswith(f"| {case}")]) == count, (case, out)
    assert not Conversation.objects.exists()  # its one transaction was rolled back


def test_bench_ws_frames_times_both_variants_and_restores_autobahn():
    from autobahn.websocket import protocol

    helpers = (protocol.hltype, protocol.hlval)

    out = run("bench_ws_frames", rounds=1, frames=50)

    assert [line for line in out.splitlines() if line.startswith("| as installed |")], out
    assert [line for line in out.splitlines() if line.startswith("| lever 59 |")], out
    assert (protocol.hltype, protocol.hlval) == helpers


@pytest.mark.django_db
def test_bench_active_path_loads_a_branch_and_rolls_it_back():
    out = run("bench_active_path", messages=30, rounds=1)

    assert "(30 on the active branch)" in out, out
    assert "active path, first page" in out, out
    assert not Conversation.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_bench_send_cost_runs_sends_through_the_service_and_deletes_them(tiers):
    out = run("bench_send_cost", sends=2)

    rows = [line for line in out.splitlines() if line.startswith("| . |")]
    assert len(rows) == 1, out
    assert not Conversation.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_bench_finish_cost_runs_final_writes(tiers):
    out = run("bench_finish_cost", replies=2, rounds=1)

    assert [line for line in out.splitlines() if line.startswith("| . |")], out


@pytest.mark.django_db(transaction=True)
def test_bench_warm_pass_times_the_warmer_and_deletes_its_users(tiers):
    from accounts.models import User

    users = User.objects.count()

    out = run("bench_warm_pass", sockets="2", passes=1, rounds=1)

    assert [line for line in out.splitlines() if line.startswith("| . | 2 |")], out
    assert User.objects.count() == users


@pytest.mark.django_db
def test_load_signal_bench_reads_every_admission_input():
    out = run("load_signal_bench", rounds=2)

    assert "rounds; ms: median [min-max]" in out, out
