"""Settings of the guard chain (``safety/``, docs/safety.md), read from the environment like every setting
(``.env.example``); star-imported by ``base.py``, which has read ``.env`` into the environment already."""

import environ as _environ

_env = _environ.Env()

# Master switch; false passes every text unchecked (per-tier switches are in the admin's safety policies).
SAFETY_ENABLED = _env.bool("SAFETY_ENABLED", default=True)
# Guards, in order, as dotted class paths (like MIDDLEWARE). Built-in: safety.guards.rules.RulesGuard,
# safety.guards.classifier.ProfanityGuard, safety.guards.http.HttpModerationGuard (needs the URL below).
SAFETY_GUARDS = _env.list(
    "SAFETY_GUARDS",
    default=["safety.guards.rules.RulesGuard", "safety.guards.classifier.ProfanityGuard"],
)
# The prompt-injection phrase list (one phrase a line); blank = safety/data/injection_phrases.txt.
SAFETY_INJECTION_PHRASES_FILE = _env("SAFETY_INJECTION_PHRASES_FILE", default="")
# Oversized repetition: a message of at least this many characters that zlib shrinks below this ratio.
SAFETY_REPETITION_MIN_CHARS = _env.int("SAFETY_REPETITION_MIN_CHARS", default=4000)
SAFETY_REPETITION_MAX_RATIO = _env.float("SAFETY_REPETITION_MAX_RATIO", default=0.08)
# The policy of a tier without a safety policy row in the admin:
SAFETY_DEFAULT_ACTION = _env("SAFETY_DEFAULT_ACTION", default="block")
if SAFETY_DEFAULT_ACTION not in ("block", "flag"):
    raise _environ.ImproperlyConfigured("SAFETY_DEFAULT_ACTION must be block or flag")
SAFETY_DEFAULT_THRESHOLD = _env.float("SAFETY_DEFAULT_THRESHOLD", default=0.5)
# Per-category thresholds, "category=score,..." (profanity is the classifier's calibrated probability).
SAFETY_DEFAULT_THRESHOLDS = {
    k: float(v) for k, v in _env.dict("SAFETY_DEFAULT_THRESHOLDS", default={"profanity": "0.8"}).items()
}
# Categories recorded and counted but never blocked.
SAFETY_DEFAULT_FLAG_ONLY = _env.list("SAFETY_DEFAULT_FLAG_ONLY", default=[])
# A guard that raises or times out: open = pass the text, closed = block it.
SAFETY_DEFAULT_ON_FAILURE = _env("SAFETY_DEFAULT_ON_FAILURE", default="open")
if SAFETY_DEFAULT_ON_FAILURE not in ("open", "closed"):
    raise _environ.ImproperlyConfigured("SAFETY_DEFAULT_ON_FAILURE must be open or closed")
# Timeout of an off-thread guard (the HTTP guard, any guard without inline = True), milliseconds.
SAFETY_GUARD_TIMEOUT_MS = _env.int("SAFETY_GUARD_TIMEOUT_MS", default=500)
SAFETY_GUARD_THREADS = _env.int("SAFETY_GUARD_THREADS", default=8)
SAFETY_MODERATE_OUTPUT = _env.bool("SAFETY_MODERATE_OUTPUT", default=True)
# While a reply streams, check it at each sentence end (0) or every N tokens (N > 0); always once at the end.
SAFETY_OUTPUT_CHECK_EVERY_TOKENS = _env.int("SAFETY_OUTPUT_CHECK_EVERY_TOKENS", default=0)
# How long a web/worker process reuses a tier's policy row (s).
SAFETY_POLICY_CACHE_S = _env.float("SAFETY_POLICY_CACHE_S", default=5.0)
# The HTTP guard: any OpenAI-shaped /v1/moderations endpoint.
SAFETY_HTTP_GUARD_URL = _env("SAFETY_HTTP_GUARD_URL", default="")
SAFETY_HTTP_GUARD_API_KEY = _env("SAFETY_HTTP_GUARD_API_KEY", default="")
SAFETY_HTTP_GUARD_MODEL = _env("SAFETY_HTTP_GUARD_MODEL", default="")
SAFETY_HTTP_GUARD_TIMEOUT_S = _env.float("SAFETY_HTTP_GUARD_TIMEOUT_S", default=2.0)
# Strikes: after SAFETY_STRIKE_LIMIT blocks (false positives excluded) within SAFETY_STRIKE_WINDOW_H hours,
# SAFETY_STRIKE_ACTION: "suspend" (the account is deactivated), "tier:<name>" (moved to that tier) or "none".
# 0 turns strikes off.
SAFETY_STRIKE_LIMIT = _env.int("SAFETY_STRIKE_LIMIT", default=5)
SAFETY_STRIKE_WINDOW_H = _env.float("SAFETY_STRIKE_WINDOW_H", default=24.0)
SAFETY_STRIKE_ACTION = _env("SAFETY_STRIKE_ACTION", default="none")
if not (SAFETY_STRIKE_ACTION in ("suspend", "none") or SAFETY_STRIKE_ACTION.startswith("tier:")):
    raise _environ.ImproperlyConfigured("SAFETY_STRIKE_ACTION must be suspend, none or tier:<name>")
