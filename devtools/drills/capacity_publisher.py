"""The publishing side of ``manage.py socket_capacity``, in a process of its own so that publishing and
the measured sockets do not share one interpreter: ``python -m devtools.drills.capacity_publisher IDS_JSON
TOKENS RATE START OUT_JSON`` publishes ``TOKENS`` token frames to each reply id at ``RATE`` tokens/s from
monotonic time ``START`` on (``time.monotonic()`` is one clock for every process of the machine), as a
worker publishes them, and writes ``{"published": {"mid:seq": publish time}, "round_s": [seconds each round
of publishes, one token to every reply, took]}`` to OUT_JSON (a round longer than 1/RATE means the
publisher, not the web tier, fell behind)."""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from events import broadcast

    ids = json.loads(open(argv[0]).read())
    tokens, rate, start, out = int(argv[1]), float(argv[2]), float(argv[3]), argv[4]
    published: dict[str, float] = {}
    round_s = []
    for seq in range(tokens):
        time.sleep(max(0.0, start + seq / rate - time.monotonic()))
        began = time.monotonic()
        for mid in ids:
            published[f"{mid}:{seq}"] = time.monotonic()
            broadcast.publish(mid, broadcast.frame_token(message_id=mid, seq=seq, text=f" t{seq}"))
        round_s.append(time.monotonic() - began)
    with open(out, "w") as f:
        json.dump({"published": published, "round_s": round_s}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
