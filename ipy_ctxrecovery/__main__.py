"""``python -m ipy_ctxrecovery COMMAND``: the package's commands (``quickstart``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: python -m ipy_ctxrecovery quickstart [-o PATH]

  quickstart   run notebooks/00_quickstart.ipynb on the built-in emulator (no API key),
               show its story here, and write the executed notebook to open
               (python -m ipy_ctxrecovery quickstart --help for the options)

The emulator on its own: python -m ipy_ctxrecovery.emulator --help"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if args[0] == "quickstart":
        from .notebook.quickstart import main as quickstart

        return quickstart(args[1:])
    print(f"python -m ipy_ctxrecovery: no command {args[0]!r}; the one there is: quickstart.",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
