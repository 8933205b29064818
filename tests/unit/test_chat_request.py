"""Parsing of a chat completions request body (no database)."""

import pytest

from api.chat_request import parse_chat_request
from api.errors import ApiError

MODEL = "smollm2-135m-instruct"


def parse(**body):
    return parse_chat_request({"model": MODEL, **body}, max_message_chars=100)


def test_text_parts_are_joined_and_developer_is_a_system_message():
    chat = parse(
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]},
        ]
    )
    assert chat.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    assert (chat.stream, chat.include_usage, chat.store, chat.sampling) == (False, False, False, {})


def test_sampling_holds_only_what_was_sent_and_max_completion_tokens_wins():
    chat = parse(
        messages=[{"role": "user", "content": "hi"}],
        temperature=0,
        top_p=0.5,
        seed=3,
        stop="\n",
        max_tokens=50,
        max_completion_tokens=7,
        presence_penalty=-1,
        stream=True,
        stream_options={"include_usage": True},
        store=True,
        n=1,
        logprobs=False,
        response_format={"type": "text"},
        user="end-user-1",
    )
    assert chat.sampling == {
        "temperature": 0.0,
        "top_p": 0.5,
        "seed": 3,
        "stop": ["\n"],
        "max_tokens": 7,
        "presence_penalty": -1.0,
    }
    assert chat.stream and chat.include_usage and chat.store


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x" * 101}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": float("nan")}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": [""]}, "stop"),
        ({"messages": "hi"}, "messages"),
    ],
)
def test_bad_values_name_their_param(body, param):
    with pytest.raises(ApiError) as exc:
        parse(**body)
    assert exc.value.status == 400 and exc.value.param == param


def test_body_must_be_an_object():
    with pytest.raises(ApiError) as exc:
        parse_chat_request([1, 2], max_message_chars=10)
    assert exc.value.status == 400
