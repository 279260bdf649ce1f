"""A raw HTTP server for tests: answers every request with fixed bytes, then stalls.

For what neither SDK nor the emulator produces on purpose: a server that never answers,
a stream that stops mid-way, a reply with ``"message": null``, a ``Retry-After: inf``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any


class RawServer:
    """A one-purpose HTTP server on 127.0.0.1: answers each connection with ``reply``
    (bytes, or a function of the request's head giving them), then keeps the socket open
    without a word (``stall`` seconds)."""

    def __init__(self, reply: bytes | Callable[[bytes], bytes], stall: float = 30.0) -> None:
        self.reply, self.stall = reply, stall
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                reply = self.reply(head) if callable(self.reply) else self.reply
                if reply:
                    conn.sendall(reply)
                self._stop.wait(self.stall)
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


@contextlib.contextmanager
def serving() -> Iterator[Any]:
    """``start(reply, stall=30.0)`` starts a server; all are closed on exit."""
    made: list[RawServer] = []

    def start(reply: bytes | Callable[[bytes], bytes], stall: float = 30.0) -> RawServer:
        made.append(RawServer(reply, stall))
        return made[-1]

    try:
        yield start
    finally:
        for s in made:
            s.close()
