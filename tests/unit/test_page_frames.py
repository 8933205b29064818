"""The web-node drill's verdict on what a chat page took of a reply over its sockets
(``devtools/drills/page_frames.py``): it holds only when a resume was exercised and the tokens taken are
exactly the stored reply."""

from devtools.drills.page_frames import PageFrames

REPLY = ["Once", " upon", " a", " time", "."]


def token(seq: int, message_id: int = 7) -> dict:
    return {"type": "token", "message_id": message_id, "seq": seq, "text": REPLY[seq]}


def page(*sockets: list[dict]) -> PageFrames:
    log = PageFrames()
    for frames in sockets:
        number = log.socket_opened()
        for frame in frames:
            log.add(number, frame)
    return log


def test_a_resume_that_replays_and_continues_live_holds_even_with_frames_seen_twice():
    second = [{"type": "started", "message_id": 7}, token(2), token(3), token(3), token(4), {"type": "done"}]
    take = page([token(0), token(1)], second).take(7, stored_text="".join(REPLY))
    assert take.failures == []
    assert (take.text, take.taken, take.ignored, take.later_tokens) == ("".join(REPLY), 5, 1, 4)


def test_a_reply_that_ended_before_the_page_came_back_is_not_counted_as_a_resume():
    # The flaky run of 2026-11-26: the new socket's resume got only the done frame (the page showed the whole
    # stored reply from it); the old verdict read that as a page missing 3 tokens.
    done = {"type": "done", "message_id": 7, "status": "completed", "content": "".join(REPLY)}
    take = page([token(0), token(1)], [done]).take(7, stored_text="".join(REPLY))
    assert len(take.failures) == 1
    assert "ended before the page's new socket resumed it" in take.failures[0]
    assert "!= stored" not in take.failures[0]


def test_a_token_missing_after_the_resume_fails():
    take = page([token(0), token(1)], [token(3), token(4)]).take(7, stored_text="".join(REPLY))
    assert take.failures == ["page took 2 tokens (9 chars) != stored 17 chars"]


def test_one_socket_fails_and_other_replies_tokens_are_not_counted():
    take = page([token(0), token(1, message_id=8)]).take(7, stored_text="Once")
    assert take.failures == ["the page did not open a second socket"]
    assert take.taken == 1
