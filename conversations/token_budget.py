"""Send-time check that a message fits the plan's context, in the web process.

Counting uses the model's own ``tokenizer.json`` (Hugging Face ``tokenizers``, loaded once per process in
~0.15 s, ~3 µs per 1,000 characters) from the prepared model directory. Where that file is missing (a web
host without the model) it falls back to a bound of one token per ``FALLBACK_CHARS_PER_TOKEN`` characters,
which under-counts English text (~4 characters per token) and so never refuses a message that would fit;
the worker's exact count still applies.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

FALLBACK_CHARS_PER_TOKEN = 6
#: Tokens the chat template adds around the system prompt and the user turn (role markers, generation prompt).
TEMPLATE_OVERHEAD_TOKENS = 16
#: Typical English words per token, to state a limit in words a person understands.
WORDS_PER_TOKEN = 0.75


@functools.lru_cache(maxsize=8)
def _tokenizer(model_name: str):
    weights = settings.INFERENCE_MODELS.get(model_name, {}).get("alias_of") or model_name
    path = Path(settings.MODEL_CACHE_DIR) / weights / "tokenizer.json"
    if not path.exists():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def count_tokens(text: str, *, model_name: str) -> int:
    """Tokens of ``text`` for ``model_name`` (exact with its tokenizer, else the lower bound above)."""
    if not text:
        return 0
    tokenizer = _tokenizer(model_name)
    if tokenizer is None:
        return math.ceil(len(text) / FALLBACK_CHARS_PER_TOKEN)
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def prompt_budget_tokens(*, tier) -> int:
    """Tokens the newest turn (with the system prompt) may take: the same split the worker makes
    (``conversations.reply_runner``): the context limit minus the reply reservation."""
    spec = settings.INFERENCE_MODELS.get(tier.model_name, {})
    limit = min(tier.max_context_tokens, int(spec.get("context_length", tier.max_context_tokens)))
    return limit - min(tier.max_reply_tokens, limit // 2)


@dataclass(frozen=True)
class TooLong:
    """A refusal: ``tokens`` counted vs ``limit_tokens`` allowed; ``message`` for the person."""

    tokens: int
    limit_tokens: int
    message: str


def check_fits(*, tier, system_prompt: str, content: str) -> TooLong | None:
    """None when ``content`` (with ``system_prompt``) fits ``tier``'s context, else a :class:`TooLong`."""
    limit = prompt_budget_tokens(tier=tier)
    used = count_tokens(system_prompt, model_name=tier.model_name) + TEMPLATE_OVERHEAD_TOKENS
    tokens = count_tokens(content, model_name=tier.model_name)
    if tokens + used <= limit:
        return None
    allowed = max(0, limit - used)
    words = int(allowed * WORDS_PER_TOKEN)
    plan = getattr(tier, "display_name", "") or tier.name
    return TooLong(
        tokens=tokens,
        limit_tokens=allowed,
        message=(
            f"This message is {tokens} tokens long; the {plan} plan's context allows {allowed} tokens "
            f"(about {words} words) per message{' with this system prompt' if system_prompt else ''}. "
            "Shorten it or split it into several messages."
        ),
    )
