"""The multi-host test bed's drills (``make test-cluster``; collected only with CHATSITE_BED_TESTS=1, since
the bed needs root, network namespaces and a few minutes): the bed comes up with one command, each drill
runs on its client host through the load balancer and must hold, and the teardown leaves nothing behind."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools.bed import netns, services
from devtools.bed.topology import BED_DIR, HOSTS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cluster


def drill(*names: str, timeout: float = 600) -> str:
    """Run ``manage.py cluster_drills`` on the client host; its output (printed), asserting it held."""
    result = subprocess.run(
        [
            str(ROOT / "scripts" / "bed"),
            "exec",
            "client",
            sys.executable,
            "manage.py",
            "cluster_drills",
            "--drills",
            ",".join(names),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    assert "| yes |" in result.stdout
    return result.stdout


@pytest.fixture(scope="module")
def bed():
    subprocess.run([str(ROOT / "scripts" / "bed"), "down"], capture_output=True)  # a bed left by a crash
    up = subprocess.run([str(ROOT / "scripts" / "bed"), "up"], capture_output=True, text=True, cwd=ROOT)
    assert up.returncode == 0, up.stdout + up.stderr[-6000:]
    yield
    services.bed_down()


def test_bed_is_up_with_every_host_and_both_web_nodes_in_the_pool(bed):
    assert set(netns.bed_namespaces()) >= {h.netns for h in HOSTS}
    for name in ("postgres", "redis", "rabbitmq", "daphne-web1", "daphne-web2", "worker-gpu1", "worker-gpu2"):
        assert services.alive(name), name
    # /readyz answered through the balancer once one node was up; the second may still be rising.
    deadline = time.monotonic() + 30
    while services.lb_server_states() != {"web1": "UP", "web2": "UP"} and time.monotonic() < deadline:
        time.sleep(0.5)
    assert services.lb_server_states() == {"web1": "UP", "web2": "UP"}


def test_worker_host_killed_mid_stream(bed):
    drill("worker_kill")


def test_web_node_killed_under_a_streaming_page(bed):
    drill("web_kill")


def test_partition_between_a_worker_host_and_the_data_host(bed):
    drill("partition_10", "partition_60")


def test_lossy_broker_link(bed):
    drill("lossy_broker")


def test_rolling_restart_of_the_web_tier_under_load(bed):
    drill("rolling_web")


def test_teardown_leaves_nothing_behind(bed):
    pids = [p["pid"] for p in services._state()["procs"].values()]
    down = subprocess.run([str(ROOT / "scripts" / "bed"), "down"], capture_output=True, text=True, cwd=ROOT)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "nothing left behind" in down.stdout
    assert netns.bed_namespaces() == []
    assert not BED_DIR.exists()
    # Gone, or a zombie waiting for a parent that is not ours to reap it (it holds no resource); a process
    # SIGKILLed a moment ago may still be exiting.
    deadline = time.monotonic() + 10
    while [pid for pid in pids if services.pid_alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if services.pid_alive(pid)]
    # No process of the bed's own PostgreSQL cluster, RabbitMQ node or daphnes is left anywhere.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(BED_DIR) not in ps and "bed@localhost" not in ps and "10.231.0." not in ps
