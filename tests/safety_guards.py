"""Guards used only by the tests, listed in ``SAFETY_GUARDS`` by their dotted paths like any other."""

import os
import threading
import time

from safety.guards.base import Guard, GuardResult


class CrashingGuard(Guard):
    """Raises on every text (a guard with a bug)."""

    name = "crashing"

    def check(self, text, context):
        raise RuntimeError("guard bug")


class SlowGuard(Guard):
    """Sleeps ``SAFETY_TEST_SLOW_S`` seconds (default 5) off the caller's thread, then passes the text."""

    name = "slow"
    inline = False
    #: Set when a check has slept its full time.
    finished = threading.Event()

    def check(self, text, context):
        time.sleep(float(os.environ.get("SAFETY_TEST_SLOW_S", "5")))
        type(self).finished.set()
        return GuardResult(guard=self.name, version="1", scores={"slow": 0.0})


class PhraseGuard(Guard):
    """Flags category ``test_phrase`` when the text contains ``SAFETY_TEST_PHRASE`` (case-insensitive): a
    way to make a reply of the real model "turn bad" at a known point of a greedy generation."""

    name = "phrase"
    stages = ("input", "output")

    def check(self, text, context):
        # Read at each check: the chain keeps one instance per value of SAFETY_GUARDS for the process.
        phrase = os.environ.get("SAFETY_TEST_PHRASE", "").lower()
        hit = bool(phrase) and phrase in text.lower()
        return GuardResult(guard=self.name, version="1", scores={"test_phrase": 1.0 if hit else 0.0})


class OutputAlwaysGuard(Guard):
    """Flags every output text (category ``test_output``) and no input: any reply is cut at its first check."""

    name = "output-always"
    stages = ("output",)

    def check(self, text, context):
        return GuardResult(guard=self.name, version="1", scores={"test_output": 1.0})
