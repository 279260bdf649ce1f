"""Real ModSecurity + OWASP CRS in front of the emulator: the package's own requests pass.

Apache 2 with ``libapache2-mod-security2`` and Debian's ``modsecurity-crs`` (3.3, paranoia
level 1, ``SecRuleEngine On``, JSON bodies parsed as Debian's recommended config does)
reverse-proxies to the emulator. Compacting sessions through the real openai and
anthropic SDKs, on the developer's conversation of ``waf_corpus.py`` (each piece of it
passes the rules on its own), must never have a request blocked: not a summary request,
not a turn carrying a preview, a one-liner or a summary. Which rule fired, and on what,
is read from ModSecurity's audit log when one is.

Needs ``apache2``, ``libapache2-mod-security2`` and ``modsecurity-crs`` (``.ci/run``
installs them). Locally the tests skip with the reason when they are absent; under
``CI=true`` they fail instead.

The starter below is local to this module; it should move onto the shared
``tests/middleboxes.py`` harness (``start("modsec", upstream, ...)``) once that lands.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import waf_corpus as corpus
from needs import unavailable

from ipy_ctxrecovery import ChatError, ChatSession, Emulator, Settings
from ipy_ctxrecovery.core import prompts

pytestmark = pytest.mark.modsec

APACHE = Path("/usr/sbin/apache2")
MODULES = Path("/usr/lib/apache2/modules")
CRS_LOAD = Path("/usr/share/modsecurity-crs/owasp-crs.load")
RECOMMENDED = Path("/etc/modsecurity/modsecurity.conf-recommended")
UNICODE_MAP = Path("/etc/modsecurity/unicode.mapping")
NEEDED = (APACHE, MODULES / "mod_security2.so", MODULES / "mod_unique_id.so",
          MODULES / "mod_proxy_http.so", CRS_LOAD, RECOMMENDED, UNICODE_MAP)
START_TIMEOUT = 20.0
TIMEOUT = 30.0
SESSION_HEADER = "X-Test-Session"
SUMMARIZER_MARK = prompts.SUMMARIZE_SYSTEM_PROMPT.split("\n", 1)[0][:48]
TURNS = 24


# -- a local Apache + ModSecurity + CRS (to move onto tests/middleboxes.py) -------------------

@dataclass
class Blocked:
    """One request ModSecurity denied: the rules that fired (id, message, matched data)."""

    session: str
    summary: bool
    rules: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass
class ModSec:
    url: str
    pid: int
    access_log: Path
    audit_log: Path
    proc: subprocess.Popen[bytes]

    def requests(self) -> list[tuple[int, str]]:
        """(status, session header) of every request Apache answered, in order."""
        out = []
        if self.access_log.exists():
            for line in self.access_log.read_text(errors="replace").splitlines():
                status, _, session = line.partition(" ")
                out.append((int(status), session))
        return out

    def blocked(self) -> list[Blocked]:
        """The requests denied with 403, from the audit log."""
        text = self.audit_log.read_text(errors="replace") if self.audit_log.exists() else ""
        out = []
        for entry in re.split(r"^--[0-9a-f]+-A--$", text, flags=re.M)[1:]:
            if not re.search(r"^HTTP/1\.\d 403", entry, re.M):
                continue
            session = re.search(rf"^{SESSION_HEADER}: (.*)$", entry, re.M | re.I)
            rules = [(m[1], m[2] or "", m[3] or "") for m in re.finditer(
                r'\[id "(\d+)"\](?:.*?\[msg "([^"]*)"\])?(?:.*?\[data "((?:[^"\\]|\\.)*)"\])?',
                entry) if m[1] not in ("949110", "980130")]
            out.append(Blocked(session[1].strip() if session else "", SUMMARIZER_MARK in entry,
                               rules))
        return out

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=TIMEOUT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_modsec(upstream: str, *, workdir: Path) -> ModSec:
    """Apache in the foreground (its own ServerRoot, stopped by PID) reverse-proxying to
    ``upstream`` behind ModSecurity with Debian's recommended config (engine On) and CRS."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("tmp", "data"):
        (workdir / name).mkdir(exist_ok=True)
        os.chmod(workdir / name, 0o777)             # Apache's children run as nobody
    audit, access = workdir / "audit.log", workdir / "access.log"
    conf = RECOMMENDED.read_text()
    for pattern, value in ((r"^SecRuleEngine .*$", "SecRuleEngine On"),
                           (r"^SecAuditLog .*$", f"SecAuditLog {audit}"),
                           (r"^SecAuditLogParts .*$", "SecAuditLogParts ABCFHZ"),
                           (r"^SecTmpDir .*$", f"SecTmpDir {workdir / 'tmp'}"),
                           (r"^SecDataDir .*$", f"SecDataDir {workdir / 'data'}"),
                           (r"^SecUnicodeMapFile unicode\.mapping",
                            f"SecUnicodeMapFile {UNICODE_MAP}")):
        conf = re.sub(pattern, value, conf, flags=re.M)
    (workdir / "modsecurity.conf").write_text(conf)
    port = _free_port()
    user = "User nobody\nGroup nogroup\n" if os.geteuid() == 0 else ""
    modules = "\n".join(f"LoadModule {name}_module {MODULES}/mod_{name}.so" for name in (
        "mpm_event", "authz_core", "unique_id", "security2", "proxy", "proxy_http"))
    (workdir / "httpd.conf").write_text(f"""ServerRoot {workdir}
DefaultRuntimeDir {workdir}
PidFile {workdir}/apache.pid
Listen 127.0.0.1:{port}
ServerName localhost
{user}{modules}
ErrorLog {workdir}/error.log
LogLevel warn
LogFormat "%>s %{{{SESSION_HEADER}}}i" waf
CustomLog {access} waf
SecDataDir {workdir / 'data'}
Include {workdir}/modsecurity.conf
Include {CRS_LOAD}
ProxyPass / {upstream.rstrip('/')}/
ProxyPassReverse / {upstream.rstrip('/')}/
""")
    log = workdir / "stdout.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(APACHE), "-f", str(workdir / "httpd.conf"), "-D",
                                 "FOREGROUND"], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            errors = (workdir / "error.log").read_text() if (workdir / "error.log").exists() \
                else ""
            raise RuntimeError(f"apache2 exited with {proc.returncode}: "
                               f"{log.read_text(errors='replace')}{errors}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"apache2 did not listen within {START_TIMEOUT}s") from None
            time.sleep(0.05)
    # A name, not 127.0.0.1: a numeric Host header alone scores 3 of the 5 points that block.
    return ModSec(f"http://localhost:{port}", proc.pid, access, audit, proc)


# -- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def modsec_installed() -> None:
    missing = [str(p) for p in NEEDED if not p.exists()]
    if missing:
        unavailable(f"ModSecurity + CRS are not installed ({', '.join(missing)} missing: "
                    "apt-get install apache2 libapache2-mod-security2 modsecurity-crs)")


@pytest.fixture(scope="module")
def waf(modsec_installed: None, upstream: Emulator,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModSec]:
    box = start_modsec(upstream.url, workdir=tmp_path_factory.mktemp("modsec"))
    try:
        yield box
    finally:
        box.stop()


def _passes(waf: ModSec, text: str) -> bool:
    """Whether ModSecurity lets ``text`` through as a chat message (the emulator then
    refuses it for want of its token: anything but 403 passed the firewall)."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
    request = urllib.request.Request(f"{waf.url}/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT):
            return True
    except urllib.error.HTTPError as e:
        return e.code != 403


# -- the rules, as the unit tests assume them -------------------------------------------------

def test_the_corpus_passes_on_its_own_and_the_command_words_do_not(waf: ModSec) -> None:
    """The corpus is clean by itself, so a block in a session is the package's; and every
    word ``test_markers.py`` treats as a command is one to these rules, while the words
    the package starts its lines with are not."""
    r = random.Random(1)
    pieces = [*corpus.tool_turns(0, TURNS), *corpus.code_turns(0, TURNS),
              *(corpus.tool_result(r) for _ in range(20)), *(corpus.reply(r) for _ in range(20))]
    blocked = [p[:80] for p in pieces if not _passes(waf, p)]
    assert blocked == []
    assert [w for w in sorted(corpus.COMMAND_WORDS) if _passes(waf, f"x\n{w} the plan")] == []
    ours = ["Message", "Tool", "…", "—", "Additional", "You", "Your", "##", "In"]
    assert [w for w in ours if not _passes(waf, f"x\n{w} the plan")] == []


# -- compacting sessions ----------------------------------------------------------------------

def _client(wire: str, waf: ModSec, emu: Emulator, session: str) -> Any:
    headers = {**emu.token_headers, SESSION_HEADER: session}
    if wire == "openai":
        return openai.OpenAI(base_url=f"{waf.url}/v1", api_key="sk-test-0123456789abcdef",
                             max_retries=0, default_headers=headers, timeout=TIMEOUT)
    return anthropic.Anthropic(base_url=waf.url, api_key="sk-ant-test-0123456789abcdef",
                               max_retries=0, default_headers=headers, timeout=TIMEOUT)


@pytest.mark.parametrize("kind", ["tools", "classes"])
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_a_compacting_session_is_never_blocked(wire: str, kind: str, waf: ModSec,
                                               upstream: Emulator) -> None:
    name = f"waf-{wire}-{kind}"
    r = random.Random(f"{wire}-{kind}")

    def read_log(name: str) -> str:
        """Read a worker's log.

        Args:
            name: the log's name.
        """
        return corpus.tool_result(r)

    tools = kind == "tools"
    texts = corpus.tool_turns(1, TURNS) if tools else corpus.code_turns(1, TURNS)
    model = "gpt-4o-mini" if wire == "openai" else "claude-3-5-haiku-latest"
    session = ChatSession(f"{wire}:{model}", client=_client(wire, waf, upstream, name),
                          settings=Settings(context_window=6_000 if tools else 3_000),
                          tools=[read_log] if tools else [], builtin_tools=False, name=name)
    failed: list[str] = []
    try:
        for i, text in enumerate(texts):
            try:
                if not session.send(text, stream=i % 2 == 0).text:
                    failed.append(f"turn {i}: an empty answer")
            except ChatError as e:
                failed.append(f"turn {i}: {e}")
    finally:
        session.close()

    def blocks() -> str:
        return "; ".join(f"{'summary' if b.summary else 'turn'}: "
                         + ", ".join(f"{rule} {data[:120]}" for rule, _, data in b.rules)
                         for b in waf.blocked() if b.session == name)

    statuses = [status for status, who in waf.requests() if who == name]
    summaries = [rec for rec in upstream.requests if rec.header(SESSION_HEADER) == name
                 and rec.body is not None and SUMMARIZER_MARK in json.dumps(rec.body,
                                                                           ensure_ascii=False)]
    assert statuses.count(403) == 0, blocks()
    assert failed == []
    assert len(summaries) >= 2              # the history was compacted, by the model, twice


def test_the_users_pinned_rules_and_kept_messages_pass(waf: ModSec) -> None:
    """The user's rules cut out of the middle of a line ("… Sort these by amount from now
    on.") and messages ending one word after a method name ("never put it"), pinned and
    kept after a summary (``core/pins.py``), merged as the OpenAI adapter sends them."""
    from ipy_ctxrecovery.core import pins
    from ipy_ctxrecovery.core.history import Message
    from ipy_ctxrecovery.providers.openai import to_wire

    said = [f"Thanks. {opening.rstrip('.')} from now on. And never put it"
            for opening in corpus.OPENINGS]
    assert [s[:60] for s in said if not _passes(waf, s)] == []      # each passes alone
    rules = [r for text in said for r in pins.rules_in(text)]
    assert len(rules) >= len(said)
    pinned, words = pins.pinned_message(rules), pins.words_message(said)
    assert pinned is not None and words is not None
    summary = Message.user(f"{prompts.summary_header(12)}\n## Current task state\n- going on")
    merged = to_wire([pinned, summary, words, Message.user(said[0])])
    assert len(merged) == 1
    assert _passes(waf, merged[0]["content"])
