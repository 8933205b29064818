"""A worker's load publisher through a Redis outage: it keeps trying every PUBLISH_RETRY_S, so a restarted Redis
(which lost every worker's status, so admission answered ``no_workers``) sees the worker again at once."""

import json
import threading

import redis

from inference import fleet


class FlakyRedis:
    """The edge of the process: a Redis client whose first ``down`` writes fail as if the server were
    restarting; later ones are kept in ``written``."""

    def __init__(self, down: int):
        self.down = down
        self.written: dict[str, tuple[str, int]] = {}

    def set(self, key, value, ex=None):
        if self.down > 0:
            self.down -= 1
            raise redis.exceptions.ConnectionError("Connection refused.")
        self.written[key] = (value, ex)


class CountedStop(threading.Event):
    """A stop event that records each wait (seconds) instead of sleeping, and is set after ``rounds`` waits."""

    def __init__(self, rounds: int):
        super().__init__()
        self.rounds = rounds
        self.waits: list[float] = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if len(self.waits) >= self.rounds:
            self.set()
        return self.is_set()


def status():
    return fleet.WorkerStatus(worker_id="host-a:7", host="host-a", pid=7, model="m", ready=True)


def test_publisher_retries_every_fifth_of_a_second_while_redis_is_down_then_once_a_second():
    client = FlakyRedis(down=3)
    stop = CountedStop(rounds=5)
    fleet.publish_forever(status, stop=stop, client=client)
    assert stop.waits == [fleet.PUBLISH_RETRY_S] * 3 + [fleet.PUBLISH_INTERVAL_S] * 2
    assert fleet.PUBLISH_RETRY_S <= 0.25
    value, ttl = client.written[fleet.status_key("host-a:7")]
    assert json.loads(value)["model"] == "m" and ttl == fleet.STATUS_TTL_S


def test_publisher_survives_a_failing_status_read_and_stops_when_asked():
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("engine not ready")

    stop = CountedStop(rounds=2)
    fleet.publish_forever(broken, stop=stop, client=FlakyRedis(down=0))
    assert len(calls) == 2 and stop.waits == [fleet.PUBLISH_RETRY_S] * 2
