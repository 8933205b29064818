"""What a chat page took of a reply over the sockets it opened, and the web-node drill's verdict on it.

Pure (no Django, no browser): the browser drill (``devtools/drills/cluster_browser.py``) feeds it the frames
Playwright saw on each socket, and ``tests/unit/test_page_frames.py`` feeds it made-up ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PageTake:
    """The verdict on one reply. ``text``/``taken``: what the page assembled from token frames (a token is
    taken only when its seq is the next one, as ``static/chat/chat.js`` does); ``ignored``: token frames it
    dropped as already seen; ``later_tokens``: token frames of the reply on the sockets after the first
    (replayed or live); ``failures``: broken guarantees in words, empty when it held."""

    text: str
    taken: int
    ignored: int
    later_tokens: int
    failures: list[str] = field(default_factory=list)


class PageFrames:
    """Server frames a page received, in arrival order: ``(socket number from 1, frame dict)``."""

    def __init__(self):
        self.frames: list[tuple[int, dict]] = []
        self.sockets = 0

    def socket_opened(self) -> int:
        """Count a new socket; its number (1, 2, ...)."""
        self.sockets += 1
        return self.sockets

    def add(self, socket: int, frame: dict) -> None:
        self.frames.append((socket, frame))

    def take(self, message_id: int, *, stored_text: str) -> PageTake:
        """Judge a reply whose first socket died mid-stream. It held when the page opened a new socket, that
        socket got token frames of the reply (so a resume was exercised: a reply that ended before the
        page came back gets only its ``done``, and proves nothing about resuming), and the tokens taken
        across all sockets are exactly ``stored_text``: none missing, none twice."""
        last, pieces, taken, ignored, later = -1, [], 0, 0, 0
        for socket, frame in self.frames:
            if frame.get("type") != "token" or frame.get("message_id") != message_id:
                continue
            later += socket > 1
            if frame["seq"] <= last:
                ignored += 1
            elif frame["seq"] == last + 1:
                pieces.append(frame["text"])
                last, taken = frame["seq"], taken + 1
        result = PageTake("".join(pieces), taken, ignored, later)
        if self.sockets < 2:
            result.failures.append("the page did not open a second socket")
        elif later == 0:
            result.failures.append(
                f"the reply ended before the page's new socket resumed it (no token frame after socket 1;"
                f" {taken} tokens taken before the kill): no resume was exercised; the reply is too short"
                " for this machine's decode speed"
            )
        elif result.text != stored_text:
            result.failures.append(
                f"page took {taken} tokens ({len(result.text)} chars) != stored {len(stored_text)} chars"
            )
        return result
