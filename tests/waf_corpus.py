"""A developer's conversation with the hazards a web application firewall reads in text.

Shared by ``test_markers.py`` (the package's framing and cuts around this text, no
firewall) and ``test_waf_crs.py`` (the same sessions behind real ModSecurity + CRS).

Each piece passes ModSecurity with the OWASP CRS at paranoia level 1 on its own
(``test_waf_crs.py`` checks that first), yet sits next to what the package writes in a way
the rules notice:

- messages open with English words that are command names when they start a line:
  ``Set``, ``Start``, ``Find``, ``Sort``, ``Type``, ``Timeout``… (rules 932110/932115);
- messages end with words that read as JavaScript before a bracket (``stop``, ``this``,
  ``laptop``, ``window``: 941370) or as SQL before a parenthesis (``user``: 942190);
- Python classes say ``(self)`` (941370 once any ``]`` follows in the same string);
- logs and listings long enough to be cut, with long lines and words a cut in the middle
  would turn into commands (``details`` → ``ls``, ``reset`` → ``set``).

Two conversations, so each piece's hazards can be met without the conversation tripping
a rule by itself: :func:`tool_turns` calls a tool (the emulator's ``[[tool …]]`` directive
has a ``]``, so nothing in it says ``(self)``); :func:`code_turns` pastes classes and no
``]`` at all.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

__all__ = ["ASSISTANT_OPENINGS", "COMMAND_WORDS", "ENDINGS", "HAZARDS", "OPENINGS",
           "class_code", "code_turns", "hazards", "log", "reply", "tool_result", "tool_turns"]

# -- what the rules read (OWASP CRS 3.3.4, paranoia level 1, as Debian 12 ships it) --------

COMMAND_WORDS = frozenset({
    # Windows commands (932110/932115: any case) that are English words.
    "start", "set", "find", "sort", "type", "timeout", "path", "print", "echo", "format",
    "date", "replace", "more", "call", "copy", "tree", "label", "mode", "net", "debug",
    "rename", "expand", "shift", "prompt", "recover", "verify", "diff", "ping", "sleep",
    # Unix commands (932100/932105: lower case) that are English words.
    "cat", "file", "head", "less", "tail", "top", "who", "kill", "env", "export",
    "history", "id", "last", "time",
})
"""Words that start a line as a command name to the CRS (each is checked against the real
rules by ``test_waf_crs.py``): after a newline, ``Set the pool size`` is Windows ``set``."""

HAZARDS = {
    # A line ending one word after an HTTP method name: request smuggling.
    "921110": re.compile(r"(?:get|post|head|options|connect|put|delete|trace|track|patch|"
                         r"propfind|propatch|mkcol|copy|move|lock|unlock)\s+(?:/|\w)\S*"
                         r"(?:\s+http/\d|[\r\n])", re.I),
    # A command name starting a line (or following ; { | & or a backtick).
    "932100-932115": re.compile(r"[\n;{|&`][\s(,@'\"]*(\w+)"),
    # A JavaScript global before a bracket (941370 matches once a ] follows, anywhere).
    "941370": re.compile(r"(?:self|document|this|top|window)\s*(?:/\*|[\[)])"),
    "941370-close": re.compile(r"\]|\*/"),
    # SQL functions: user(, database(, schema( (942190, 942140).
    "942190": re.compile(r"(?:user|database|schema|current_user|connection_id)\s*\(", re.I),
    "942140": re.compile(r"(?:databas|db_nam)e\W*\(|schema\W*\(", re.I),
}
"""The parts of rules that read text around the package's framing, reduced to what a piece
of framing could complete. ``hazards(text)`` counts them."""


def hazards(text: str) -> dict[str, int]:
    """How often each of :data:`HAZARDS` occurs in ``text`` (line starts: only command
    words)."""
    out = {}
    for name, pattern in HAZARDS.items():
        if name == "932100-932115":
            out[name] = sum(1 for m in pattern.finditer(text) if m.group(1).lower() in
                            COMMAND_WORDS)
        else:
            out[name] = len(pattern.findall(text))
    return out

OPENINGS = [
    "Set the pool size to something sensible for four workers; this is what we run now.",
    "Start with the parser, it is the part I trust the least.",
    "Find out why the export writes the same invoice twice when two workers run at once.",
    "Sort these by amount and tell me which customers are overdue.",
    "Type hints are missing in half of this module; which ones matter most?",
    "Timeout errors again, this time from the ledger client.",
    "Print the totals per currency from this sample.",
    "Format this as a table for the weekly report, please.",
    "Replace the retry loop with something that honours Retry-After.",
    "Echo back the plan you suggested, but shorter.",
    "Date handling looks off in the monthly report.",
    "Compare these two runs and tell me what changed between them.",
    "Help me understand where the time goes in the nightly export.",
]

ASSISTANT_OPENINGS = [
    "Start by checking the pool settings.", "Set the batch size lower first.",
    "Find the slow query in the log first.", "Sort order matters here.",
    "Timeout values this low will hurt you.", "Path handling looks right to me.",
    "Type annotations would have caught this.", "Format aside, the logic is fine.",
    "Date parsing is the likely culprit.",
]

ENDINGS = [
    "Tell me when I should stop", "Is it safe to do this", "It runs fine on my laptop",
    "Or should we ask the user", "The fix has to land in the maintenance window",
]

_WORDS = [
    "pipeline", "export", "billing", "invoice", "worker", "queue", "retry", "batch",
    "migration", "cache", "latency", "request", "response", "timeout", "session", "customer",
    "account", "ledger", "report", "nightly", "scheduler", "partition", "index", "column",
    "table", "query", "connection", "pool", "thread", "handler", "parser", "config", "deploy",
    "staging", "production", "rollback", "feature", "flag", "metric", "dashboard", "alert",
    "details", "reset", "preset", "dataset",
]
# How a paragraph opens: words no rule reads as a command at the start of a line (the
# corpus's own line starts must pass; the hazards are where the package cuts and frames).
_PARAGRAPH_STARTS = ("The", "Our", "Then", "Meanwhile", "Otherwise", "Overall")


def prose(r: random.Random, sentences: int) -> str:
    """Sentences of a paragraph; only its first word may start a line."""
    out = []
    for i in range(sentences):
        words = [r.choice(_WORDS) for _ in range(r.randint(8, 16))]
        first = r.choice(_PARAGRAPH_STARTS) if i == 0 else words[0].capitalize()
        out.append(" ".join([first, *words[1:]]) + r.choice([".", ".", "?"]))
    return " ".join(out)


def log(r: random.Random, lines: int) -> str:
    """Worker log lines; some long enough that a cut falls inside one."""
    out = []
    for _ in range(lines):
        level = r.choice(["INFO", "INFO", "WARNING", "ERROR"])
        msg = r.choice([
            f"processed batch {r.randint(1, 9999)} ({r.randint(10, 999)} rows) in "
            f"{r.randint(5, 2000)}ms",
            f"connection pool at {r.randint(1, 20)}/20, waiting {r.randint(0, 500)}ms",
            f"retrying ledger-api request, attempt {r.randint(1, 5)} of 5, status 503",
            f"cache miss for customer {r.randint(10000, 99999)}, loading details from the "
            f"primary after a reset of the preset dataset " + prose(r, r.randint(1, 4)),
            f"slow query took {r.uniform(0.5, 9):.2f}s on table invoices",
            f"wrote report {r.choice(_WORDS)}-{r.randint(1, 99)}.csv "
            f"({r.randint(1, 900)} KB)",
        ])
        out.append(f"2024-03-{r.randint(1, 28):02d}T{r.randint(0, 23):02d}:"
                   f"{r.randint(0, 59):02d}:{r.randint(0, 59):02d}Z {level} worker-"
                   f"{r.randint(1, 8)} billing.export: {msg}")
    return "\n".join(out)


def csv_rows(r: random.Random, rows: int) -> str:
    out = ["invoice_id,customer,amount,currency,status"]
    for _ in range(rows):
        out.append(f"INV-{r.randint(100000, 999999)},"
                   f"{r.choice(['Acme GmbH', 'Globex Ltd', 'Initech', 'Umbrella Corp'])},"
                   f"{r.uniform(10, 9000):.2f},{r.choice(['EUR', 'USD', 'GBP'])},"
                   f"{r.choice(['paid', 'open', 'overdue'])}")
    return "\n".join(out)


def function_code(r: random.Random) -> str:
    return f'''```py
import json
import logging

log = logging.getLogger(__name__)


def load_rows(source, *, batch_size={r.choice([100, 500, 1000])}):
    """Read the export file and group its rows into batches."""
    batches = []
    current = []
    with open(source, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                log.warning("skipping line %d of %s: %s", number, source, e)
                continue
            current.append(row)
            if len(current) >= batch_size:
                batches.append(current)
                current = []
    if current:
        batches.append(current)
    return batches
```'''


def class_code(r: random.Random) -> str:
    """A class whose methods say ``(self)``, and no ``]``."""
    name = r.choice(["Exporter", "LedgerClient", "BatchWriter"])
    return f'''```py
class {name}:
    """Writes one export file per batch."""

    def __init__(self, target, *, retries={r.randint(1, 5)}):
        self.target = target
        self.retries = retries
        self.handle = None

    def open(self):
        self.handle = open(self.target, "a", encoding="utf-8")
        return self

    def close(self):
        if self.handle is not None:
            self.handle.close()
            self.handle = None
```'''


def traceback_text(r: random.Random) -> str:
    return (f'Traceback (most recent call last):\n'
            f'  File "/srv/billing/app/jobs/export.py", line {r.randint(40, 200)}, in run\n'
            f'    rows = load_rows(source, batch_size=settings.batch_size)\n'
            f'  File "/usr/lib/python3.11/json/decoder.py", line 337, in decode\n'
            f'    obj, end = self.raw_decode(s, idx=_w(s, 0).end())\n'
            f"json.decoder.JSONDecodeError: Expecting ',' delimiter: line 1 column "
            f"{r.randint(10, 90)}")


def user_turn(r: random.Random, pieces: list[Callable[[random.Random], str]], *,
              tool: bool = False) -> str:
    body = r.choice(pieces)(r)
    if tool:        # the emulator's directive to call read_log (before any ending word)
        body += f'\n\n[[tool read_log {{"name": "worker-{r.randint(1, 8)}.log"}}]]'
    end = f"\n\n{r.choice(ENDINGS)}" if r.random() < 0.5 else ""
    return f"{r.choice(OPENINGS)}\n\n{body}\n\n{prose(r, r.randint(1, 3))}{end}"


def reply(r: random.Random) -> str:
    """An assistant's answer (what a script's model would say; the emulator answers too)."""
    paras = [f"{r.choice(ASSISTANT_OPENINGS)} {prose(r, r.randint(2, 5))}"]
    paras += [prose(r, r.randint(2, 5)) for _ in range(r.randint(1, 3))]
    if r.random() < 0.5:
        paras.append(r.choice(ENDINGS))
    return "\n\n".join(paras)


def tool_result(r: random.Random) -> str:
    """A long tool output: a log, a listing or a file, several KB."""
    kind = r.choice(["log", "log", "csv", "code"])
    if kind == "log":
        return log(r, r.randint(50, 110))
    if kind == "csv":
        return csv_rows(r, r.randint(80, 180))
    return "\n\n".join(function_code(r).strip("`").removeprefix("py\n")
                       for _ in range(r.randint(3, 5)))


def tool_turns(seed: int, turns: int) -> list[str]:
    """User messages of a conversation that reads logs with a tool (``read_log``)."""
    r = random.Random(seed)
    pieces = [function_code, traceback_text, csv_rows_piece, log_piece]
    return [user_turn(r, pieces, tool=r.random() < 0.5) for _ in range(turns)]


def code_turns(seed: int, turns: int) -> list[str]:
    """User messages of a conversation about classes (``(self)``, no ``]``, no tools)."""
    r = random.Random(seed)
    return [user_turn(r, [class_code, traceback_text, log_piece]) for _ in range(turns)]


def csv_rows_piece(r: random.Random) -> str:
    return csv_rows(r, r.randint(8, 20))


def log_piece(r: random.Random) -> str:
    return log(r, r.randint(6, 14))
