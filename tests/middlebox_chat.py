"""Long conversations through a real middlebox: the package's session, or the bare SDK.

Shared by ``tests/test_middleboxes.py`` (which asserts on each turn as it comes) and
``bench/middleboxes.py`` (which prints the figures of whole runs). Both drive the real
openai/anthropic SDK clients with their default settings (retries included) at the
middlebox's URL — through its forward proxy for Squid — with the emulator behind it.

A turn is a ``[turn i]`` marker and plain English prose: text no WAF rule should take for
an attack, so that a block is about size unless a test plants content on purpose.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
from middleboxes import Middlebox

from ipy_ctxrecovery import ChatError, ChatSession, Emulator, Settings
from ipy_ctxrecovery.core.history import Role

WIRES = ("openai", "anthropic")
MODELS = {"openai": "openai:emulator", "anthropic": "anthropic:emulator"}
# A real model's window (tokens) is far above these limits; said so, the session needs no
# probe of the emulator's own, and only the middlebox limits the conversation.
WINDOW = 200_000
TIMEOUT = 60.0
MAX_TOKENS = 256
# A message CRS 3.3 blocks at paranoia level 1 for what it says, whatever its size: SQL
# injection found by libinjection (rule 942100, a critical match: 5 points, the blocking
# threshold). Planted early (before any limit) and late (the history pressing on it).
SQL_INJECTION = "My login form breaks when a visitor types ' OR 1=1 -- as the user name. Why?"
PLANTED_EARLY, PLANTED_LATE = 3, 30

_NOUNS = ("garden", "river", "window", "teacher", "library", "harbor", "meadow", "kitchen",
          "painter", "village", "lantern", "orchard", "bridge", "valley", "student", "market")
_VERBS = ("watches", "paints", "remembers", "follows", "describes", "visits", "admires",
          "imagines", "greets", "collects", "measures", "notices")
_ADJECTIVES = ("quiet", "bright", "narrow", "gentle", "golden", "distant", "patient",
               "humble", "cheerful", "ancient", "careful", "open")


def prose(n: int, seed: int) -> str:
    """About ``n`` characters of deterministic English sentences (a small LCG)."""
    state = seed * 2654435761 % 2**32 or 1
    out: list[str] = []
    size = 0
    while size < n:
        picks = []
        for _ in range(5):
            state = (1103515245 * state + 12345) % 2**31
            picks.append(state >> 8)
        sentence = (f"The {_ADJECTIVES[picks[0] % 12]} {_NOUNS[picks[1] % 16]} "
                    f"{_VERBS[picks[2] % 12]} the {_ADJECTIVES[picks[3] % 12]} "
                    f"{_NOUNS[picks[4] % 16]} every morning.")
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)


def script(turns: int = 40, size: int = 6_000, *, planted: dict[int, str] | None = None
           ) -> list[str]:
    """The user turns: ``[turn i]`` and ~``size`` chars of prose; ``planted`` puts a text
    of the caller's (content a WAF blocks) before the prose of the given turns, which keep
    their size."""
    planted = planted or {}
    return [f"[turn {i}] " + (planted[i] + " " if i in planted else "") + prose(size, i)
            for i in range(turns)]


def sdk_client(wire: str, box: Middlebox, upstream: Emulator) -> Any:
    """The user's SDK client for the middlebox: its URL, and its proxy when it is one."""
    headers = upstream.token_headers
    if wire == "openai":
        http = openai.DefaultHttpxClient(proxy=box.proxy) if box.proxy else None
        return openai.OpenAI(base_url=box.url + "/v1", api_key="sk-test", timeout=TIMEOUT,
                             default_headers=headers, http_client=http)
    ahttp = anthropic.DefaultHttpxClient(proxy=box.proxy) if box.proxy else None
    return anthropic.Anthropic(base_url=box.url, api_key="sk-ant-test", timeout=TIMEOUT,
                               default_headers=headers, http_client=ahttp)


@dataclass(frozen=True)
class Turn:
    """One turn as it ended."""

    index: int
    answered: bool
    error: str | None
    learned_cap: int | None     # the session's learned cap after the turn (None: bare SDK)
    largest_passed: int         # the largest POST body the upstream answered 200, so far


def largest_passed(upstream: Emulator, since: int = 0) -> int:
    """The largest POST body that reached the upstream and was answered (records from
    ``since`` on): proof of what the middlebox lets through."""
    return max((r.body_bytes for r in upstream.requests[since:]
                if r.method == "POST" and r.status == 200), default=0)


def session_turns(session: ChatSession, texts: Sequence[str], upstream: Emulator
                  ) -> Iterator[Turn]:
    """Send each text through ``session``; yield each turn as it ends."""
    since = len(upstream.requests)
    for i, text in enumerate(texts):
        try:
            session.send(text, max_tokens=MAX_TOKENS)
            answered, error = True, None
        except ChatError as e:
            answered, error = False, str(e)
        yield Turn(i, answered, error, session.caps.learned, largest_passed(upstream, since))


@contextlib.contextmanager
def new_session(wire: str, box: Middlebox, upstream: Emulator, name: str
                ) -> Iterator[ChatSession]:
    """A session on the user's SDK client for the middlebox; the session and the client
    (the user's, which the session never closes) are closed after."""
    client = sdk_client(wire, box, upstream)
    try:
        session = ChatSession(MODELS[wire], client=client,
                              settings=Settings(context_window=WINDOW), builtin_tools=False,
                              name=name)
        try:
            yield session
        finally:
            session.close()
    finally:
        client.close()


def user_texts(session: ChatSession) -> list[str]:
    return [m.text for m in session.transcript if m.role is Role.USER]


def bare_turns(wire: str, box: Middlebox, upstream: Emulator, texts: Sequence[str]
               ) -> Iterator[Turn]:
    """The bare SDK: the whole growing history resent every turn; a failed turn's message
    is taken back (as a chat UI shows an error and keeps nothing), the turn is lost."""
    since = len(upstream.requests)
    client = sdk_client(wire, box, upstream)
    history: list[dict[str, str]] = []
    try:
        for i, text in enumerate(texts):
            history.append({"role": "user", "content": text})
            try:
                if wire == "openai":
                    reply = client.chat.completions.create(model="emulator", messages=history,
                                                           max_tokens=MAX_TOKENS)
                    answer = reply.choices[0].message.content or ""
                else:
                    message = client.messages.create(model="emulator", messages=history,
                                                      max_tokens=MAX_TOKENS)
                    answer = "".join(getattr(b, "text", "") for b in message.content)
                history.append({"role": "assistant", "content": answer})
                yield Turn(i, True, None, None, largest_passed(upstream, since))
            except (openai.APIError, anthropic.APIError) as e:
                history.pop()
                said = " ".join(str(e).split())     # an HTML error page, on one line
                yield Turn(i, False, f"{type(e).__name__}: {said}"[:300], None,
                           largest_passed(upstream, since))
    finally:
        client.close()
