"""A ChatCLI-style baseline client: the blind recovery ladder the benchmarks compare against.

Built from ANCHORS.md ("ChatCLI") and SPEC §3, driving a server through the real openai
SDK (the same client settings as ours: SDK defaults). What it does, as ChatCLI does:

- microcompact by ChatCLI's rule: a tool result 2+ turns old and ≥ 3,000 chars becomes a
  head 2,000 + tail 500 preview; the 4-turn one-line summary needs ≥ 3,000 chars too, so it
  never fires on a preview (ANCHORS weakness 9);
- tool-result budget 200,000 chars per turn / 20,000 per result, previews head 4,000 +
  tail 1,000 whatever the limit (weakness 8; the "saved" file is not written here);
- size measured as content chars (weakness 5); LLM summary when they exceed
  ``min(window × 0.75 × 4, 0.7 × cap)`` with the target equal to the trigger (weakness 6)
  and the summarizer's input unbounded (weakness 7); a failed summary falls back to the
  emergency truncate;
- pre-flight only with a cap: above 85 % of it, compaction with ratio 0.40;
- on a recoverable failure the ladder level is the attempt number only (weakness 1):
  1 = pairing repair + halved budget (100,000 / 10,000) + assistant messages cut at 5,000;
  2 = system + last 10 non-system messages; 3 = system + last 4 + the SPEC's notice that
  says "summarized" whether or not anything was (weakness 2). Levels 2 and 3 drop leading
  non-user messages, so they can drop the user's request when the tail is a tool loop;
- payload failures: the SYSTEM NOTICE (once in the history), auto-cap 4 MB, and a learned
  cap of ¾ of the rejected body (ANCHORS: "when the rejected body size is known") —
  ``learn_cap=False`` turns that off;
- no use of the provider's numbers (no exact fit, no token calibration), no learned
  ``max_tokens`` ceiling.

The classifier is deliberately *generous*: it also knows ``context_length_exceeded`` and
"maximum context length" (the seed list alone misses the OpenAI wording — weakness 3 —
which would make the baseline lose every turn after the first overflow). So the figures
compare ladders, not classifiers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import openai

from ipy_ctxrecovery.core.history import (
    History,
    Message,
    Role,
    ToolCall,
    ToolResult,
    char_size,
    to_openai,
)
from ipy_ctxrecovery.core.pairing import repair_pairing
from ipy_ctxrecovery.core.prompts import COMPACTION_NOTICE, PAYLOAD_NOTICE, SUMMARIZE_SYSTEM_PROMPT

__all__ = ["ChatCLIBaseline", "classify"]

# ChatCLI's constants (ANCHORS.md / SPEC defaults), named here once.
TURN_BUDGET = 200_000
PER_RESULT_MAX = 20_000
BUDGET_HEAD, BUDGET_TAIL = 4_000, 1_000
MC_MIN, MC_HEAD, MC_TAIL = 3_000, 2_000, 500
MC_TRUNCATE_TURNS, MC_SUMMARIZE_TURNS = 2, 4
AGGRESSIVE_ASSISTANT_MAX = 5_000
EMERGENCY_KEEP, NUCLEAR_KEEP = 10, 4
MAX_ATTEMPTS = 3
CHAT_RATIO, PREFLIGHT_RATIO = 0.75, 0.40
CHARS_PER_TOKEN = 4
CAP_FRACTION, PREFLIGHT_FRACTION, LEARNED_FRACTION = 0.70, 0.85, 0.75
ASSUMED_CAP = 4 * 1024 * 1024
LIKELY_PAYLOAD_MIN = 500 * 1024
SUMMARY_KEEP_RECENT = 6
TRANSIENT_RETRIES = 2
MAX_TOOL_ROUNDS = 8

OVERFLOW_WORDS = ("context length exceeded", "prompt is too long", "request too large",
                  "max_tokens exceed", "input too long", "token limit",
                  # generous additions (see the module docstring)
                  "context_length_exceeded", "maximum context length")
PAYLOAD_WORDS = ("413", "payload too large", "request entity too large", "body too large",
                 "maximum request size")
WAF_WORDS = ("firewall", "waf", "security policy", "blocked by", "cloudflare", "cf-ray",
             "mod_security", "akamai", "proxy denied", "policy violation")


def classify(error: Exception, body_bytes: int) -> str:
    """ChatCLI-style substring classification: overflow | payload | waf | likely_payload |
    transient | other."""
    if isinstance(error, openai.APIStatusError):
        text = f"{error} {error.response.text}".lower()
        status = error.status_code
        if any(w in text for w in OVERFLOW_WORDS):
            return "overflow"
        if status == 413 or any(w in text for w in PAYLOAD_WORDS):
            return "payload"
        if status == 403 and any(w in text for w in WAF_WORDS):
            return "waf"
        if status in (408, 429) or status >= 500:
            return "transient"
        return "other"
    if isinstance(error, openai.APIConnectionError):
        return "likely_payload" if body_bytes > LIKELY_PAYLOAD_MIN else "transient"
    return "other"


@dataclass
class BaselineTurn:
    answered: bool
    text: str = ""
    error: str = ""


class ChatCLIBaseline:
    """One conversation, ChatCLI's way. ``history`` is mutated in place (as ChatCLI does)."""

    def __init__(self, client: openai.OpenAI, *, model: str, window_tokens: int,
                 tools: Mapping[str, Callable[..., str]], tool_specs: list[dict[str, Any]],
                 system: str | None = None, max_payload: int | None = None,
                 learn_cap: bool = True) -> None:
        self.client = client
        self.model = model
        self.window = window_tokens
        self.tools = dict(tools)
        self.tool_specs = tool_specs
        self.configured_cap = max_payload
        self.learned_cap: int | None = None
        self.assumed_cap: int | None = None
        self.learn_cap = learn_cap
        self.history: list[Message] = [Message.system(system)] if system else []
        self._results_seen = 0

    # -- sizes ------------------------------------------------------------------------------
    @property
    def cap(self) -> int | None:
        caps = [c for c in (self.configured_cap, self.learned_cap, self.assumed_cap) if c]
        return min(caps) if caps else None

    def body(self, history: list[Message] | History) -> bytes:
        payload: dict[str, Any] = {"model": self.model, "messages": to_openai(history)}
        if self.tool_specs:
            payload["tools"] = self.tool_specs
        return json.dumps(payload).encode()

    def budget_chars(self, ratio: float) -> int:
        by_window = int(self.window * ratio * CHARS_PER_TOKEN)
        cap = self.cap
        return min(by_window, int(CAP_FRACTION * cap)) if cap else by_window

    # -- the turn ---------------------------------------------------------------------------
    def send(self, text: str) -> BaselineTurn:
        self.history.append(Message.user(text))
        for _ in range(MAX_TOOL_ROUNDS + 1):
            self._microcompact()
            self._budget(TURN_BUDGET, PER_RESULT_MAX, current_turn_only=True)
            self._preflight()
            try:
                completion = self._send_with_ladder()
            except _TurnLost as e:
                return BaselineTurn(False, error=str(e))
            choice = completion.choices[0]
            calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments)
                          for c in (choice.message.tool_calls or ()))
            self.history.append(Message.assistant(choice.message.content or "", calls))
            if not calls:
                return BaselineTurn(True, text=choice.message.content or "")
            for call in calls:
                self.history.append(Message.tool(call.id, self._run_tool(call), name=call.name))
        return BaselineTurn(False, error="tool round limit")

    def _run_tool(self, call: ToolCall) -> str:
        fn = self.tools.get(call.name)
        if fn is None:
            return f"Error: no tool named {call.name}"
        return str(fn(**json.loads(call.arguments or "{}")))

    def _send_with_ladder(self) -> Any:
        attempt = 0
        transient = 0
        while True:
            body = self.body(self.history)
            try:
                return self.client.chat.completions.create(
                    model=self.model, messages=to_openai(self.history),  # type: ignore[arg-type]
                    tools=self.tool_specs or openai.NOT_GIVEN)  # type: ignore[arg-type]
            except (openai.APIStatusError, openai.APIConnectionError) as e:
                kind = classify(e, len(body))
                if kind == "transient" and transient < TRANSIENT_RETRIES:
                    transient += 1
                    continue
                if kind in ("other", "transient"):
                    raise _TurnLost(f"{kind}: {e}") from e
                attempt += 1
                if attempt > MAX_ATTEMPTS:
                    raise _TurnLost(f"recovery exhausted ({kind})") from e
                if kind in ("payload", "waf", "likely_payload"):
                    if self.learn_cap:
                        learned = int(len(body) * LEARNED_FRACTION)
                        self.learned_cap = min(self.learned_cap or learned, learned)
                    if self.configured_cap is None and self.assumed_cap is None:
                        self.assumed_cap = ASSUMED_CAP
                    if not any(m.role is Role.USER and m.text == PAYLOAD_NOTICE
                               for m in self.history):
                        self.history.append(Message.user(PAYLOAD_NOTICE))
                self._level(attempt)

    def _level(self, attempt: int) -> None:
        """The ladder level is the attempt number, whatever the failure said."""
        if attempt == 1:
            self.history = list(repair_pairing(tuple(self.history))[0])
            self._budget(TURN_BUDGET // 2, PER_RESULT_MAX // 2, current_turn_only=False)
            self.history = [_cut_assistant(m) for m in self.history]
        elif attempt == 2:
            self.history = _keep_last(self.history, EMERGENCY_KEEP)
        else:
            kept = _keep_last(self.history, NUCLEAR_KEEP)
            systems = [m for m in kept if m.role is Role.SYSTEM]
            rest = [m for m in kept if m.role is not Role.SYSTEM]
            self.history = [*systems, Message.user(COMPACTION_NOTICE), *rest]

    # -- first lines of defence -------------------------------------------------------------
    def _microcompact(self) -> None:
        users_after = 0
        out = list(self.history)
        for i in range(len(out) - 1, -1, -1):
            m = out[i]
            if m.role is Role.USER:
                users_after += 1
            r = m.tool_result
            if r is None or len(r.content) < MC_MIN:
                continue
            if users_after >= MC_SUMMARIZE_TURNS:
                content = (f"[Old tool result cleared — {r.content.count(chr(10)) + 1} lines, "
                           f"{len(r.content)} chars]")
            elif users_after >= MC_TRUNCATE_TURNS:
                omitted = len(r.content) - MC_HEAD - MC_TAIL
                content = (r.content[:MC_HEAD] +
                           f"\n[... {omitted} chars omitted from old tool result ...]\n" +
                           r.content[-MC_TAIL:])
            else:
                continue
            out[i] = Message(Role.TOOL, (ToolResult(r.call_id, content, r.is_error, r.name),))
        self.history = out

    def _budget(self, turn_budget: int, per_result: int, *, current_turn_only: bool) -> None:
        start = 0
        if current_turn_only:
            users = [i for i, m in enumerate(self.history) if m.role is Role.USER]
            start = users[-1] if users else 0
        out = list(self.history)
        idx = [i for i in range(start, len(out)) if out[i].tool_result is not None]
        for i in idx:
            r = out[i].tool_result
            assert r is not None
            if len(r.content) > per_result:
                out[i] = _previewed(r)
        def size(j: int) -> int:
            r = out[j].tool_result
            return len(r.content) if r is not None else 0

        total = sum(size(i) for i in idx)
        for i in sorted(idx, key=lambda j: -size(j)):
            if total <= turn_budget:
                break
            r = out[i].tool_result
            assert r is not None
            before = size(i)
            out[i] = _previewed(r)
            total -= before - size(i)
        self.history = out

    def _preflight(self) -> None:
        ratio = CHAT_RATIO
        cap = self.cap
        if cap is not None and len(self.body(self.history)) > PREFLIGHT_FRACTION * cap:
            ratio = PREFLIGHT_RATIO
        budget = self.budget_chars(ratio)
        if char_size(self.history) > budget:
            self._summarize()

    def _summarize(self) -> None:
        systems = [m for m in self.history if m.role is Role.SYSTEM]
        rest = [m for m in self.history if m.role is not Role.SYSTEM]
        cut = max(0, len(rest) - SUMMARY_KEEP_RECENT)
        while cut < len(rest) and rest[cut].role is not Role.USER:
            cut += 1
        old, recent = rest[:cut], rest[cut:]
        if not old:
            return
        text = "\n\n".join(f"{m.role.value}: {m.text or (m.tool_result.content if m.tool_result else '')}"
                           for m in old)
        try:
            completion = self.client.chat.completions.create(
                model=self.model, messages=[{"role": "system", "content": SUMMARIZE_SYSTEM_PROMPT},
                                            {"role": "user", "content": text}])
        except (openai.APIStatusError, openai.APIConnectionError):
            self.history = _keep_last(self.history, EMERGENCY_KEEP)
            return
        summary = completion.choices[0].message.content or ""   # unchecked (weakness 7)
        self.history = [*systems, Message.user(summary), *recent]


class _TurnLost(Exception):
    pass


def _previewed(r: ToolResult) -> Message:
    omitted = len(r.content) - BUDGET_HEAD - BUDGET_TAIL
    content = (r.content[:BUDGET_HEAD] +
               f"\n… {omitted} chars omitted — full output saved to /tmp/chatcli-tool-output.txt\n" +
               r.content[-BUDGET_TAIL:])
    return Message(Role.TOOL, (ToolResult(r.call_id, content, r.is_error, r.name),))


def _cut_assistant(m: Message) -> Message:
    if m.role is not Role.ASSISTANT or len(m.text) <= AGGRESSIVE_ASSISTANT_MAX:
        return m
    return Message.assistant(m.text[:AGGRESSIVE_ASSISTANT_MAX] + " …[truncated]", m.tool_calls)


def _keep_last(history: list[Message], keep: int) -> list[Message]:
    """System messages + the last ``keep`` others, then drop until a user message (API rule);
    when the tail holds no user message nothing but the system messages survives."""
    systems = [m for m in history if m.role is Role.SYSTEM]
    rest = [m for m in history if m.role is not Role.SYSTEM][-keep:]
    while rest and rest[0].role is not Role.USER:
        rest.pop(0)
    return list(repair_pairing(tuple(systems + rest))[0])
