"""A hostile HTTP server in a process of its own, for what a test counts in its own process
(threads, sockets) or what must not be held in memory (a reply of many MB).

``python hostile_server.py`` prints its port and serves until killed. The first path
segment of each request picks the behaviour (a base URL of ``http://127.0.0.1:PORT/MODE/v1``):

- ``trickle-sse``: 200, an event stream that sends only ``: ping`` comments, one a 0.2 s;
- ``trickle-json``: 200, ``Content-Length`` 1 MB, one space a 0.2 s;
- ``silent``: reads the request and never answers;
- ``big-STATUS-MB-HOW``: STATUS with MB megabytes of body, ``HOW`` ``length`` (with a
  ``Content-Length``) or ``chunked`` (none: the size is only known by reading);
- ``dense-MB``: a whole (unstreamed) answer of MB megabytes in the request's wire format
  (``/messages``: Anthropic's, else OpenAI's), every line of it secret-like (a key, a
  password, a URL with a token): the slowest text there is to mask.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator


def _read_request(conn: socket.socket) -> str:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return ""
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        piece = conn.recv(65536)
        if not piece:
            break
        body += piece
    return head.split(b" ")[1].decode()


def _answer(conn: socket.socket) -> None:
    with conn:
        path = _read_request(conn)
        mode = path.strip("/").split("/")[0]
        if mode == "trickle-sse":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            for _ in range(600):
                conn.sendall(b"9\r\n: ping\r\n\n\r\n")
                time.sleep(0.2)
        elif mode == "trickle-json":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000000\r\n\r\n")
            for _ in range(600):
                conn.sendall(b" ")
                time.sleep(0.2)
        elif mode == "silent":
            time.sleep(120)
        elif mode.startswith("dense-"):
            line = ("api_key=sk-proj-abcdefghijklmnop1234 password: hunter2hunter2 "
                    "https://u:p@h/x?key=abcdef\n")
            text = line * int(float(mode.split("-")[1]) * 1024 * 1024 / len(line))
            if path.endswith("/messages"):
                reply = {"id": "m", "type": "message", "role": "assistant", "model": "m",
                         "content": [{"type": "text", "text": text}],
                         "stop_reason": "end_turn",
                         "usage": {"input_tokens": 10, "output_tokens": 10}}
            else:
                reply = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": text}}],
                         "usage": {"prompt_tokens": 10, "completion_tokens": 10}}
            body = json.dumps(reply).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        elif mode.startswith("big-"):
            _, status, mb, how = mode.split("-")
            size = int(float(mb) * 1024 * 1024)
            head = (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                    + (f"Content-Length: {size}\r\n" if how == "length"
                       else "Transfer-Encoding: chunked\r\n") + "\r\n")
            conn.sendall(head.encode())
            block = b'{"a": "' + b"x" * (64 * 1024 - 10) + b'"}\n'
            sent = 0
            while sent < size:
                piece = block[:size - sent]
                conn.sendall(piece if how == "length"
                             else b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
            if how != "length":
                conn.sendall(b"0\r\n\r\n")


def _serve() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    print(server.getsockname()[1], flush=True)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_guarded, args=(conn,), daemon=True).start()


def _guarded(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        _answer(conn)


@contextlib.contextmanager
def hostile_server() -> Iterator[int]:
    """The port of a hostile server running in a child process (killed on exit)."""
    child = subprocess.Popen([sys.executable, __file__], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        yield int(child.stdout.readline())
    finally:
        child.kill()
        child.wait()


if __name__ == "__main__":
    _serve()
