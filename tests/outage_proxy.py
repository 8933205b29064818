"""A TCP proxy in front of PostgreSQL whose ``stop()`` is a real outage as clients see it: open sessions are
cut (the server "went away" mid-connection) and new connections are refused, as when PostgreSQL is stopped
or its host is unreachable. Tests point the database settings at it (:func:`database_through`)."""

from __future__ import annotations

import contextlib
import socket
import threading

from django.db import connections


class TcpProxy:
    """Forwards 127.0.0.1:``port`` (0: a free one) to ``target`` (host, port) until :meth:`stop`; a new proxy
    on a stopped one's port ends the outage."""

    def __init__(self, target: tuple[str, int], port: int = 0):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.running:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self.lock:
                if not self.running:
                    client.close()
                    upstream.close()
                    return
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """The outage: nothing listens on ``port`` any more and every proxied session is cut."""
        with self.lock:
            self.running = False
            self.listener.close()
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self.sockets.clear()


def database_target() -> tuple[str, int]:
    """Where this process's ``default`` database listens."""
    db = connections.settings["default"]
    return db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)


def database_url_through(proxy: TcpProxy) -> str:
    """A ``DATABASE_URL`` for a child process that reaches this process's database through ``proxy``."""
    db = connections.settings["default"]
    return f"postgres://{db['USER'] or 'postgres'}@127.0.0.1:{proxy.port}/{db['NAME']}"


@contextlib.contextmanager
def database_through(proxy: TcpProxy):
    """Point this process's ``default`` database at ``proxy`` (every thread's next connection goes through
    it; the connection wrappers share the settings dict), and back afterwards."""
    settings = connections.settings["default"]
    saved = settings["HOST"], settings["PORT"]
    connections.close_all()
    settings["HOST"], settings["PORT"] = "127.0.0.1", str(proxy.port)
    try:
        yield
    finally:
        settings["HOST"], settings["PORT"] = saved
        connections.close_all()
