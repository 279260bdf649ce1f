"""The ``%chat SUBCOMMAND`` line magic: one small function per subcommand.

Each subcommand takes the ChatMagics instance (its configuration, and its ``workspace``:
sessions, emulator, panels) and its parsed arguments, prints a short summary and may
return a value (``%chat panel`` displays the session's live panel).
User mistakes raise ``UsageError`` with one sentence; nothing here talks to a model
except ``compact`` (through the session).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import stat
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser

from .. import errors
from .._files import write_private_atomic
from ..core import catalogue, history, prices, prompts
from ..core import events as ev
from ..core.catalogue import bare
from ..core.wording import (
    PROMPT_CACHING_OFF,
    cache_said,
    cache_split,
    compact_result,
    compaction_cost,
    cost_words,
    emulator_quirk,
    forgotten_limits,
    messages_held,
    plural,
    prices_dropped,
    prices_miss,
    server_compaction_words,
    status_text,
)
from ..emulator import quirks
from ..session.redactor import Redactor
from ..session.store import Transcript
from ..settings import (
    ENV_VARS,
    ConfigError,
    field_for,
    format_size,
    parse_prices,
    parse_size,
    seconds_arg,
)
from .cell_inputs import whole_number
from .display import EventPrinter
from .workspace import DEFAULT_SESSION

if TYPE_CHECKING:
    from .magics import ChatMagics

__all__ = ["SUBCOMMANDS", "run_subcommand", "summary_text"]


Handler = Callable[["ChatMagics", Any], Any]
SUBCOMMANDS: dict[str, tuple[Handler, MagicArgumentParser, str]] = {}


def _subcommand(name: str, summary: str, *arguments: tuple[tuple[str, ...], dict[str, Any]],
                session_flag: bool = True) -> Callable[[Handler], Handler]:
    # IPython's parser: its mistakes are UsageErrors (one line, no traceback). The plain
    # formatter keeps the usage "%chat NAME" (MagicHelpFormatter would prefix another "%").
    parser = MagicArgumentParser(prog=f"%chat {name}", description=summary,
                                 formatter_class=argparse.HelpFormatter)
    if session_flag:
        parser.add_argument("-S", "--session", default=None, metavar="NAME",
                            help="Session name (default: the one the last %%%%chat used).")
    for flags, options in arguments:
        parser.add_argument(*flags, **options)

    def register(fn: Handler) -> Handler:
        SUBCOMMANDS[name] = (fn, parser, summary)
        return fn

    return register


def _arg(*flags: str, **options: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    return flags, options


def run_subcommand(magics: ChatMagics, line: str) -> Any:
    try:
        words = shlex.split(line)
    except ValueError as e:
        raise UsageError(f"%chat: cannot parse the line ({e}); check the quotes.") from e
    if not words:
        return _help(magics, None)
    name, rest = words[0], words[1:]
    if name.startswith("-") and name not in SUBCOMMANDS:
        # "%chat -S NAME status": the flags belong after the subcommand.
        named = next((w for w in rest if w in SUBCOMMANDS), None)
        if named is not None:
            flags = " ".join(shlex.quote(w) for w in words if w is not named)
            raise UsageError(f"%chat: the subcommand comes first, then its flags: "
                             f"%chat {named} {flags}.")
    if name not in SUBCOMMANDS:
        raise UsageError(f"%chat: unknown subcommand {name!r}; use one of "
                         f"{', '.join(SUBCOMMANDS)} (%chat help explains them).")
    handler, parser, _ = SUBCOMMANDS[name]
    if any(w in ("-h", "--help") for w in rest[:rest.index("--") if "--" in rest else None]):
        # IPython's parser has no -h: the help is asked for, and nothing else is done.
        print(parser.format_help().rstrip())
        return None
    try:
        args = parser.parse_args(rest)
    except UsageError as e:
        raise UsageError(f"%chat {name}: {e}; see %chat help {name}.") from e
    return handler(magics, args)


def _session(magics: ChatMagics, args: Any) -> Any:
    """The session a subcommand works on: ``-S NAME``, else the current one (the last one
    a ``%%chat`` cell used). Only the kernel's default session is created here."""
    ws = magics.workspace
    if args.session is None:
        args.session = ws.current
    if args.session != DEFAULT_SESSION and args.session not in ws.sessions:
        raise UsageError(f"no session named {args.session!r} in this kernel; start it with "
                         f"%%chat -S {args.session}, or %chat resume {args.session} if it "
                         "was saved.")
    return ws.session(args.session)


@_subcommand("help", "Show what each subcommand does.",
             _arg("topic", nargs="?", default=None, metavar="SUBCOMMAND"), session_flag=False)
def _help(magics: ChatMagics, args: Any) -> None:
    topic = getattr(args, "topic", None)
    if topic:
        if topic not in SUBCOMMANDS:
            raise UsageError(f"%chat help: no subcommand {topic!r}; %chat help lists them.")
        print(SUBCOMMANDS[topic][1].format_help().rstrip())
        return
    print(summary_text())


def summary_text() -> str:
    """One usage line and one summary line per subcommand (``%chat help``, ``%chat?``)."""
    lines = ["%%chat [MODEL] [options]   send the cell as a message (%%chat? lists the options)"]
    for _handler, parser, summary in SUBCOMMANDS.values():
        usage = " ".join(parser.format_usage().replace("usage: ", "").split())
        lines.append(f"{usage}\n    {summary}")
    return "\n".join(lines)


@_subcommand("status", "How big the history is against the payload cap and the context window; "
             "where requests go; tokens used, compactions, recoveries.")
def _status(magics: ChatMagics, args: Any) -> Any:
    from .environment import session_endpoint

    session = _session(magics, args)
    print(status_text(session.status(), name=args.session, endpoint=session_endpoint(
        session, magics.workspace.emulator)))
    embedded = magics.workspace.emulator
    if embedded is not None and getattr(session.provider, "emulator", None) is embedded:
        print(f"emulator: {_emulator_limits(magics)}")
    return None


def _positive_width(text: str) -> int:
    """``--width N``: 0 or below would print every message whole, a wall of text."""
    width = whole_number(text)
    if width < 1:
        raise argparse.ArgumentTypeError(f"{width} is not a positive number of characters")
    return width


@_subcommand("history", "The working history (what the model sees), or --full: the transcript.",
             _arg("--full", action="store_true", help="Show the full transcript."),
             _arg("--width", type=_positive_width, default=100, metavar="N",
                  help="Characters shown per message."))
def _history(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    # Shown as it is stored: the session's own key (pasted into a message, say) masked.
    redactor = getattr(session, "redactor", None) or Redactor()
    messages = redactor.messages(session.transcript if args.full else session.history)
    label = "transcript" if args.full else "working history"
    print(f"{label} of session {args.session}: {plural(len(messages), 'message')}")
    for i, message in enumerate(messages):
        text = " ".join(message.text.split()) or _describe_blocks(message)
        cut = text if len(text) <= args.width else text[: args.width - 1] + "…"
        words = _TRANSCRIPT_TAG_WORDS if args.full else _TAG_WORDS
        tag = f" [{words.get(message.tag, message.tag)}]" if message.tag else ""
        print(f"{i:>3} {message.role.value:<9}{tag} {cut}")


#: history.TAG_* -> how a tagged message is labelled in %chat history.
_TAG_WORDS = {
    history.TAG_PAYLOAD_NOTICE: "notice: request was too big",
    history.TAG_COMPACTION_NOTICE: "notice: older messages dropped",
    history.TAG_SUMMARY: "summary",
    history.TAG_CONTINUATION: "continue request",
    history.TAG_SYNTHETIC_RESULT: "placeholder tool result",
    history.TAG_PINNED_RULES: "pinned: your standing instructions, verbatim",
    history.TAG_USER_WORDS: "your earlier messages, verbatim",
    history.TAG_SERVER_COMPACTION: "server compaction: replaces everything before it",
}
#: The same in the transcript (``--full``, ``export``), which keeps what a compaction replaced.
_TRANSCRIPT_TAG_WORDS = {
    **_TAG_WORDS,
    history.TAG_SERVER_COMPACTION: "server compaction: the provider's summary of the "
                                   "messages before it",
}


def _describe_blocks(message: Any) -> str:
    compaction = next((b for b in getattr(message, "blocks", ())
                       if isinstance(b, history.Compaction)), None)
    if compaction is not None:   # its summary, or that an encrypted one (OpenAI's) is opaque
        if compaction.summary is None:
            return f"{server_compaction_words(None)}, from the {compaction.wire} server"
        return " ".join(compaction.summary.split()) or "(empty summary)"
    calls = getattr(message, "tool_calls", ())
    if calls:
        return "calls " + ", ".join(f"{c.name}({c.arguments})" for c in calls)
    return "(empty)"


@_subcommand("compact", "Compact the working history now; optional instructions for the summary.",
             _arg("instructions", nargs="*", metavar="INSTRUCTIONS", help="What the summary should keep."))
def _compact(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    if not any(m.role.value != "system" for m in session.history):
        print(f"nothing to compact: session {args.session} has no messages yet")
        return
    instructions = " ".join(args.instructions) or None
    # The progress is shown as in a cell; the result once, here, with how to undo it.
    printer = EventPrinter(verbosity=magics.verbosity)
    targets: list[int] = []

    def show(event: Any) -> None:
        if isinstance(event, ev.CompactionPhase) and event.target_bytes is not None:
            targets.append(event.target_bytes)
        if not (_is_result(event) and magics.verbosity != "debug"):
            printer(event)

    unsubscribe = session.subscribe(show)
    canceller = magics.cell_cancel()       # Cancel here too while the summary runs
    stop_cancel = session.subscribe(canceller) if canceller is not None else None
    interrupted = False
    try:
        with magics.workspace.panel_turn(args.session):
            report = session.compact(instructions)
    except errors.ChatError as e:
        magics.fail(str(e), e)
        return
    except KeyboardInterrupt:
        from .display import ChatInterrupted

        interrupted = True
        raise ChatInterrupted(f"the compaction was interrupted — the history is as it was "
                              f"({plural(len(session.history), 'message')}).") from None
    finally:
        if canceller is not None and stop_cancel is not None:
            canceller.close(interrupted=interrupted)
            stop_cancel()
        unsubscribe()
    kept, pinned = _kept_whole(session.history)
    print(compact_result(applied=report.applied, before_messages=report.before_messages,
                         after_messages=report.after_messages,
                         before_bytes=report.before_bytes, after_bytes=report.after_bytes,
                         summarized=report.summarized_messages,
                         target_bytes=targets[-1] if targets else None, kept=kept,
                         pinned=pinned, reason=report.rejected_reason))
    if report.summary_input_tokens is not None:
        # What the summary was billed (in %chat usage), against what it saves every request.
        removed = session.estimator.estimate(max(0, report.before_bytes - report.after_bytes)) \
            if report.applied else None
        paid, saved = prices.summary_usd(session.model, report.summary_input_tokens,
                                         report.summary_output_tokens or 0, removed or 0,
                                         session.settings.prices)
        said = compaction_cost(report.summary_input_tokens, report.summary_output_tokens or 0,
                               removed, paid, None if removed is None else saved)
        for part in said.split("; "):       # a line each: within 80 columns
            print("  " + part)


def _kept_whole(messages: Any) -> tuple[int, int]:
    """(the latest request and the messages after it, the pinned ones before it): what a
    compaction never summarizes."""
    latest = history.latest_user_index(messages)
    if latest is None:
        return 0, sum(1 for m in messages if m.role.value == "system")
    pinned = sum(1 for m in messages[:latest]
                 if m.role.value == "system"
                 or m.tag in (history.TAG_PAYLOAD_NOTICE, history.TAG_PINNED_RULES))
    return len(messages) - latest, pinned


def _is_result(event: Any) -> bool:
    """The compaction's outcome, which ``%chat compact`` says itself (an interrupt with
    the line of its ChatInterrupted)."""
    return isinstance(event, ev.CompactionPhase) and \
        event.phase in ("applied", "rejected", "cancelled")


@_subcommand("undo-compact", "Restore the history from before the last compaction.")
def _undo_compact(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    try:
        session.undo_compact()
    except errors.CtxRecoveryError as e:
        raise UsageError(str(e)) from e
    magics.workspace.tell(args.session, ())  # the panel follows
    print(f"history restored: {plural(len(session.history), 'message')}")


@_subcommand("reset", "Start the working history afresh (the transcript keeps everything).")
def _reset(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    session.reset()
    magics.workspace.tell(args.session, ())  # the panel follows
    print(f"session {args.session} reset: the next %%chat starts a new conversation")


@_subcommand("forget-limits", "Forget the payload cap learned on this session's network path "
             "(every session on it) and a learned context window — after the proxy's or the "
             "model's limit was raised. A configured cap stays.")
def _forget_limits(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    cap, window = session.forget_limits()
    magics.workspace.tell(args.session, ())  # the panel follows
    print(forgotten_limits(cap, window, session.caps.configured))


@_subcommand("sessions", "Sessions in this kernel, and the ones saved on disk.",
             session_flag=False)
def _sessions(magics: ChatMagics, args: Any) -> None:
    from ..session.store import is_generated_name, saved_sessions

    ws = magics.workspace
    here = {s.name: key for key, s in ws.sessions.items()}
    rows = [("", "name", "messages", "size", "last used", "first words")]
    shown = set()
    for saved in saved_sessions():
        key = here.get(saved.name)
        mark = ("*" if key == ws.current else "+") if key is not None else \
            ("!" if saved.open_elsewhere else " ")
        name = key if key is not None and key != saved.name else saved.name
        if key is not None and key != saved.name:
            name = f"{key} ({saved.name})"
        elif key is None and is_generated_name(saved.name):
            name = f"{saved.name} (a kernel's default)"   # what %%chat -c brings back
        rows.append((mark, name, f"{saved.messages:,}" if saved.damage is None else "-",
                     format_size(saved.size) if saved.damage is None else "-",
                     time.strftime("%Y-%m-%d %H:%M", time.localtime(saved.last_used)),
                     saved.first_words if saved.damage is None
                     else f"⚠ cannot be opened: {saved.damage}"))
        shown.add(saved.name)
    for key, session in ws.sessions.items():
        if session.name not in shown:   # open here, nothing said yet
            rows.append(("*" if key == ws.current else "+", key, "0", "-", "-", ""))
    if len(rows) == 1:
        print("no session yet: %%chat starts the kernel's default one, %%chat -S NAME a "
              "named one")
        return
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True))
              + "  " + row[5])
    print("* current  + open in this kernel  ! open in another process · "
          "%chat resume NAME reopens a saved one, %%chat -c continues the latest")


@_subcommand("resume", "Reopen a saved session (e.g. after a kernel restart) as -S NAME.",
             _arg("name", metavar="NAME", help="The saved session's name."), session_flag=False)
def _resume(magics: ChatMagics, args: Any) -> None:
    ws = magics.workspace
    old = ws.sessions.get(args.name)
    # The name %chat sessions shows: "default" is saved under a generated name.
    stored = old.name if old is not None else args.name
    if not Transcript.exists(stored):
        # Refused before anything is closed: the session in use carries on as it was.
        raise UsageError(f"there is no saved session named {args.name!r}"
                         + (" yet (nothing of it is saved before its first turn)"
                            if old is not None else "")
                         + "; %chat sessions lists the saved ones.")
    if old is not None:
        ws.sessions.pop(args.name)
        old.close()                     # its files are what is reopened
    try:
        session = ws.resume_session(stored)
    except UsageError:
        if old is not None:             # its own files: the conversation it held, back
            ws.replace_session(args.name, ws.resume_session(old.name))
        raise
    ws.replace_session(args.name, session)
    ws.current = args.name
    print(f"resumed {args.name}: "
          f"{messages_held(len(session.history), len(session.transcript))} on "
          f"{session.model}; use %%chat -S {args.name}")


@_subcommand("usage", "Tokens used by this session (as reported by the provider).")
def _usage(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    status = session.status()
    totals = {"prompt_tokens": status.prompt_tokens,
              "completion_tokens": status.completion_tokens,
              "turns": status.turns}
    print(f"session {args.session}: {totals['prompt_tokens']:,} prompt + "
          f"{totals['completion_tokens']:,} completion tokens over "
          f"{plural(int(totals['turns'] or 0), 'cell')}")
    if cache_said(status.cached_tokens, status.cache_write_tokens, status.cost):
        print("  " + cache_split(status.prompt_tokens, status.cached_tokens,
                                 status.cache_write_tokens, status.cache_write_1h_tokens))
        print(f"  cost: {cost_words(status.cost, price_name=bare(status.model))}")


#: What each provider needs, and where its requests go unless told otherwise.
_PROVIDER_NEEDS = {
    "openai": "OPENAI_API_KEY (OPENAI_BASE_URL for another OpenAI-compatible server)",
    "anthropic": "ANTHROPIC_API_KEY (ANTHROPIC_BASE_URL for a gateway)",
    "emulator": "nothing: the built-in emulator on 127.0.0.1 (%chat emulator changes its limits)",
}


@_subcommand("models", "Known models, their context windows and output limits, and the "
             "environment variable each provider needs.", session_flag=False)
def _models(magics: ChatMagics, args: Any) -> None:
    from ..core.catalogue import MODELS

    keys = [v for v in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY") if os.environ.get(v)]
    print(f"default: {magics.model()}; keys set: {', '.join(keys) or 'none (emulator)'}")
    rows: dict[str, list[tuple[str, int, int]]] = {p: [] for p in _PROVIDER_NEEDS}
    for family, (window, output) in MODELS.items():
        provider = ("emulator" if family == "emulator"
                    else "anthropic" if family.startswith("claude") else "openai")
        name = "emulator, emulator:anthropic" if provider == "emulator" \
            else f"{provider}:{family}"
        rows[provider].append((name, window, output))
    width = max(len(name) for group in rows.values() for name, _, _ in group)
    configured, emulator_note = _window_in_force(magics)
    wide = max([len(f"{w:,}") for group in rows.values() for _, w, _ in group]
               + ([len(f"{emulator_note[0]:,}")] if emulator_note is not None else []))
    out = max(len(f"{o:,}") for group in rows.values() for _, _, o in group)
    for provider, group in rows.items():
        if not group:
            continue
        print(f"{provider} — needs {_PROVIDER_NEEDS[provider]}")
        for name, window, output in group:
            note = ""
            if provider == "emulator" and emulator_note is not None:
                window, note = emulator_note[0], f"  ({emulator_note[1]})"
            print(f"  {name:<{width}}  window {window:>{wide},}  max output {output:>{out},}"
                  + note)
    if configured is not None:
        print(f"context window {plural(configured[0], 'token')} {configured[1]}: used for "
              "every model instead of the window listed")


def _window_in_force(magics: ChatMagics) -> tuple[tuple[int, str] | None,
                                                   tuple[int, str] | None]:
    """(a configured context window and its source, the emulator's window and its source
    when it is not the catalogue's): what ``%chat models`` shows beside the catalogue."""
    settings = magics.settings()
    set_on_emulator = magics.workspace.emulator_limits.get("context_window")
    configured = None
    if settings.context_window is not None:
        source = _sources(magics).get("context_window")
        where = ("from CHATCLI_CONTEXT_WINDOW" if source == "environment"
                 else "set with %chat config or %config ChatMagics.context_window")
        configured = (settings.context_window, where)
    if configured is not None:
        held = (f"; the emulator itself holds {set_on_emulator:,}"
                if set_on_emulator is not None and set_on_emulator != configured[0] else "")
        return configured, (configured[0], configured[1] + held)
    if set_on_emulator is not None:
        return None, (set_on_emulator, "set with %chat emulator --context-window")
    return None, None


@_subcommand("tools", "Tools the model is offered (built-in ones too) and the ones registered "
             "with @chat_tool (offer those with %%chat --tools NAME).")
def _tools(magics: ChatMagics, args: Any) -> None:
    from ..session.tools import registered_tools

    registry = registered_tools()
    session = _session(magics, args)
    offered = {tool.name: tool for tool in session.tools}
    print(f"offered to the model in session {args.session}:"
          + ("" if offered else " none"))
    later = {tool.name for tool in session.tools_after_compaction}
    for name, tool in offered.items():
        mark = " (built-in, offered after a compaction)" if name in later else \
            " (built-in)" if _is_builtin(tool) else ""
        print(_wrapped(f"  {name}{mark}: {_first_line(tool)}"))
    others = {name: tool for name, tool in registry.items() if name not in offered}
    if others:
        print("registered, not offered yet (add with %%chat --tools NAME):")
        for name, tool in others.items():
            print(_wrapped(f"  {name}: {_first_line(tool)}"))
    elif not registry:
        print("register your own with @chat_tool (from ipy_ctxrecovery import chat_tool)")
    waiting = [t for t in session.tools_after_compaction if t.name not in offered]
    if waiting:
        print("offered after a compaction (not yet: the session has not compacted):")
        for tool in waiting:
            print(_wrapped(f"  {tool.name} (built-in, offered after a compaction): "
                           f"{_first_line(tool)}"))


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=100, subsequent_indent="      ")


def _is_builtin(tool: Any) -> bool:
    """A tool the package itself provides (``read_file``, ``recall_transcript``), not one
    the user wrote."""
    from ..session import recall as recall_module
    from ..session import tools as tools_module

    return getattr(tool.function, "__module__", None) in (tools_module.__name__,
                                                          recall_module.__name__)


def _first_line(tool: Any) -> str:
    """The description's first paragraph, whole (wrapped by the caller, never cut)."""
    paragraph = (tool.description or "").strip().split("\n\n", 1)[0]
    return " ".join(paragraph.split())


@_subcommand("config", "Show or set settings: KEY=VALUE with env-var or field names; a KEY "
             "alone shows that setting and where its value comes from.",
             _arg("assignments", nargs="*", metavar="KEY=VALUE",
                  help="e.g. CHATCLI_MAX_PAYLOAD=5MB (or 5 MB) or raise_on_error=False; a KEY "
                       "alone shows it; none: show all settings and where each comes from. "
                       "Live sessions keep their history, usage and learned limits."),
             session_flag=False)
def _config(magics: ChatMagics, args: Any) -> None:
    if not args.assignments:
        _show_config(magics)
        return
    items = _assignments(args.assignments)
    if all("=" not in item for item in items):
        for item in items:
            _show_one(magics, item)
        return
    traits = magics.class_traits(config=True)
    as_typed: dict[str, str] = {}  # validation messages name the key the way it was typed
    settings_values: dict[str, str] = {}
    trait_values: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"%chat config: {item!r} is not KEY=VALUE, e.g. "
                             "CHATCLI_MAX_PAYLOAD=5MB or raise_on_error=False.")
        field = field_for(key)
        if field in {"max_payload", "context_window"} or field not in traits:
            settings_values[field] = value
            as_typed[key] = value
        else:
            trait_values[field] = _trait_value(magics, traits[field], key, value)
    before = magics.settings()
    try:
        before.updated(as_typed, source="setting")
    except ConfigError as e:
        raise UsageError(f"%chat config: {e}") from e
    with magics.hold_trait_notifications():
        for field, value in settings_values.items():
            if field in ("max_payload", "context_window"):
                setattr(magics, field, value)
        others = {k: v for k, v in settings_values.items()
                  if k not in ("max_payload", "context_window")}
        if others:
            magics.settings_overrides = {**magics.settings_overrides, **others}
        for field, value in trait_values.items():
            setattr(magics, field, value)
    now = magics.settings()
    print("set " + ", ".join(_said_set(item, now) for item in items))
    if "prices" in settings_values:
        for line in _prices_notes(magics, before.prices, now.prices):
            print(line)
    if "prompt_caching" in settings_values and before.prompt_caching \
            and not now.prompt_caching:
        print(PROMPT_CACHING_OFF)


def _prices_notes(magics: ChatMagics, before: str | None, now: str | None) -> list[str]:
    """What a new ``prices`` setting does not do, said when it is set: the models of the
    previous one it drops (a setting replaces, it does not add), and the current session's
    model when it names no entry for it (a typo, or another model's name)."""
    old = set(parse_prices(before)) if before else set()
    new = parse_prices(now) if now else {}
    notes = []
    dropped = sorted(old - set(new))
    if dropped:
        notes.append(prices_dropped(dropped))
    name = magics.workspace.current
    session = magics.workspace.sessions.get(name)
    model = session.model if session is not None else magics.workspace.defaults.model()
    if new and catalogue.family(model, new) is None:
        notes.append(prices_miss(name, model, bare(model),
                                 known=prices.price_for(model) is not None))
    return notes


#: What None means for the settings where it is a value (0 for a size or a window).
_NONE_MEANS = {"context_window": "the model's own window", "max_payload": "no payload cap",
               "turn_timeout": "no deadline"}


def _said_set(item: str, settings: Any) -> str:
    """``KEY=VALUE`` as confirmed: with what it amounts to when that is None (``0``)."""
    key = item.partition("=")[0]
    field = field_for(key)
    if field in _NONE_MEANS and getattr(settings, field, 0) is None:
        return f"{item} ({_NONE_MEANS[field]})"
    return item


def _assignments(words: list[str]) -> list[str]:
    """``KEY=5 MB`` arrives as two words: a word without ``=`` after an assignment is the
    rest of its value (a size's unit, a path with a space)."""
    items: list[str] = []
    for word in words:
        if items and "=" not in word and "=" in items[-1]:
            items[-1] += " " + word
        else:
            items.append(word)
    return items


def _sources(magics: ChatMagics) -> dict[str, str]:
    """Settings field -> where its value comes from: ``%chat config``, ``environment`` or
    ``default`` (a rejected environment value leaves the default in force)."""
    from .environment import env_settings

    overrides = dict(magics.settings_overrides)
    for trait in ("max_payload", "context_window"):
        if getattr(magics, trait) is not None:
            overrides[trait] = getattr(magics, trait)
    base, _ = env_settings()
    sources = {}
    for var, field in ENV_VARS.items():
        from_env = bool(os.environ.get(var, "").strip()) and \
            getattr(base, field) != getattr(type(base)(), field)
        sources[field] = ("%chat config" if field in overrides
                          else "environment" if from_env else "default")
    for field in overrides:
        sources.setdefault(field, "%chat config")
    return sources


def _setting_value(settings: Any, field: str) -> str:
    value = getattr(settings, field)
    if field == "max_payload":
        return format_size(value) if value else "no cap"
    if field == "context_window" and value is None:
        return "the model's own window"   # the catalogue's, the server's, one it reports
    return str(value)


def _setting_source(var: str, field: str, sources: dict[str, str]) -> str:
    source = sources.get(field, "default")
    raw = os.environ.get(var, "").strip() if var else ""
    if source == "default" and raw:
        source = f"default; {var}={raw!r} was ignored"
    return source


def _setting_line(magics: ChatMagics, settings: Any, var: str, field: str,
                  sources: dict[str, str]) -> str:
    """One row of ``%chat config``: the variable, the field, the value and its source; a
    setting without a variable starts with its field, its value in the value column."""
    name = f"{var:<38} {field:<30}" if var else f"{field:<69}"
    return (f"{name} {_setting_value(settings, field):<10} "
            f"({_setting_source(var, field, sources)})")


def _show_one(magics: ChatMagics, key: str) -> None:
    settings, sources = magics.settings(), _sources(magics)
    field = field_for(key)
    var = next((v for v, f in ENV_VARS.items() if f == field), "")
    traits = magics.class_traits(config=True)
    if field in ENV_VARS.values():
        print(_setting_line(magics, settings, var, field, sources).rstrip())
    elif hasattr(settings, field) and field not in traits:   # a field with no variable
        print(f"{field} = {_setting_value(settings, field)} "
              f"({_setting_source('', field, sources)})")
    elif field in traits:
        where = "default" if getattr(magics, field) == traits[field].default() \
            else "%config / %chat config"
        print(f"ChatMagics.{field} = {getattr(magics, field)!r} ({where})")
    else:
        raise UsageError(f"%chat config: {key} is not a known setting (KEY alone shows one, "
                         "KEY=VALUE sets it); %chat config lists them.")


def _show_config(magics: ChatMagics) -> None:
    settings, sources = magics.settings(), _sources(magics)
    for var, field in ENV_VARS.items():
        print(_setting_line(magics, settings, var, field, sources))
    for field in sorted(set(magics.settings_overrides) - set(ENV_VARS.values())):
        print(_setting_line(magics, settings, "", field, sources))    # turn_timeout=30 …
    for name in sorted(magics.class_traits(config=True)):
        if name not in {"max_payload", "context_window", "settings_overrides"}:
            print(f"ChatMagics.{name:<27} {getattr(magics, name)!r}")


def _trait_value(magics: ChatMagics, trait: Any, key: str, text: str) -> Any:
    """``text`` as a value of ``trait``, checked as setting it would (one-sentence errors)."""
    from traitlets import Bool, Enum, Float, Int, TraitError

    if isinstance(trait, Bool):
        expected = "use True or False"
    elif isinstance(trait, Enum):
        expected = "use one of " + ", ".join(str(v) for v in trait.values or ())
    elif isinstance(trait, Int):
        expected = "use a whole number" + (" or None" if trait.allow_none else "")
    elif isinstance(trait, Float):
        expected = "use a number"
    else:
        expected = "see %chat config for the current values"
    try:
        value = trait.from_string(text)
    except Exception as e:
        raise UsageError(f"%chat config: {key}={text!r} is not valid; {expected}.") from e
    try:
        # What ``setattr`` would check (type and the class's @validate hooks), before any
        # value is set, so a bad item leaves every setting as it was.
        return trait._validate(magics, value)
    except TraitError as e:
        own = str(e).rstrip(".")  # a ChatMagics @validate hook's sentence names the setting
        if own.startswith(trait.name):
            raise UsageError(f"%chat config: {own}.") from e
        raise UsageError(f"%chat config: {key}={text!r} is not valid; {expected}.") from e


_EMULATOR_FLAGS = (
    _arg("--context-window", type=whole_number, default=None, metavar="N", help="Context window in tokens."),
    _arg("--max-body", default=None, metavar="SIZE", help="413 above this body size, e.g. 32KB (0 = none)."),
    _arg("--body-limit-style", default=None, metavar="STYLE", help="nginx, cloudflare, aws or envoy."),
    _arg("--waf-over", default=None, metavar="SIZE", help="WAF 403 block page above this size."),
    _arg("--drop-over", default=None, metavar="SIZE", help="Drop the connection above this size."),
    _arg("--max-output-tokens", type=whole_number, default=None, metavar="N", help="Output token limit."),
    _arg("--latency", type=seconds_arg, default=None, metavar="S", help="Seconds of delay per response."),
)


@_subcommand("emulator", "Restart the built-in emulator with these limits, e.g. --max-body 32KB to "
             "rehearse a proxy (no flags: show the current ones).",
             *_EMULATOR_FLAGS, *quirks.arguments(), session_flag=False)
def _emulator(magics: ChatMagics, args: Any) -> None:
    limits: dict[str, Any] = {}
    for key in ("context_window", "max_output_tokens", "latency", "body_limit_style",
                *(q.name for q in quirks.QUIRKS)):
        value = getattr(args, key)
        if value is not None:
            limits[key] = value
    for key in ("max_body", "waf_over", "drop_over"):
        raw = getattr(args, key)
        if raw is None:
            continue
        try:
            size = parse_size(raw, name="--" + key.replace("_", "-"))
        except ConfigError as e:
            raise UsageError(f"%chat emulator: {e}") from e
        if size:
            limits[key] = size
    ws = magics.workspace
    if not any(getattr(args, k) is not None for k in vars(args)):
        emulator = ws.ensure_emulator()
        print(f"emulator at {emulator.openai_base_url}: {_emulator_limits(magics)}")
        return
    notes: list[tuple[str, str]] = []
    before = dict(ws.emulator_limits or {})
    try:
        ws.restart_emulator(limits, notes)
    except (ConfigError, ValueError, TypeError) as e:
        raise UsageError(f"%chat emulator: {e}") from e
    print(f"emulator restarted: {_emulator_limits(magics)}")
    # Each restart takes exactly the limits given: say which earlier ones are gone.
    gone = [_limit_words(key, value) for key, value in before.items() if key not in limits]
    if gone:
        print(f"  no longer: {'; '.join(gone)} (give every limit you want on one line)")
    for who, note in notes:     # one line per network path, naming its sessions
        print(f"ℹ {who}: {note}")


#: How each emulator limit reads in a status line (plain words, not the flag names).
_LIMIT_WORDS: dict[str, Callable[[Any], str]] = {
    "context_window": lambda v: f"context window {plural(v, 'token')}",
    "max_body": lambda v: f"rejects requests over {format_size(v)} (HTTP 413)",
    "body_limit_style": lambda v: f"{v}-style 413 page",
    "waf_over": lambda v: f"firewall blocks requests over {format_size(v)} (HTTP 403)",
    "drop_over": lambda v: f"drops the connection for requests over {format_size(v)}",
    "max_output_tokens": lambda v: f"answers at most {plural(v, 'token')}",
    "latency": lambda v: f"{v:g} s delay per answer",
}


def _limit_words(key: str, value: Any) -> str:
    if key in _LIMIT_WORDS:
        return _LIMIT_WORDS[key](value)
    if key in _QUIRK_NAMES:
        return emulator_quirk(key)
    return f"{key.replace('_', ' ')} {value}"


_QUIRK_NAMES = frozenset(q.name for q in quirks.QUIRKS)


def _emulator_limits(magics: ChatMagics) -> str:
    limits = magics.workspace.emulator_limits
    if not limits:
        return "default limits (context window 8,192 tokens, no body limit)"
    return "; ".join(_limit_words(key, value) for key, value in limits.items())


@_subcommand("export", "Write the transcript to PATH (.json or .md), private to you (0600).",
             _arg("path", metavar="PATH", help="Where to write: a .json or .md file."),
             _arg("--force", action="store_true", help="Replace PATH if it exists."))
def _export(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    path = Path(args.path).expanduser()
    suffix = path.suffix.lower()
    if suffix not in (".json", ".md"):
        raise UsageError(f"%chat export: {args.path!r} must end in .json or .md.")
    # Masked as the session's own files are (its key always, known formats unless
    # redact_stored is off); a session object without a redactor gets the formats.
    redactor = getattr(session, "redactor", None) or Redactor()
    messages = redactor.messages(session.transcript)
    if suffix == ".json":
        text = json.dumps({"session": session.name, "model": session.model,
                           "messages": [m.to_dict() for m in messages]},
                          ensure_ascii=False, indent=1)
    else:
        text = _markdown(session, messages)
    try:
        # Never through a symlink, never into a FIFO or device; a new file is private
        # (0600), an existing file is the user's and keeps the mode they gave it.
        existing = os.lstat(path)
    except FileNotFoundError:
        existing = None
    except OSError as e:
        raise UsageError(f"%chat export: cannot write {args.path!r} ({e.strerror}).") from e
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(existing.st_mode) else "not a regular file"
        raise UsageError(f"%chat export: {args.path!r} is {what}; give the path of a regular "
                         "file (or a new one) to write.")
    if existing is not None and not args.force:
        raise UsageError(f"%chat export: {args.path!r} exists; add --force to replace it, or "
                         "give another path.")
    try:
        # Written whole to a temporary file beside it, then renamed over: a failure never
        # leaves a partial file, nor destroys the one that was there.
        write_private_atomic(path, text.encode("utf-8"), sync=True,
                             mode=stat.S_IMODE(existing.st_mode) if existing else None)
    except OSError as e:
        raise UsageError(f"%chat export: cannot write {args.path!r} ({e.strerror}).") from e
    print(f"exported {plural(len(messages), 'message')} to {path}")


def _markdown(session: Any, messages: Any) -> str:
    lines = [f"# Chat transcript: {session.name}", "", f"Model: `{session.model}`", ""]
    for message in messages:
        heading = f"## {message.role.value}"
        if message.tag == history.TAG_SERVER_COMPACTION:    # not the model's own words
            heading += f" · {_TRANSCRIPT_TAG_WORDS[message.tag]}"
        lines += [heading, "", message.text or _describe_blocks(message), ""]
    return "\n".join(lines)


@_subcommand("error", "Ask the model why the last failed cell failed and how to fix it (its "
             "code and traceback are sent; the answer shows as a %%chat answer).",
             _arg("question", nargs="*", metavar="QUESTION",
                  help="Anything else to ask about the failure; end it without a '?' "
                       "(IPython reads a line ending in '?' as a help request)."))
def _error(magics: ChatMagics, args: Any) -> Any:
    found = magics.last_failed_cell()
    if found is None:
        chat_failed = any(source.lstrip().startswith(("%chat", "%%chat"))
                          for source, _ in magics.failed_cells.values())
        why = (" (a %%chat cell's failure is already its one sentence, with the fix in it)"
               if chat_failed else "")
        raise UsageError("%chat error: no cell outside %%chat has failed since "
                         f"ipy_ctxrecovery was loaded{why}; run the failing cell again, then "
                         "%chat error.")
    source, trace = found
    message = prompts.explain_error(source, trace, " ".join(args.question))
    name = args.session if args.session is not None else magics.workspace.current
    return magics.chat(f"-S {shlex.quote(name)}", message,
                       as_result=magics.is_cell_result("%chat error"))


@_subcommand("panel", "Show the live panel of a session here: sizes, the running turn's steps, "
             "Cancel during a summary (notebooks).",
             _arg("--sidebar", action="store_true",
                  help="Say how to keep the panel in JupyterLab's side area."))
def _panel(magics: ChatMagics, args: Any) -> None:
    _session(magics, args)
    panel = magics.workspace.panel(args.session)
    panel.show(live=magics.is_live())
    if args.sidebar:
        print(SIDEBAR_HINT)


SIDEBAR_HINT = ("JupyterLab gives a kernel no supported way to open a side panel: right-click "
                "the panel and choose 'Create New View for Cell Output', then drag that tab "
                "to the right side area (it stays live).")
