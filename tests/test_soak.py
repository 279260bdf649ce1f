"""Seeded soak (issue 12, "done when"): many sessions × turns against the emulator with
random faults of every kind it has, both wires, tools; invariants checked on every
request the emulator receives and after every turn.

Every request: it carries the turn's user request (summarizer requests aside); its tool
calls and results pair up; its body is below the smallest body a proxy already rejected
for size (what the session learned). Every turn: it answers, or raises ``ChatError`` with
one sentence and the history exactly as before — nothing else. Every session: resumed
from disk, its transcript holds every message said (0 lost) and its history is the one
in memory; no file under the state directory holds the API key the session sent.

Normal run: a bounded run (about a minute). The long run: ``IPY_CTXRECOVERY_SOAK=long``
(``IPY_CTXRECOVERY_SOAK_SESSIONS`` / ``_TURNS`` / ``_SEED`` override the sizes); with
``IPY_CTXRECOVERY_SOAK_REPORT=path`` the figures are written there as JSON.
"""

from __future__ import annotations

import json
import os
import random
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.events import Event, Recovered
from ipy_ctxrecovery.core.history import Role
from ipy_ctxrecovery.emulator import Emulator
from ipy_ctxrecovery.errors import ChatError
from ipy_ctxrecovery.providers import make_provider

LONG = os.environ.get("IPY_CTXRECOVERY_SOAK", "") == "long"
SESSIONS = int(os.environ.get("IPY_CTXRECOVERY_SOAK_SESSIONS", 24 if LONG else 8))
TURNS = int(os.environ.get("IPY_CTXRECOVERY_SOAK_TURNS", 60 if LONG else 16))
SEED = int(os.environ.get("IPY_CTXRECOVERY_SOAK_SEED", 20261130))
PLANTED_KEY = "sk-soak-PLANTED-0123456789abcdefABCDEF"

PROVIDER_FAULTS = ["429", "500", "503", "529", "stream-error", "stream-cut", "drop"]
MIDDLEBOX_FAULTS = ["413:nginx", "413:cloudflare", "413:aws", "413:envoy", "waf", "waf:bare"]
SIZE_REJECTIONS = ("413", "waf")
MIDDLEBOX_MIN_HISTORY = 24 * 1024


def fetch_log(n: int, seed: int = 0) -> str:
    """Return n characters of the service log.

    Args:
        n: how many characters.
        seed: which part of the log.
    """
    rng = random.Random(seed)
    lines = []
    size = 0
    while size < n:
        line = f"{rng.randrange(10**6):06d} INFO worker-{rng.randrange(9)} step {size} ok\n"
        lines.append(line)
        size += len(line)
    return "".join(lines)[:n]


@dataclass
class Figures:
    sessions: int = 0
    turns: int = 0
    answered: int = 0
    surfaced: int = 0
    requests: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    recoveries: int = 0
    """Turns that met at least one fault or limit and were still answered."""
    ladder_recoveries: int = 0
    messages_lost: int = 0
    secrets_on_disk: int = 0
    surfaced_kinds: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"seed": SEED, "sessions": self.sessions, "turns": self.turns,
                "answered": self.answered, "surfaced_errors": self.surfaced,
                "surfaced_by_kind": dict(self.surfaced_kinds), "requests": self.requests,
                "faults_injected": sum(self.faults.values()), "faults_by_kind": dict(self.faults),
                "recoveries": self.recoveries, "ladder_recoveries": self.ladder_recoveries,
                "messages_lost": self.messages_lost,
                "secrets_found_on_disk": self.secrets_on_disk}


# -- request invariants ------------------------------------------------------------------------

def _pairing_openai(messages: list[dict[str, Any]]) -> str | None:
    i = 0
    first = next((m for m in messages if m.get("role") not in ("system", "developer")), None)
    if first is not None and first.get("role") != "user":
        return f"first message is {first.get('role')}"
    while i < len(messages):
        m = messages[i]
        if m.get("role") == "tool":
            return f"message {i}: tool result without its call"
        if m.get("role") == "assistant" and m.get("tool_calls"):
            wanted = sorted(c["id"] for c in m["tool_calls"])
            j = i + 1
            got = []
            while j < len(messages) and messages[j].get("role") == "tool":
                got.append(messages[j]["tool_call_id"])
                j += 1
            if sorted(got) != wanted:
                return f"message {i}: calls {wanted} answered by {got}"
            i = j
            continue
        i += 1
    return None


def _pairing_anthropic(messages: list[dict[str, Any]]) -> str | None:
    if messages and messages[0].get("role") != "user" and not _opens_with_compaction(messages[0]):
        return "first message is not user"
    for i, m in enumerate(messages):
        blocks = m.get("content") if isinstance(m.get("content"), list) else []
        calls = sorted(b["id"] for b in blocks if b.get("type") == "tool_use")
        results = sorted(b["tool_use_id"] for b in blocks if b.get("type") == "tool_result")
        previous = messages[i - 1].get("content") if i else []
        wanted = sorted(b["id"] for b in previous if isinstance(previous, list)
                        and b.get("type") == "tool_use") if i else []
        if results and results != wanted:
            return f"message {i}: results {results} for calls {wanted}"
        if calls:
            after = messages[i + 1].get("content") if i + 1 < len(messages) else []
            answered = sorted(b["tool_use_id"] for b in (after if isinstance(after, list) else [])
                              if b.get("type") == "tool_result")
            if answered != calls:
                return f"message {i}: calls {calls} answered by {answered}"
    return None


def _opens_with_compaction(message: dict[str, Any]) -> bool:
    """An assistant message opening with the server's compaction block (it stands for
    everything before it, so it may come first)."""
    content = message.get("content")
    return (message.get("role") == "assistant" and isinstance(content, list) and bool(content)
            and content[0].get("type") == "compaction")


def _is_summary_request(body: dict[str, Any]) -> bool:
    system = body.get("system")
    texts = [system] if isinstance(system, str) else []
    texts += [m.get("content") for m in body.get("messages", []) if m.get("role") == "system"]
    return any(isinstance(t, str) and "STRUCTURED SUMMARY" in t for t in texts)


def check_requests(records: list[Any], marker: str, smallest_rejected: int | None,
                   figures: Figures, largest_ok: int = 0) -> tuple[int | None, int]:
    """Check every request of one turn; returns the smallest size rejected so far and the
    largest size carried. A block page on a body no bigger than one carried is not about
    size (the session gives up on it without learning a cap), so it does not count."""
    for r in records:
        figures.requests += 1
        if r.fault:
            figures.faults[r.fault] += 1
        if smallest_rejected is not None:
            assert r.body_bytes < smallest_rejected, \
                f"a {r.body_bytes}-byte body sent after {smallest_rejected} bytes were rejected"
        if r.status == 200:
            largest_ok = max(largest_ok, r.body_bytes)
        if r.fault and r.fault.startswith(SIZE_REJECTIONS) \
                and (r.fault.startswith("413") or r.body_bytes > largest_ok):
            smallest_rejected = min(smallest_rejected or r.body_bytes, r.body_bytes)
        body = r.body
        if not isinstance(body, dict) or "messages" not in body:
            continue            # not read (a middlebox answered first) or not kept
        if _is_summary_request(body):
            continue
        raw = json.dumps(body, ensure_ascii=False)
        assert marker in raw, f"request without the turn's user request {marker}"
        # Anthropic's paths: /v1/messages and /v1/messages/count_tokens, with ``?beta=true``
        # on the beta resource.
        problem = (_pairing_anthropic(body["messages"]) if "/messages" in r.path
                   else _pairing_openai(body["messages"]))
        assert problem is None, problem
    return smallest_rejected, largest_ok


# -- one session ---------------------------------------------------------------------------------

def _user_text(rng: random.Random, marker: str, window: int) -> str:
    kind = rng.random()
    if kind < 0.35:
        return f"{marker} a short question about step {rng.randrange(100)}?"
    if kind < 0.6:
        # Up to about half the window: big enough to need recovery, never one that no
        # recovery could fit (those are the bad-input table's business).
        size = rng.randrange(1_000, window * 2)
        return f"{marker} please read this paste:\n" + ("lorem ipsum dolor " * size)[:size]
    if kind < 0.85:
        calls = " ".join(f'[[tool fetch_log {{"n": {rng.choice([800, 6_000, 30_000])}, '
                         f'"seed": {rng.randrange(99)}}}]]'
                         for _ in range(rng.choice([1, 1, 2, 3])))
        return f"{marker} look at the log {calls}"
    return f"{marker} explain at length [[words {rng.choice([120, 400, 900])}]]"


def run_session(index: int, rng: random.Random, figures: Figures) -> None:
    wire = "emulator" if index % 2 == 0 else "emulator:anthropic"
    limits = {
        "context_window": rng.choice([4096, 8192, 16_384]),
        "max_output_tokens": rng.choice([None, 600]),
        "max_body": rng.choice([None, None, "96KB", "256KB"]),
        "waf_over": rng.choice([None, None, None, "128KB"]),
        "drop_over": rng.choice([None, None, None, "600KB"]),
    }
    emu = Emulator(api_key=PLANTED_KEY, **limits)
    emu.__enter__()
    name = f"soak-{index}"
    try:
        provider = make_provider(wire, emulator=emu, max_retries=0)
        recovered: list[Event] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = ChatSession(provider=provider, name=name, tools=[fetch_log],
                            sleep=lambda seconds: None, system="You are terse.",
                            settings=Settings(turn_timeout=120),
                            on_event=lambda e: recovered.append(e)
                            if isinstance(e, Recovered) else None)
        said: list[str] = []
        smallest_rejected: int | None = None
        largest_ok = 0
        for turn in range(TURNS):
            marker = f"[s{index}t{turn}]"
            if rng.random() < 0.4:
                # A proxy rejects big bodies: its one-off faults only meet a big request
                # (one on a 1 KB body would teach a cap no conversation fits under).
                big = s.status().history_bytes >= MIDDLEBOX_MIN_HISTORY
                pool = MIDDLEBOX_FAULTS if big and rng.random() < 0.3 else PROVIDER_FAULTS
                for _ in range(rng.choice([1, 1, 2])):
                    fault = rng.choice(pool)
                    if fault == "429":
                        emu.fail_next(429, retry_after=rng.choice([0.0, 0.01]))
                    else:
                        emu.script(fault)
            text = _user_text(rng, marker, limits["context_window"])
            said.append(text)
            before = s.history
            figures.turns += 1
            try:
                s.send(text, stream=rng.random() < 0.7)
                figures.answered += 1
                assert s.history[-1].role is Role.ASSISTANT
                if any(r.status != 200 for r in emu.requests):
                    figures.recoveries += 1
            except ChatError as e:
                figures.surfaced += 1
                figures.surfaced_kinds[e.failure.kind.value] += 1
                assert "\n" not in str(e) and "Traceback" not in str(e), str(e)
                assert s.history == before, "a failed turn changed the history"
            smallest_rejected, largest_ok = check_requests(emu.requests, marker,
                                                           smallest_rejected, figures, largest_ok)
            emu.reset()
        figures.ladder_recoveries += len(recovered)
        history = s.history
        s.close()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resumed = ChatSession.resume(name, provider=make_provider(wire, emulator=emu))
        users = [m.text for m in resumed.transcript if m.role is Role.USER]
        figures.messages_lost += sum(1 for text in said if text not in users)
        assert users == said, "the transcript on disk lost or reordered what was said"
        assert resumed.history == history, "the history on disk is not the one in memory"
        resumed.close()
        figures.sessions += 1
    finally:
        emu.__exit__(None, None, None)


def _files_holding(root: Path, secret: str) -> list[Path]:
    needle = secret.encode()
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_seeded_soak(data_dir: Path) -> None:
    rng = random.Random(SEED)
    figures = Figures()
    for index in range(SESSIONS):
        run_session(index, rng, figures)
    figures.secrets_on_disk = len(_files_holding(data_dir, PLANTED_KEY))
    report = figures.as_dict()
    print("soak figures:", json.dumps(report, sort_keys=True))
    out = os.environ.get("IPY_CTXRECOVERY_SOAK_REPORT")
    if out:
        Path(out).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    assert figures.sessions == SESSIONS and figures.turns == SESSIONS * TURNS
    assert figures.messages_lost == 0 and figures.secrets_on_disk == 0
    # The run is only worth its figures if faults really happened and were recovered.
    assert sum(figures.faults.values()) >= SESSIONS * TURNS // 5
    assert figures.recoveries > 0 and figures.answered > figures.surfaced
