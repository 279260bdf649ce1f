"""How long the first ``%chat panel`` takes in a fresh kernel (figures, no verdict).

Each run starts a new ipykernel through jupyter_client (as JupyterLab does), loads the
extension (``%load_ext ipy_ctxrecovery``, timed on its own), then shows the panel twice:
the first ``%chat panel`` makes the kernel's default session — the provider, so the SDK of
its wire is imported, and the embedded emulator — and the second only displays. Each is
timed inside the kernel (``time.perf_counter`` around the magic) and from the client
(execute request to the kernel going idle, the display message included). The SDK modules
the first panel brought in are listed, so a figure says where its time went.

Run: ``python bench/panel.py`` (``--repeat 3`` fresh kernels, ``--model emulator`` or
``emulator:anthropic``). Medians of ``--repeat`` kernels. The goal (issue 25): the first
panel well under 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from jupyter_client.manager import start_new_kernel

TIMEOUT = 120
_TIMED = """
import time as _t, sys as _s, json as _j
_before = set(_s.modules)
_t0, _c0 = _t.perf_counter(), _t.process_time()
get_ipython().run_line_magic("chat", "panel")
_took, _cpu = _t.perf_counter() - _t0, _t.process_time() - _c0
_new = sorted(m for m in set(_s.modules) - _before if m in ("openai", "anthropic", "anywidget",
                                                             "ipywidgets", "httpx2"))
print("BENCH " + _j.dumps({"seconds": _took, "cpu": _cpu, "imported": _new}))
"""
_FLOOR = """
import time as _t, json as _j
_t0, _c0 = _t.perf_counter(), _t.process_time()
import {sdk}
print("BENCH " + _j.dumps({{"seconds": _t.perf_counter() - _t0, "cpu": _t.process_time() - _c0,
                           "imported": []}}))
"""


def _run(client: Any, code: str) -> tuple[float, str]:
    """(seconds from request to idle, the stream text) of ``code`` in the kernel."""
    out: list[str] = []

    def hook(message: dict[str, Any]) -> None:
        if message["msg_type"] == "stream":
            out.append(message["content"]["text"])
        elif message["msg_type"] == "error":
            raise RuntimeError("\n".join(message["content"]["traceback"]))

    started = time.perf_counter()
    client.execute_interactive(code, timeout=TIMEOUT, output_hook=hook, allow_stdin=False)
    return time.perf_counter() - started, "".join(out)


def _timed(text: str) -> dict[str, Any]:
    line = next(line for line in text.splitlines() if line.startswith("BENCH "))
    found: dict[str, Any] = json.loads(line.removeprefix("BENCH "))
    return found


def one_kernel(model: str) -> dict[str, Any]:
    manager, client = start_new_kernel(kernel_name="python3", startup_timeout=TIMEOUT)
    try:
        load, _ = _run(client, f"%config ChatMagics.default_model = {model!r}\n"
                               "%load_ext ipy_ctxrecovery")
        first_client, first_out = _run(client, _TIMED)
        second_client, second_out = _run(client, _TIMED)
        first, second = _timed(first_out), _timed(second_out)
        return {"load": load, "first": first["seconds"], "first_cpu": first["cpu"],
                "first_client": first_client, "second": second["seconds"],
                "second_client": second_client, "imported": first["imported"]}
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def sdk_alone(sdk: str) -> dict[str, Any]:
    """The floor: importing the wire's SDK, alone, in a fresh kernel."""
    manager, client = start_new_kernel(kernel_name="python3", startup_timeout=TIMEOUT)
    try:
        _, out = _run(client, _FLOOR.format(sdk=sdk))
        found = _timed(out)
        return {"sdk": found["seconds"], "sdk_cpu": found["cpu"]}
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", default="emulator", choices=("emulator", "emulator:anthropic"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-panel-") as root:
        os.environ["IPY_CTXRECOVERY_DIR"] = root      # the kernels inherit it
        sdk = "anthropic" if args.model.endswith("anthropic") else "openai"
        runs = [{**one_kernel(args.model), **sdk_alone(sdk)} for _ in range(args.repeat)]
    median = {key: statistics.median(r[key] for r in runs)
              for key in ("load", "first", "first_cpu", "first_client", "second",
                          "second_client", "sdk", "sdk_cpu")}
    print(f"model {args.model}, {args.repeat} fresh kernel(s), medians:")
    print(f"  %load_ext ipy_ctxrecovery       {median['load']:.2f} s (client)")
    print(f"  first %chat panel               {median['first']:.2f} s in the kernel "
          f"({median['first_cpu']:.2f} s CPU), {median['first_client']:.2f} s at the client")
    print(f"  import {sdk} alone (floor)     {median['sdk']:.2f} s in a fresh kernel "
          f"({median['sdk_cpu']:.2f} s CPU)")
    print(f"  second %chat panel              {median['second'] * 1000:.1f} ms in the kernel, "
          f"{median['second_client'] * 1000:.1f} ms at the client")
    print(f"  imported by the first panel: {', '.join(runs[0]['imported']) or 'nothing'}")
    print(f"ratio panel first/2s: {median['first'] / 2:.2f} second/2s: "
          f"{median['second'] / 2:.4f}")


if __name__ == "__main__":
    main()
