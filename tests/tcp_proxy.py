"""A TCP proxy a test can take down and bring back: a real network outage for a real server.

    with TcpProxy(("127.0.0.1", 5432)) as proxy:     # proxy.port forwards to the server
        ...
        proxy.stop()    # every open connection is cut, new ones are refused
        proxy.start()   # the same port answers again
        proxy.hang()    # connections stay open and new ones are accepted, but nothing is
        proxy.unhang()  # forwarded until unhang (a server that stops answering, not refusing)

Threads only; everything it starts it stops (no process is left behind).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class TcpProxy:
    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.upstream = upstream
        self.host = host
        with socket.socket() as probe:
            probe.bind((host, 0))
            self.port = int(probe.getsockname()[1])
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.connections = 0  # accepted since the start, for tests that want to see traffic
        self._flowing = threading.Event()  # cleared while hung: bytes wait, nothing is lost
        self._flowing.set()

    def hang(self) -> None:
        """Stop forwarding without refusing: every byte waits in the proxy until unhang()."""
        self._flowing.clear()

    def unhang(self) -> None:
        self._flowing.set()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        """Refuse new connections and cut every open one (as a server restart does)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            if not self._flowing.is_set():
                # Accepted, and left waiting (its bytes too) until unhang: a hung server.
                threading.Thread(target=self._join, args=(listener, client), daemon=True).start()
                continue
            self._join(listener, client)

    def _join(self, listener: socket.socket, client: socket.socket) -> None:
        self._flowing.wait()
        try:
            server = socket.create_connection(self.upstream, timeout=5)
            server.settimeout(None)
        except OSError:
            client.close()
            return
        with self._lock:
            if self._listener is not listener:  # stopped meanwhile
                client.close()
                server.close()
                return
            self._sockets |= {client, server}
            self.connections += 1
        for src, dst in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()  # hung: the bytes wait here, in order
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # One side ended: end the other too (the peer sees the connection drop).
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
