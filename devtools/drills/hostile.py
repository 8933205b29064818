"""The hostile-frame table: every class of bad input and the protocol's documented answer
(``docs/websocket-protocol.md``, "Limits and hostile input"). The ``bad_input`` drill sends it to a running
stack; ``tests/db/test_consumer_hardening.py`` sends it to the consumer."""

from __future__ import annotations

import json

from django.conf import settings

BIG = 2**63  # one past PostgreSQL's bigint


def hostile_frames(
    *, own_reply: int, foreign_conversation: int, foreign_reply: int, foreign_user_message: int
) -> list[tuple[str, str, str]]:
    """``(label, raw text frame, expected error code)`` for every frame class. ``own_reply``: a reply of
    the sending user; the ``foreign_*`` ids: another user's conversation, reply and user message."""

    def send(**fields):
        return json.dumps({"type": "send", **fields})

    return [
        ("not json", "not json", "invalid_request"),
        ("json array", "[1, 2]", "invalid_request"),
        ("json scalar", "null", "invalid_request"),
        ("empty object", "{}", "invalid_request"),
        ("unknown type", '{"type": "dance"}', "invalid_request"),
        ("type not a string", '{"type": 5}', "invalid_request"),
        ("extra field", send(content="x", evil=1), "invalid_request"),
        ("NUL in content", send(content="a\x00b"), "invalid_request"),
        ("lone surrogate", '{"type": "send", "content": "\\ud800"}', "invalid_request"),
        ("nested 100,000 levels", '{"a":' * 100_000 + "1" + "}" * 100_000, "invalid_request"),
        ("nested 1,000 levels within the size limit", "[" * 1000 + "]" * 1000, "invalid_request"),
        ("nested value inside a frame", send(content=[[["x"]]]), "invalid_request"),
        ("frame over 64 KiB", send(content="x" * (70 * 1024)), "invalid_request"),
        ("content over MAX_MESSAGE_CHARS", send(content="x" * (settings.MAX_MESSAGE_CHARS + 1)), "invalid_request"),
        ("whitespace content", send(content="   "), "invalid_request"),
        ("content wrong type", send(content=5), "invalid_request"),
        ("conversation id as string", send(conversation_id="1", content="x"), "invalid_request"),
        ("client_id not a uuid", send(content="x", client_id="abc"), "invalid_request"),
        ("stop id as string", '{"type": "stop", "message_id": "1"}', "invalid_request"),
        ("resume id as float", '{"type": "resume", "message_id": 1.5}', "invalid_request"),
        ("resume after_seq -2", json.dumps({"type": "resume", "message_id": own_reply, "after_seq": -2}), "invalid_request"),
        ("regenerate without id", '{"type": "regenerate"}', "invalid_request"),
        ("negative message id", '{"type": "stop", "message_id": -1}', "invalid_request"),
        ("zero conversation id", '{"type": "regenerate", "conversation_id": 0}', "invalid_request"),
        ("huge message id", json.dumps({"type": "resume", "message_id": BIG}), "invalid_request"),
        ("huge conversation id", send(conversation_id=10**30, content="x"), "invalid_request"),
        ("largest bigint id, absent", json.dumps({"type": "stop", "message_id": BIG - 1}), "not_found"),
        ("absent conversation", send(conversation_id=BIG - 1, content="x"), "not_found"),
        ("send to another user's conversation", send(conversation_id=foreign_conversation, content="x"), "not_found"),
        ("regenerate another user's conversation", json.dumps({"type": "regenerate", "conversation_id": foreign_conversation}), "not_found"),
        ("stop another user's reply", json.dumps({"type": "stop", "message_id": foreign_reply}), "not_found"),
        ("resume another user's reply", json.dumps({"type": "resume", "message_id": foreign_reply}), "not_found"),
        ("stop another user's user message", json.dumps({"type": "stop", "message_id": foreign_user_message}), "not_found"),
    ]  # fmt: skip
