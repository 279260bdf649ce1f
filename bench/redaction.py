"""Benchmark: masking secrets before text is stored — ours against detect-secrets' scanner.

Run: ``python bench/redaction.py`` (``--lines 20000``, ``--sample 300``).

The text is a tool result of ``--lines`` lines of ordinary code and prose with one planted
secret every 1,000 lines. It times, with ``time.perf_counter``:

* ``redaction.mask_secrets`` on the whole text (too large for its cache): detect-secrets'
  plugin patterns run only on candidate lines;
* detect-secrets' own adhoc scanner (``detect_secrets.core.scan.scan_line`` under
  ``default_settings()``) on ``--sample`` lines, scaled to the whole text, and how many
  findings it reports per line of that ordinary text (its entropy plugins flag words).

It prints ratios, never verdicts.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from ipy_ctxrecovery.redaction import MASK, mask_secrets

PLANTED = ("ghp_0123456789abcdefghijABCDEFGHIJ012345",
           "DB_PASSWORD=hunter2-Xyzzy-42",
           "postgres://admin:S3cretPassw0rd-91@db.internal:5432/app")


def make_text(lines: int) -> list[str]:
    out = []
    for i in range(lines):
        if i % 1000 == 500:
            out.append(f"    config[{i}] = {PLANTED[(i // 1000) % len(PLANTED)]!r}")
        elif i % 3 == 0:
            out.append(f"    total_{i} = compute(values[{i}], scale=0.5)  # running sum")
        elif i % 3 == 1:
            out.append(f"The report for step {i} shows the expected trend in the data.")
        else:
            out.append(f"def handler_{i}(request, user: str, retries: int = 3) -> dict:")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--sample", type=int, default=300)
    args = parser.parse_args(argv)
    lines = make_text(args.lines)
    text = "\n".join(lines)
    mask_secrets("warm up")  # detect-secrets' one-time import

    start = time.perf_counter()
    masked = mask_secrets(text)
    ours = time.perf_counter() - start
    planted = sum(1 for line in lines if "config[" in line)

    from detect_secrets.core.scan import scan_line
    from detect_secrets.settings import default_settings

    sample = lines[:args.sample]
    with default_settings():
        start = time.perf_counter()
        findings = sum(len(list(scan_line(line))) for line in sample)
        theirs = (time.perf_counter() - start) * len(lines) / len(sample)
    print(f"text: {len(lines):,} lines, {len(text):,} chars, {planted} planted secrets, "
          f"{masked.count(MASK)} masked")
    print(f"ours: {ours * 1000:.0f} ms for the whole text "
          f"({ours / len(text) * 1e9:.0f} ns/char)")
    print(f"detect-secrets scan_line: {theirs * 1000:.0f} ms scaled to the whole text, "
          f"{findings / len(sample):.1f} findings per line of ordinary text")
    print(f"ratio redaction scan_line/ours: {theirs / ours:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
