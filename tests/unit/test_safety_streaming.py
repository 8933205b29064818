"""The output monitor a worker runs on a streaming reply: when it checks, what it sees, when it cuts."""

import pytest

from safety.streaming import OutputMonitor


@pytest.fixture(autouse=True)
def chain_settings(settings):
    settings.SAFETY_GUARDS = ["safety.guards.rules.RulesGuard", "tests.safety_guards.PhraseGuard"]
    settings.SAFETY_DEFAULT_ACTION = "block"
    settings.SAFETY_DEFAULT_THRESHOLDS = {}
    settings.SAFETY_MODERATE_OUTPUT = True
    return settings


@pytest.fixture
def phrase(monkeypatch):
    monkeypatch.setenv("SAFETY_TEST_PHRASE", "shimmered")


def test_checks_at_sentence_ends_and_cuts_at_the_first_bad_sentence(phrase):
    monitor = OutputMonitor(tier=None, every_tokens=0)
    deltas = [
        "Luna",
        " was",
        " a",
        " cat",
        ".",
        " Her",
        " coat",
        " shimmered",
        " like",
        " silver",
        ".",
        " Then",
    ]
    cut_at = None
    for i, delta in enumerate(deltas):
        if monitor.feed(delta) is not None:
            cut_at = i
            break
    assert cut_at == 10  # the sentence end after the bad word: within one check interval
    assert monitor.checks == 2
    assert monitor.blocked.categories == ["test_phrase"] and monitor.blocked.guard == "phrase"
    assert monitor.feed(" more") is monitor.blocked  # stays cut
    assert monitor.finish() is monitor.blocked


def test_every_n_tokens_mode(phrase):
    monitor = OutputMonitor(tier=None, every_tokens=4)
    results = [monitor.feed(w) for w in ["a", " b", " c", " d", " e", " shimmered", " g"]]
    assert monitor.checks == 1 and not any(results)
    assert monitor.feed(" h") is not None  # 4 tokens since the last check
    assert monitor.checks == 2


def test_a_secret_split_across_two_checks_is_seen_whole():
    monitor = OutputMonitor(tier=None, every_tokens=1)
    assert monitor.feed("Your key is AKIAIOSF") is None
    verdict = monitor.feed("ODNN7EXAMPLE and more")
    assert verdict is not None and verdict.categories == ["secret"]


def test_final_check_sees_the_whole_reply(phrase):
    monitor = OutputMonitor(tier=None, every_tokens=0)
    for delta in ["no sentence end", " shimmer", "ed here"]:
        assert monitor.feed(delta) is None
    assert monitor.checks == 0
    final = monitor.finish()
    assert final.blocked and final.stage == "output"


def test_clean_reply_passes_and_output_moderation_can_be_off(chain_settings):
    monitor = OutputMonitor(tier=None)
    assert monitor.feed("Red, blue and green.") is None
    assert monitor.finish().action == "allow"
    chain_settings.SAFETY_MODERATE_OUTPUT = False
    off = OutputMonitor(tier=None)
    assert not off.enabled
    assert off.feed("AKIAIOSFODNN7EXAMPLE.") is None and off.finish() is None
