"""The bed's processes: each started inside its host's namespace, its pid and log recorded in
``BED_DIR/state.json`` so drills can kill, stop and restart it by name."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from devtools.bed import netns
from devtools.bed.topology import (
    AMQP_PORT,
    BED_DIR,
    BROKER_DELAY_FILE,
    BROKER_PROXY_PORT,
    CLIENT,
    DATA,
    GPU,
    LB,
    MODEL,
    PG_PORT,
    REDIS_PORT,
    ROOT,
    WEB,
    WEB_PORT,
    Host,
    app_env,
    haproxy_env,
)

PG_BIN = Path(os.environ.get("BED_PG_BIN", "/usr/lib/postgresql/15/bin"))
VENV_BIN = Path(sys.executable).parent
STATE = BED_DIR / "state.json"
LOGS = BED_DIR / "logs"
READY_LINE = "engine ready"  # what a worker logs once its engine is loaded (devtools.drills.processes)


def _state() -> dict:
    return json.loads(STATE.read_text()) if STATE.exists() else {"procs": {}}


def _save(state: dict) -> None:
    STATE.write_text(json.dumps(state, indent=1))


def start(name: str, host: Host, cmd: list[str], *, env: dict[str, str] | None = None) -> int:
    """Start ``cmd`` on ``host`` as the bed process ``name`` (log: ``BED_DIR/logs/<name>.log``); its pid."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = open(LOGS / f"{name}.log", "ab")
    proc = subprocess.Popen(
        netns.in_ns(host, *cmd),
        cwd=ROOT,
        env=env or app_env(host),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    state = _state()
    state["procs"][name] = {"pid": proc.pid, "host": host.name, "log": str(LOGS / f"{name}.log")}
    _save(state)
    return proc.pid


def pid_of(name: str) -> int:
    return _state()["procs"][name]["pid"]


def alive(name: str) -> bool:
    try:
        os.kill(pid_of(name), 0)
    except (ProcessLookupError, KeyError):
        return False
    return True


def signal_proc(name: str, sig: int, *, wait_s: float = 30.0) -> None:
    """Send ``sig`` to bed process ``name``'s process group and wait up to ``wait_s`` for it to exit."""
    pid = pid_of(name)
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:  # started by another process (``bed up``): poll its existence
            if not pid_alive(pid):
                return
        time.sleep(0.05)
    os.killpg(pid, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, which holds nothing but its exit status, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def log_text(name: str) -> str:
    return Path(_state()["procs"][name]["log"]).read_text(errors="replace")


def wait_tcp(host: Host, addr: str, port: int, *, timeout: float = 120.0, proc: str | None = None) -> None:
    """Wait until ``addr:port`` accepts a TCP connection from ``host``; TimeoutError (with ``proc``'s log
    tail) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    probe = f"exec 3<>/dev/tcp/{addr}/{port}"
    while time.monotonic() < deadline:
        if subprocess.run(netns.in_ns(host, "bash", "-c", probe), capture_output=True).returncode == 0:
            return
        if proc and not alive(proc):
            raise RuntimeError(f"{proc} exited:\n{log_text(proc)[-3000:]}")
        time.sleep(0.5)
    raise TimeoutError(
        f"{addr}:{port} not reachable after {timeout} s" + (f":\n{log_text(proc)[-3000:]}" if proc else "")
    )


# --- the data host ------------------------------------------------------------------------------------


def postgres_up() -> None:
    """A throwaway PostgreSQL cluster in ``BED_DIR/pg`` (initdb as the postgres user, no fsync), listening
    on the data host's bridge address, trusting the bed's subnet; creates the ``chatsite`` database."""
    data = BED_DIR / "pg"
    data.mkdir(parents=True)
    shutil.chown(data, "postgres", "postgres")
    netns.run("runuser", "-u", "postgres", "--", str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres",
              "-A", "trust", "--no-sync")  # fmt: skip
    with open(data / "pg_hba.conf", "a") as hba:
        hba.write("host all all 10.231.0.0/24 trust\n")
    settings = {
        "listen_addresses": DATA.addr,
        "port": PG_PORT,
        "unix_socket_directories": str(data),
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "max_connections": 300,
        "shared_buffers": "64MB",
    }
    args = [a for k, v in settings.items() for a in ("-c", f"{k}={v}")]
    start(
        "postgres",
        DATA,
        ["runuser", "-u", "postgres", "--", str(PG_BIN / "postgres"), "-D", str(data), *args],
    )
    wait_tcp(DATA, DATA.addr, PG_PORT, proc="postgres")
    deadline = time.monotonic() + 60
    while True:
        created = subprocess.run(
            netns.in_ns(DATA, str(PG_BIN / "createdb"), "-h", DATA.addr, "-U", "postgres", "chatsite"),
            capture_output=True,
            text=True,
        )
        if created.returncode == 0:
            return
        if time.monotonic() > deadline:  # "the database system is starting up" for a moment after listen
            raise RuntimeError(created.stderr)
        time.sleep(0.5)


def redis_up() -> None:
    (BED_DIR / "redis").mkdir(parents=True)
    start(
        "redis",
        DATA,
        [
            "redis-server",
            "--bind",
            DATA.addr,
            "--port",
            str(REDIS_PORT),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            str(BED_DIR / "redis"),
            "--maxclients",
            "20000",
        ],  # fmt: skip
    )
    wait_tcp(DATA, DATA.addr, REDIS_PORT, proc="redis")


def rabbitmq_up() -> None:
    """A RabbitMQ node of the bed's own (node name, mnesia and log directories, Erlang cookie and epmd are
    the data host's), listening on the bridge address; guest may connect from the bed's hosts."""
    base = BED_DIR / "rabbitmq"
    base.mkdir(parents=True)
    (base / "rabbitmq.conf").write_text(
        f"loopback_users = none\nlisteners.tcp.default = {DATA.addr}:{AMQP_PORT}\n"
    )
    (base / "enabled_plugins").write_text("[].\n")
    env = {
        **os.environ,
        "HOME": str(base),
        "RABBITMQ_NODENAME": "bed@localhost",
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(base / "pid"),
        "RABBITMQ_LOGS": "-",
    }
    start("rabbitmq", DATA, ["/usr/lib/rabbitmq/bin/rabbitmq-server"], env=env)
    wait_tcp(DATA, DATA.addr, AMQP_PORT, timeout=180, proc="rabbitmq")


def broker_proxy_start(host: Host) -> None:
    """The delay proxy between ``host`` and the broker (``devtools/bed/delay_proxy.py``), on the host's
    loopback; no delay until :func:`broker_delay` sets one."""
    name = f"broker-proxy-{host.name}"
    start(name, host, [str(VENV_BIN / "python"), "-m", "devtools.bed.delay_proxy",
                       "--listen", f"127.0.0.1:{BROKER_PROXY_PORT}", "--upstream", f"{DATA.addr}:{AMQP_PORT}",
                       "--delay-file", str(BROKER_DELAY_FILE)])  # fmt: skip
    wait_tcp(host, "127.0.0.1", BROKER_PROXY_PORT, proc=name)


def broker_delay(ms: float) -> None:
    """Delay every byte between the web/worker hosts and the broker by ``ms`` milliseconds each way (0:
    none); the proxies follow within 0.2 s."""
    BROKER_DELAY_FILE.write_text(f"{ms:g}")
    time.sleep(0.5)


# --- the product --------------------------------------------------------------------------------------


def manage(*args: str, host: Host = CLIENT) -> None:
    """``manage.py ARGS`` on ``host`` against the bed's services; RuntimeError with its output on failure."""
    result = subprocess.run(
        netns.in_ns(host, str(VENV_BIN / "python"), "manage.py", *args),
        cwd=ROOT,
        env=app_env(host),
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)}:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")


def web_start(host: Host) -> None:
    """daphne on ``host`` (the Procfile's ``web`` command), waiting until it accepts connections."""
    name = f"daphne-{host.name}"
    cmd = ["bash", "-c", f"ulimit -n $(ulimit -Hn) && exec {VENV_BIN}/daphne -b {host.addr} -p {WEB_PORT} "
           "chatsite.asgi:application"]  # fmt: skip
    start(name, host, cmd)
    wait_tcp(CLIENT, host.addr, WEB_PORT, proc=name)


def worker_start(host: Host) -> str:
    """A GPU worker (the Procfile's ``worker`` command, CPU here) on ``host``; returns its process name."""
    name = f"worker-{host.name}"
    env = app_env(host)
    start(name, host, [str(VENV_BIN / "celery"), "-A", "chatsite", "worker", "--pool", "threads",
                        "--concurrency", env["WORKER_CONCURRENCY"], "--prefetch-multiplier", "1",
                        "-Q", f"inference.{MODEL}", "-n", f"gpu@bed-{host.name}", "--loglevel", "INFO"],
          env=env)  # fmt: skip
    return name


def worker_wait_ready(name: str, *, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while READY_LINE not in log_text(name):
        if not alive(name):
            raise RuntimeError(f"{name} exited:\n{log_text(name)[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} not ready after {timeout} s:\n{log_text(name)[-3000:]}")
        time.sleep(0.5)


def tls_certificate() -> Path:
    """A self-signed certificate for the load balancer, generated into ``BED_DIR`` (never committed)."""
    key, cert, pem = BED_DIR / "lb.key", BED_DIR / "lb.crt", BED_DIR / "lb.pem"
    netns.run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=chatsite.bed",
              "-addext", f"subjectAltName=DNS:chatsite.bed,IP:{LB.addr}", "-keyout", str(key), "-out", str(cert))  # fmt: skip
    pem.write_bytes(cert.read_bytes() + key.read_bytes())
    pem.chmod(0o600)
    return pem


def lb_start() -> None:
    cfg = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
    start("haproxy", LB, ["haproxy", "-db", "-f", str(cfg)], env=haproxy_env(BED_DIR / "lb.pem", lb_socket()))
    wait_tcp(CLIENT, LB.addr, 443, proc="haproxy")


def lb_socket() -> Path:
    return BED_DIR / "haproxy.sock"


def lb_command(command: str) -> str:
    """One command on HAProxy's runtime API (e.g. ``set server web/web1 state drain``); its answer."""
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(lb_socket()))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def lb_server_states() -> dict[str, str]:
    """``{"web1": "UP", ...}`` from the runtime API's ``show stat`` (status column)."""
    lines = lb_command("show stat").splitlines()
    header = lines[0].lstrip("# ").split(",")
    states = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("pxname") == "web" and row.get("svname", "").startswith("web"):
            states[row["svname"]] = row["status"]
    return states


def wait_ready_through_lb(*, timeout: float = 180.0) -> None:
    """Wait until ``/readyz`` answers 200 through the load balancer from the client host."""
    deadline = time.monotonic() + timeout
    url = f"https://{LB.addr}/readyz"
    while time.monotonic() < deadline:
        result = subprocess.run(
            netns.in_ns(
                CLIENT, "curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", url
            ),
            capture_output=True,
            text=True,
        )
        if result.stdout == "200":
            return
        time.sleep(1)
    raise TimeoutError(f"{url} not 200 after {timeout} s")


def bed_up() -> None:
    """Everything, in dependency order; ~1-3 min on a shared 2-core machine (the workers load the model)."""
    if netns.bed_namespaces() or BED_DIR.exists():
        raise RuntimeError(f"a bed is already up (or left over): run `scripts/bed down` first ({BED_DIR})")
    BED_DIR.mkdir(parents=True)
    BED_DIR.chmod(0o755)
    netns.network_up()
    postgres_up()
    redis_up()
    rabbitmq_up()
    manage("migrate", "--noinput")
    manage("bootstrap")
    manage("collectstatic", "--noinput", "-v0")
    BROKER_DELAY_FILE.write_text("0")
    for host in (*WEB, *GPU):
        broker_proxy_start(host)
    workers = [worker_start(h) for h in GPU]
    for host in WEB:
        web_start(host)
    tls_certificate()
    lb_start()
    for name in workers:
        worker_wait_ready(name)
    wait_ready_through_lb()


def bed_down() -> list[str]:
    """Kill every process of the bed, delete its namespaces and ``BED_DIR``; returns what was left behind
    (namespaces, processes still alive), which is empty when the teardown is complete."""
    pids = [p["pid"] for p in _state()["procs"].values()] if STATE.exists() else []
    netns.network_down()
    for pid in pids:  # anything that escaped its namespace's process list
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    shutil.rmtree(BED_DIR, ignore_errors=True)
    left = [f"namespace {n}" for n in netns.bed_namespaces()]
    left += [f"process {pid}" for pid in pids if pid_alive(pid)]
    if BED_DIR.exists():
        left.append(f"directory {BED_DIR}")
    return left
