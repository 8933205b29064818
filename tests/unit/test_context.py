import pytest

from conversations.context import ContextTooLong, assemble_context


def words(messages):
    """A stand-in token counter: one token per word plus 3 per message (template overhead), +2 generation prompt."""
    return sum(len(m["content"].split()) + 3 for m in messages) + 2


def fake_tokenize(messages):
    """Token ids standing in for a chat template render: ``words(messages)`` of them."""
    return list(range(words(messages)))


def turns(*contents):
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]


def test_everything_fits_nothing_omitted():
    history = turns("a b", "c d", "e f")
    ctx = assemble_context(
        system_prompt="be nice", history=history, budget_tokens=100, tokenize=fake_tokenize
    )
    assert ctx.omitted == 0
    assert ctx.messages[0] == {"role": "system", "content": "be nice"}
    assert ctx.messages[1:] == history
    assert ctx.prompt_tokens == words(ctx.messages)


def test_oldest_turns_are_left_out_and_system_prompt_stays_pinned():
    history = turns("one two three four", "five six seven eight", "nine ten", "eleven", "twelve thirteen")
    budget = words([{"role": "system", "content": "sys"}] + history[2:])
    ctx = assemble_context(system_prompt="sys", history=history, budget_tokens=budget, tokenize=fake_tokenize)
    assert ctx.omitted == 2
    assert ctx.messages == [{"role": "system", "content": "sys"}] + history[2:]
    assert ctx.prompt_tokens <= budget


def test_window_is_the_longest_suffix_that_fits():
    history = turns(*["w " * n for n in (5, 1, 7, 2, 3, 1, 4)])
    for budget in range(10, 60):
        try:
            ctx = assemble_context(
                system_prompt="", history=history, budget_tokens=budget, tokenize=fake_tokenize
            )
        except ContextTooLong:
            assert words(history[-1:]) > budget
            continue
        assert words(ctx.messages) <= budget
        if ctx.omitted:
            assert words(history[ctx.omitted - 1 :]) > budget


def test_newest_turn_too_long_raises():
    with pytest.raises(ContextTooLong, match="context allows 5"):
        assemble_context(
            system_prompt="", history=turns("a b c d e f g"), budget_tokens=5, tokenize=fake_tokenize
        )


def test_empty_history_is_an_error():
    with pytest.raises(ValueError):
        assemble_context(system_prompt="x", history=[], budget_tokens=10, tokenize=fake_tokenize)


def counted_tokenize() -> tuple[list[int], object]:
    """``(calls, tokenize)``: ``fake_tokenize`` that records the length of every window it renders."""
    calls: list[int] = []

    def tokenize(messages):
        calls.append(len(messages))
        return fake_tokenize(messages)

    return calls, tokenize


NINE_TURNS = turns(*["w " * n for n in (5, 1, 7, 2, 3, 1, 4, 6, 2)])


def test_each_window_is_rendered_once_and_its_ids_are_returned():
    history = NINE_TURNS
    calls, tokenize = counted_tokenize()
    ctx = assemble_context(system_prompt="s", history=history, budget_tokens=40, tokenize=tokenize)
    assert len(calls) == len(set(calls))  # no window rendered twice
    assert ctx.prompt_token_ids == fake_tokenize(ctx.messages) and ctx.prompt_tokens == len(
        ctx.prompt_token_ids
    )


def test_a_history_that_fits_is_rendered_once():
    """The whole history is tried first: a conversation that fits costs one render, not a binary search's
    log2(n) + 1 (docs/overhead-levers.md, lever 16)."""
    history = NINE_TURNS
    calls, tokenize = counted_tokenize()
    ctx = assemble_context(system_prompt="s", history=history, budget_tokens=10_000, tokenize=tokenize)
    assert (ctx.omitted, calls) == (0, [len(history) + 1])
