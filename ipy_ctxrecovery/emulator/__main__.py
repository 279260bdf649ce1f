"""Command line: run the emulator standalone (``python -m ipy_ctxrecovery.emulator``)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from ..errors import ConfigError
from ..settings import SIZE_FORMS, parse_size, seconds_arg
from . import quirks, roles
from .faults import BODY_LIMIT_STYLES, WAF_STYLES
from .replies import CONTINUATION_OPENERS, CONTINUATION_REPEATS
from .server import PREFILL_MODES, Emulator

PROG = "ipy-ctxrecovery-emulator"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, no usage dump: what was wrong and where to look.
        self.exit(2, f"{self.prog}: error: {message.rstrip('.')}; see --help.\n")


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid size; expected {SIZE_FORMS}") from None


def _tokens(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens ≥ 1")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0–65535)")
    return value


def _repeat(text: str | None) -> int | str:
    """``--continuation-repeat``: a number of characters, or a named repeat (0 when not given)."""
    if text is None:
        return 0
    return int(text) if text.isdigit() else text


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Run the ipy_ctxrecovery emulator: a local OpenAI "
                "(/v1/chat/completions, /v1/responses) and Anthropic (/v1/messages) API with faults.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8765, help="port (0 = any free port)")
    p.add_argument("--context-window", type=_tokens, default=8192, metavar="TOKENS")
    p.add_argument("--max-output-tokens", type=_tokens, default=None, metavar="TOKENS")
    p.add_argument("--max-body", type=_size, default=None, metavar="SIZE",
                   help="answer 413 above this body size, e.g. 256KB")
    p.add_argument("--body-limit-style", choices=BODY_LIMIT_STYLES, default="nginx")
    p.add_argument("--waf-over", type=_size, default=None, metavar="SIZE",
                   help="answer a WAF 403 above this body size")
    p.add_argument("--waf-style", choices=WAF_STYLES, default="cloudflare")
    p.add_argument("--drop-over", type=_size, default=None, metavar="SIZE",
                   help="drop the connection above this body size")
    p.add_argument("--latency", type=seconds_arg, default=0.0, metavar="SECONDS")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require this key (Authorization: Bearer / x-api-key)")
    p.add_argument("--token", nargs="?", const=True, default=None, metavar="TOKEN",
                   help="require this token (X-Emulator-Token header, or as the API key) on "
                        "every request; without TOKEN one is generated and printed. Off by "
                        "default, so curl works as is; anyone on this host can then call it")
    p.add_argument("--max-request-body", type=_size, default=None, metavar="SIZE",
                   help="answer 413 without reading bodies over this size (default 32MB)")
    p.add_argument("--alternation", choices=roles.STYLES, default=None,
                   help="reject requests whose roles do not alternate, as this server does")
    p.add_argument("--prefill", choices=PREFILL_MODES, default="continue",
                   help="continue or reject a final assistant turn on /v1/messages")
    p.add_argument("--continuation-repeat", default=None, metavar="N|" +
                   "|".join(CONTINUATION_REPEATS),
                   help="what an answer to the continuation prompt repeats first: N "
                        "characters, the line, the fence, or a restart of the answer")
    p.add_argument("--continuation-opener", choices=CONTINUATION_OPENERS, default=None,
                   help="write a meta opener, or echo the continuation prompt, before "
                        "the text of an answer to the continuation prompt")
    for flags, options in quirks.arguments():
        p.add_argument(*flags, **options)
    p.add_argument("--quiet", action="store_true", help="do not print one line per request")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, serve until Ctrl-C or SIGTERM; exit 2 on bad values."""
    args = build_parser().parse_args(argv)
    try:
        emu = Emulator(
            context_window=args.context_window, max_output_tokens=args.max_output_tokens,
            max_body=args.max_body, body_limit_style=args.body_limit_style,
            waf_over=args.waf_over, waf_style=args.waf_style, drop_over=args.drop_over,
            latency=args.latency, api_key=args.api_key, host=args.host, port=args.port,
            log=None if args.quiet else (lambda line: print(line, flush=True)),
            token=args.token, **({"max_request_body": args.max_request_body}
                                 if args.max_request_body else {}),
            alternation=args.alternation, prefill=args.prefill,
            continuation_opener=args.continuation_opener,
            continuation_repeat=_repeat(args.continuation_repeat),
            **{q.name: getattr(args, q.name) for q in quirks.QUIRKS
               if getattr(args, q.name) is not None},
        )
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        emu.start()
    except OSError as e:
        print(f"{PROG}: error: cannot listen on {args.host}:{args.port} ({e.strerror or e}); "
              "choose another --port.", file=sys.stderr)
        return 1
    stop = threading.Event()

    def _on_term(signum: int, frame: object) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, _on_term)
    print(f"OpenAI base URL:    {emu.openai_base_url}", flush=True)
    print(f"Anthropic base URL: {emu.anthropic_base_url}", flush=True)
    if emu.token:
        print(f"Token:              {emu.token} (send it as the X-Emulator-Token header "
              "or as the API key)", flush=True)
    print("Press Ctrl-C to stop.", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        emu.close()
        signal.signal(signal.SIGTERM, previous)
    print("emulator stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
