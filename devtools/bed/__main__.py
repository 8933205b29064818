"""``python -m devtools.bed up|down|status|env|exec HOST CMD...`` (``scripts/bed``)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from devtools.bed import netns, services
from devtools.bed.topology import HOSTS, app_env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="bring the bed up (fails if one is up)")
    sub.add_parser("down", help="tear it down; exit 1 if anything is left behind")
    sub.add_parser("status", help="namespaces, processes and the load balancer's view of the web nodes")
    sub.add_parser("env", help="print the product's environment on the bed, as shell exports")
    ex = sub.add_parser("exec", help="run a command on one of the bed's hosts")
    ex.add_argument("host", choices=[h.name for h in HOSTS])
    ex.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if args.command == "up":
        try:
            services.bed_up()
        except BaseException:
            if os.environ.get("BED_KEEP_ON_FAILURE"):
                raise
            print("bed up failed; tearing down what was started", file=sys.stderr)
            services.bed_down()
            raise
        print(f"bed up: https://{services.LB.addr}/ (from the client host: scripts/bed exec client ...)")
    elif args.command == "down":
        left = services.bed_down()
        print("bed down" + (": left behind " + ", ".join(left) if left else ": nothing left behind"))
        return 1 if left else 0
    elif args.command == "status":
        print("namespaces:", " ".join(netns.bed_namespaces()) or "none")
        for name, proc in services._state()["procs"].items():
            print(
                f"{name:18} {proc['host']:7} pid {proc['pid']:>7} {'up' if services.alive(name) else 'DOWN'}"
            )
        if services.lb_socket().exists():
            print("load balancer:", services.lb_server_states())
    elif args.command == "env":
        for key in ("DJANGO_SETTINGS_MODULE", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL",
                    "CELERY_BROKER_URL"):  # fmt: skip
            print(f"export {key}={shlex.quote(app_env()[key])}")
    elif args.command == "exec":
        host = next(h for h in HOSTS if h.name == args.host)
        os.chdir(services.ROOT)
        os.execvpe("ip", netns.in_ns(host, *args.cmd), app_env(host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
