"""Context assembly: the system prompt pinned, then as many of the most recent turns as fit.

Counting uses the model's own tokenizer and chat template (a ``tokenize`` callable), so the budget is
exact for the prompt the engine will see, and the token ids of the chosen window are returned for it. The window is a suffix of the history: older turns are left out
first, never the newest user turn.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

ChatMessage = dict[str, str]


class ContextTooLong(ValueError):
    """Even the newest user turn alone (with the system prompt) exceeds the token budget."""


@dataclass(frozen=True)
class AssembledContext:
    """``messages``: chat-template input (role/content dicts); ``omitted``: how many older turns were left
    out; ``prompt_token_ids``: the rendered chat template of ``messages`` (list[int]), ready to submit."""

    messages: list[ChatMessage]
    omitted: int
    prompt_token_ids: list[int]

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def assemble_context(
    *,
    system_prompt: str,
    history: Sequence[ChatMessage],
    budget_tokens: int,
    tokenize: Callable[[list[ChatMessage]], list[int]],
) -> AssembledContext:
    """Fit ``history`` (oldest first, ending with the user turn to answer) into ``budget_tokens``.

    ``tokenize(messages)`` returns the token ids of the rendered chat template including the generation
    prompt. The whole history is tried first: while a conversation fits (most replies), that is the only
    render. Otherwise the count is monotonic in the number of turns kept, so a binary search needs O(log n)
    more renders; each window is rendered at most once.
    Raises :class:`ContextTooLong` when the newest turn cannot fit, ``ValueError`` for an empty history.
    """
    if not history:
        raise ValueError("history must contain at least the user turn to answer")
    head = [{"role": "system", "content": system_prompt}] if system_prompt else []

    rendered: dict[int, list[int]] = {}

    def ids(start: int) -> list[int]:
        if start not in rendered:
            rendered[start] = tokenize(head + list(history[start:]))
        return rendered[start]

    def count(start: int) -> int:
        return len(ids(start))

    if count(0) <= budget_tokens:  # it all fits: one render (docs/overhead-levers.md, lever 16)
        return AssembledContext(messages=head + list(history), omitted=0, prompt_token_ids=ids(0))
    last = len(history) - 1
    if count(last) > budget_tokens:
        raise ContextTooLong(
            f"the message is {count(last)} tokens; this plan's context allows {budget_tokens}"
        )
    # Smallest start index whose suffix fits: suffixes shrink as start grows.
    lo, hi = 0, last
    while lo < hi:
        mid = (lo + hi) // 2
        if count(mid) <= budget_tokens:
            hi = mid
        else:
            lo = mid + 1
    return AssembledContext(messages=head + list(history[lo:]), omitted=lo, prompt_token_ids=ids(lo))
