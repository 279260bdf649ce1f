"""A gateway that echoes credentials: every request gets a 401 whose JSON error message
quotes the ``Authorization`` header, the request path and the query values (decoded) as
they arrived.

Some gateways do this; what they echo must not reach what the user sees or any file.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit


class _Gateway(ThreadingHTTPServer):
    seen: list[str]


class _EchoAuth(BaseHTTPRequestHandler):
    server: _Gateway

    def do_POST(self) -> None:  # noqa: N802  (the name http.server calls)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        auth = self.headers.get("Authorization", "")
        self.server.seen.append(auth)
        values = " ".join(v for _, v in parse_qsl(urlsplit(self.path).query))
        body = json.dumps({"error": {
            "message": f"Incorrect API key provided: {auth}. Request: POST {self.path} "
                       f"(query values: {values})",
            "type": "invalid_request_error", "code": "invalid_api_key"}}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # the test's output stays its own


@contextlib.contextmanager
def auth_echo() -> Iterator[tuple[int, list[str]]]:
    """A running echo gateway on 127.0.0.1: (port, the Authorization values it received)."""
    server = _Gateway(("127.0.0.1", 0), _EchoAuth)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port, server.seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
