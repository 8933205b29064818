"""Text PostgreSQL cannot store: NUL characters (``text`` refuses U+0000) and lone surrogates (not UTF-8,
the database encoding). Checked at the edges (HTTP inputs in ``chatsite.input_guard``, imported files in
``conversations.archive``, WebSocket frames in ``conversations.protocol``) so such input is refused with a
clear error before anything is written, instead of failing inside a transaction as a server error."""

from __future__ import annotations

from typing import Any


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored in a PostgreSQL ``text`` column, or None when it can."""
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (invalid Unicode)"
    return None


def first_unstorable(value: Any, *, root: str = "") -> tuple[str, str] | None:
    """The first string (key or value) in a decoded JSON document ``value`` that cannot be stored, as
    ``(path, reason)`` with ``path`` in OpenAI's ``param`` style (``messages[0].content``; ``root`` for the
    document itself); None when every string is storable. Iterative, so any nesting depth is fine."""
    stack: list[tuple[str, Any]] = [(root, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return path or "body", problem
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                problem = text_problem(key) if isinstance(key, str) else None
                if problem:
                    return f"{path}.<key>" if path else "<key>", problem
                children.append((child_path, child))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend(reversed([(f"{path}[{i}]", child) for i, child in enumerate(item)]))
    return None


def storable_text(text: str) -> str:
    """Generated ``text`` as PostgreSQL can store it: a model may sample a token that decodes to NUL
    (byte-fallback vocabularies do), which a text column refuses and which would lose the whole reply;
    it is stored as U+FFFD, the replacement character. (User input with NUL is refused at the door.)"""
    return text.replace("\x00", "\ufffd")
