"""Rule-based guard: prompt-injection phrases, invisible and bidirectional Unicode controls, secrets, and
oversized repetition. Pure regular expressions and zlib; microseconds per message.

Categories (score 1.0 when hit, absent otherwise):

* ``prompt_injection`` (input only): a phrase of the operator-editable list
  (``SAFETY_INJECTION_PHRASES_FILE``, default ``safety/data/injection_phrases.txt``).
* ``invisible_unicode``: characters that hide text from a reader but not from the model: the bidirectional
  embedding/override/isolate controls of the "Trojan Source" attacks (U+202A-U+202E, U+2066-U+2069;
  Boucher & Anderson 2021, CVE-2021-42574), zero-width space and word joiners (U+200B, U+2060-U+2064), a
  byte-order mark inside the text (U+FEFF) and the Unicode tag block (U+E0000-U+E007F, "ASCII
  smuggling"). ZWNJ/ZWJ (U+200C/U+200D, needed by Persian, Indic scripts and emoji) and the LRM/RLM marks
  (U+200E/U+200F, used in right-to-left text) are allowed.
* ``secret``: an API key or private key: OpenAI-style ``sk-...``, AWS access key ids (``AKIA``/``ASIA`` +
  16), GitHub (``ghp_`` ...) and Slack (``xox.-``) tokens, PEM private-key blocks. The patterns follow
  those of gitleaks' default configuration.
* ``repetition`` (input only): a message of at least ``SAFETY_REPETITION_MIN_CHARS`` characters that zlib
  compresses below ``SAFETY_REPETITION_MAX_RATIO`` of its size (one phrase pasted thousands of times).
"""

from __future__ import annotations

import os
import re
import threading
import time
import zlib
from pathlib import Path

from django.conf import settings

from safety.guards.base import Guard, GuardContext, GuardResult

# One character class (no alternation: a plain class scans ~5x faster); an inner BOM is found with str.find.
INVISIBLE = re.compile("[\u200b\u202a-\u202e\u2060-\u2064\u2066-\u2069\U000e0000-\U000e007f]")
BOM = "\ufeff"

#: (literal prefixes, pattern) per kind of secret, after gitleaks' default rules. Each pattern starts with a
#: literal so Python's regex engine scans for it at C speed, and runs only when one of its prefixes is in the
#: text at all; a match must start at a word boundary (checked by :func:`_secret_at_boundary`).
SECRET_RULES = (
    (("sk-",), re.compile(r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}")),
    (
        ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA"),
        re.compile(r"A(?:KIA|SIA|GPA|IDA|ROA|NPA|NVA|IPA)[0-9A-Z]{16}\b"),
    ),
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), re.compile(r"gh[pousr]_[A-Za-z0-9]{36,}\b")),
    (("github_pat_",), re.compile(r"github_pat_[A-Za-z0-9_]{22,}\b")),
    (("xox",), re.compile(r"xox[baprs]-[A-Za-z0-9-]{10,}")),
    (("-----BEGIN ",), re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
)


def has_secret(text: str) -> bool:
    """Whether ``text`` holds an API key or private key (``SECRET_RULES``)."""
    for prefixes, pattern in SECRET_RULES:
        if any(prefix in text for prefix in prefixes):
            for match in pattern.finditer(text):
                start = match.start()
                if start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_"):
                    return True
    return False


DEFAULT_PHRASES_FILE = Path(__file__).resolve().parent.parent / "data" / "injection_phrases.txt"


def normalise(text: str) -> str:
    """Lower case, every run of whitespace one space: how phrases are compared."""
    return " ".join(text.lower().split())


def phrases_pattern(phrases: list[str]) -> re.Pattern | None:
    """One case-insensitive alternation of whole-word ``phrases`` (any whitespace between words); None for an
    empty list."""
    parts = []
    for phrase in phrases:
        words = phrase.split()
        if not words:
            continue
        body = r"\s+".join(re.escape(w) for w in words)
        # \b only where the phrase starts/ends with a word character ("new instructions:" ends with ':').
        start = r"\b" if re.match(r"\w", words[0]) else ""
        end = r"\b" if re.search(r"\w$", words[-1]) else ""
        parts.append(start + body + end)
    if not parts:
        return None
    return re.compile("|".join(parts), re.IGNORECASE)


def read_phrases(path: str | os.PathLike) -> list[str]:
    """The phrases of a list file: one per line, ``#`` comments and blank lines skipped."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


class _PhraseList:
    """The injection phrase list, reread when the file's modification time changes (checked at most once a
    second, so an operator's edit applies within a second without a restart)."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self._lock = threading.Lock()
        self._mtime = None
        self._checked = 0.0
        self.pattern: re.Pattern | None = None
        self.normalised: tuple[str, ...] = ()
        self._reload()

    def _reload(self) -> None:
        mtime = os.stat(self.path).st_mtime_ns
        if mtime != self._mtime:
            phrases = read_phrases(self.path)
            self.pattern = phrases_pattern(phrases)
            self.normalised = tuple({normalise(p) for p in phrases if p.strip()})
            self._mtime = mtime

    def current(self) -> re.Pattern | None:
        now = time.monotonic()
        if now - self._checked >= 1.0:
            with self._lock:
                self._checked = now
                self._reload()
        return self.pattern

    def search(self, text: str) -> bool:
        """Whether ``text`` holds a phrase as whole words. A substring test of each normalised phrase in the
        normalised text first (C-speed; 30 phrases over 8,000 characters ~0.1 ms, against ~0.7 ms for the
        word-bounded alternation), the regex only to confirm a candidate."""
        pattern = self.current()
        if pattern is None:
            return False
        flat = normalise(text)
        if not any(phrase in flat for phrase in self.normalised):
            return False
        return pattern.search(text) is not None


class RulesGuard(Guard):
    """The rules above. Raises ``OSError`` when the phrase list file cannot be read (counted as a guard
    failure by the chain)."""

    name = "rules"
    version = "1"

    def __init__(self):
        path = getattr(settings, "SAFETY_INJECTION_PHRASES_FILE", "") or DEFAULT_PHRASES_FILE
        self.phrases = _PhraseList(path)
        self.repetition_min_chars = settings.SAFETY_REPETITION_MIN_CHARS
        self.repetition_max_ratio = settings.SAFETY_REPETITION_MAX_RATIO

    def check(self, text: str, context: GuardContext) -> GuardResult:
        scores: dict[str, float] = {}
        if INVISIBLE.search(text) or text.find(BOM, 1) != -1:  # a leading BOM is only an encoding mark
            scores["invisible_unicode"] = 1.0
        if has_secret(text):
            scores["secret"] = 1.0
        if context.stage == "input":
            if self.phrases.search(text):
                scores["prompt_injection"] = 1.0
            if self._repetitive(text):
                scores["repetition"] = 1.0
        return GuardResult(guard=self.name, version=self.version, scores=scores)

    def _repetitive(self, text: str) -> bool:
        if len(text) < self.repetition_min_chars:
            return False
        raw = text.encode("utf-8", "surrogatepass")
        return len(zlib.compress(raw, 1)) < self.repetition_max_ratio * len(raw)
