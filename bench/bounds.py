"""Every bound bounds the whole turn: how long a turn takes when a reply is huge, when its
own work (masking an answer, read_file's scan) would take minutes, and what timed-out
turns leave behind — against the hostile server of ``tests/hostile_server.py`` (a child
process on 127.0.0.1) with the real SDKs.

Prints figures, never verdicts. ``--quick``: small sizes (the smoke test's).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import openai  # noqa: E402
from hostile_server import hostile_server  # noqa: E402

from ipy_ctxrecovery import ChatSession, Settings  # noqa: E402
from ipy_ctxrecovery.errors import ChatError  # noqa: E402
from ipy_ctxrecovery.session.tools import make_read_file  # noqa: E402


def _session(port: int, mode: str, **settings: object) -> ChatSession:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/{mode}/v1",
                           api_key="sk-bench-key-1234", max_retries=0)
    return ChatSession("openai:gpt-4o", client=client, settings=Settings(**settings))


def _turn(session: ChatSession, *, stream: bool = False) -> tuple[float, str]:
    started = time.monotonic()
    try:
        session.send("hello", stream=stream)
        outcome = "answered"
    except ChatError as e:
        outcome = str(e).split(";")[0][:90]
    return time.monotonic() - started, outcome


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return count


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    big, dense, sparse_gb, turns = (8, 0.5, 1, 2) if args.quick else (60, 4, 5, 6)
    bound = {"max_reply": 1024 * 1024} if args.quick else {}
    with tempfile.TemporaryDirectory() as state, hostile_server() as port:
        os.environ["IPY_CTXRECOVERY_DIR"] = state
        for how in ("length", "chunked"):
            s = _session(port, f"big-200-{big}-{how}", turn_timeout=20.0, **bound)
            took, outcome = _turn(s)
            s.close()
            print(f"figure {big} MB answer ({how}), turn_timeout=20: {took:.2f} s — {outcome}")
        s = _session(port, f"dense-{dense}", turn_timeout=3.0, max_reply=64 * 1024 * 1024)
        took, outcome = _turn(s)
        s.close()
        print(f"figure {dense} MB secret-like answer, turn_timeout=3: {took:.2f} s — {outcome}")
        for mode, stream in (("trickle-sse", True), ("trickle-json", False)):
            s = _session(port, mode, turn_timeout=1.0)
            before = (threading.active_count(), _sockets())
            for _ in range(turns):
                _turn(s, stream=stream)
            time.sleep(1.0)
            after = (threading.active_count(), _sockets())
            s.close()
            print(f"figure {turns} timed-out turns, {mode}: threads {after[0] - before[0]:+d}, "
                  f"sockets {after[1] - before[1]:+d} after 1 s")
        root = Path(state) / "files"
        root.mkdir()
        huge = root / "huge.log"
        huge.write_text("".join(f"line {i}\n" for i in range(1000)))
        os.truncate(huge, sparse_gb * 1024 ** 3)
        tool = make_read_file(root, root / "results")
        started, read = time.monotonic(), _rchar()
        text, _ = tool.run(json.dumps({"path": "huge.log", "offset": 10, "limit": 3}))
        print(f"figure read_file 3 lines of a {sparse_gb} GB file: "
              f"{time.monotonic() - started:.3f} s, {(_rchar() - read) / 1e6:.1f} MB read — "
              f"{text.splitlines()[0]}")


if __name__ == "__main__":
    main()
