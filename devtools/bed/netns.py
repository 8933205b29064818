"""Namespaces, links and network faults of the bed (iproute2 and iptables inside the namespaces only)."""

from __future__ import annotations

import signal
import subprocess
import time

from devtools.bed.topology import HOSTS, PREFIX, SUBNET, SWITCH, Host


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd``; raises RuntimeError with its output when it fails and ``check``."""
    result = subprocess.run(cmd, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def in_ns(host: Host, *cmd: str) -> list[str]:
    """``cmd`` as run on ``host``."""
    return ["ip", "netns", "exec", host.netns, *cmd]


def bed_namespaces() -> list[str]:
    """Names of every namespace the bed owns (prefix ``chb-``), whether or not the bed is complete."""
    out = run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def network_up() -> None:
    """The switch namespace with its bridge, and one namespace per host joined to it by a veth pair."""
    run("ip", "netns", "add", SWITCH)
    run("ip", "-n", SWITCH, "link", "set", "lo", "up")
    run("ip", "-n", SWITCH, "link", "add", "br0", "type", "bridge")
    run("ip", "-n", SWITCH, "link", "set", "br0", "up")
    for host in HOSTS:
        run("ip", "netns", "add", host.netns)
        run("ip", "-n", host.netns, "link", "set", "lo", "up")
        port = f"v-{host.name}"
        run(
            "ip",
            "-n",
            SWITCH,
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            host.netns,
        )
        run("ip", "-n", SWITCH, "link", "set", port, "master", "br0", "up")
        run("ip", "-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
        run("ip", "-n", host.netns, "link", "set", "eth0", "up")


def ns_pids(netns: str) -> list[int]:
    out = run("ip", "netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split()]


def kill_all_in(netns: str, *, grace_s: float = 5.0) -> None:
    """SIGTERM every process in ``netns``, SIGKILL what is left after ``grace_s``."""
    import os

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ns_pids(netns):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while ns_pids(netns) and time.monotonic() < deadline:
            time.sleep(0.2)


def network_down() -> None:
    """Kill every process in the bed's namespaces, then delete the namespaces (their links go with them)."""
    for netns in bed_namespaces():
        kill_all_in(netns)
    for netns in bed_namespaces():
        run("ip", "netns", "del", netns, check=False)


# --- faults -------------------------------------------------------------------------------------------


def partition(a: Host, b: Host) -> None:
    """Drop every packet between ``a`` and ``b`` (iptables DROP on ``a``, both directions)."""
    run(*in_ns(a, "iptables", "-I", "INPUT", "-s", b.addr, "-j", "DROP"))
    run(*in_ns(a, "iptables", "-I", "OUTPUT", "-d", b.addr, "-j", "DROP"))


def heal(a: Host, b: Host) -> None:
    """Undo :func:`partition`."""
    run(*in_ns(a, "iptables", "-D", "INPUT", "-s", b.addr, "-j", "DROP"), check=False)
    run(*in_ns(a, "iptables", "-D", "OUTPUT", "-d", b.addr, "-j", "DROP"), check=False)


def lossy_port(host: Host, port: int, *, loss: float) -> list[list[str]]:
    """Drop a random ``loss`` fraction (0..1) of the packets ``host`` sends from or to TCP ``port`` on the
    bed (iptables' statistic match); returns the rules, for :func:`unlossy`."""
    rules = []
    for direction in ("--sport", "--dport"):
        rule = ["OUTPUT", "-p", "tcp", direction, str(port), "-d", f"{SUBNET}.0/24"]
        rule += ["-m", "statistic", "--mode", "random", "--probability", f"{loss:.4f}", "-j", "DROP"]
        run(*in_ns(host, "iptables", "-I", *rule))
        rules.append(rule)
    return rules


def unlossy(host: Host, rules: list[list[str]]) -> None:
    for rule in rules:
        run(*in_ns(host, "iptables", "-D", *rule), check=False)
