"""The ``%chat SUBCOMMAND`` line magic: one small function per subcommand.

Each subcommand takes the ChatMagics instance (its configuration, and its ``workspace``:
sessions, emulator, panels) and its parsed arguments, prints a short summary and may
return a value (``%chat panel`` returns the session's panel).
User mistakes raise ``UsageError`` with one sentence; nothing here talks to a model
except ``compact`` (through the session).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser

from .. import errors, history
from ..config import ENV_VARS, ConfigError, format_size, parse_size
from ..redaction import Redactor
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
        parser.add_argument("-S", "--session", default=DEFAULT_SESSION, metavar="NAME",
                            help="Session name.")
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
    if name not in SUBCOMMANDS:
        raise UsageError(f"%chat: unknown subcommand {name!r}; use one of "
                         f"{', '.join(SUBCOMMANDS)} (%chat help explains them).")
    handler, parser, _ = SUBCOMMANDS[name]
    try:
        args = parser.parse_args(rest)
    except UsageError as e:
        raise UsageError(f"%chat {name}: {e}; see %chat help {name}.") from e
    return handler(magics, args)


def _session(magics: ChatMagics, args: Any) -> Any:
    """The session a subcommand works on; only the kernel's default one is created here."""
    ws = magics.workspace
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
             "tokens used, compactions, recoveries.")
def _status(magics: ChatMagics, args: Any) -> Any:
    session = _session(magics, args)
    status = session.status()
    print(status)
    if session.model.startswith("emulator") and magics.workspace.emulator is not None:
        print(f"emulator: {_emulator_limits(magics)}")
    return None


@_subcommand("history", "The working history (what the model sees), or --full: the transcript.",
             _arg("--full", action="store_true", help="Show the full transcript."),
             _arg("--width", type=int, default=100, metavar="N", help="Characters shown per message."))
def _history(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    messages = session.transcript if args.full else session.history
    label = "transcript" if args.full else "working history"
    print(f"{label} of session {args.session}: {len(messages)} messages")
    for i, message in enumerate(messages):
        text = " ".join(message.text.split()) or _describe_blocks(message)
        cut = text if len(text) <= args.width else text[: args.width - 1] + "…"
        tag = f" [{_TAG_WORDS.get(message.tag, message.tag)}]" if message.tag else ""
        print(f"{i:>3} {message.role.value:<9}{tag} {cut}")


#: history.TAG_* -> how a tagged message is labelled in %chat history.
_TAG_WORDS = {
    history.TAG_PAYLOAD_NOTICE: "notice: request was too big",
    history.TAG_COMPACTION_NOTICE: "notice: older messages dropped",
    history.TAG_SUMMARY: "summary",
    history.TAG_CONTINUATION: "continue request",
    history.TAG_SYNTHETIC_RESULT: "placeholder tool result",
}


def _describe_blocks(message: Any) -> str:
    calls = getattr(message, "tool_calls", ())
    if calls:
        return "calls " + ", ".join(f"{c.name}({c.arguments})" for c in calls)
    return "(empty)"


@_subcommand("compact", "Compact the working history now; optional instructions for the summary.",
             _arg("instructions", nargs="*", metavar="INSTRUCTIONS", help="What the summary should keep."))
def _compact(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    instructions = " ".join(args.instructions) or None
    unsubscribe = session.subscribe(EventPrinter(verbose=magics.verbose))
    try:
        report = session.compact(instructions)
    except errors.ChatError as e:
        magics.fail(str(e), e)
        return
    finally:
        unsubscribe()
    if report.applied:
        print(f"compacted: {report.before_messages} → {report.after_messages} messages, "
              f"{format_size(report.before_bytes)} → {format_size(report.after_bytes)} "
              "(%chat undo-compact restores)")
    else:
        why = report.rejected_reason or "nothing to compact"
        print(f"history unchanged: {why}")


@_subcommand("undo-compact", "Restore the history from before the last compaction.")
def _undo_compact(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    try:
        session.undo_compact()
    except errors.CtxRecoveryError as e:
        raise UsageError(str(e)) from e
    print(f"history restored: {len(session.history)} messages")


@_subcommand("reset", "Start the working history afresh (the transcript keeps everything).")
def _reset(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    session.reset()
    print(f"session {args.session} reset: the next %%chat starts a new conversation")


@_subcommand("sessions", "Sessions in this kernel, and the ones saved on disk.",
             session_flag=False)
def _sessions(magics: ChatMagics, args: Any) -> None:
    from ..transcript import list_sessions

    sessions = magics.workspace.sessions
    if not sessions:
        print("no session in this kernel yet")
    for key, session in sessions.items():
        print(f"{key:<12} {session.model:<28} {len(session.history):>4} msgs "
              f"(saved as {session.name})")
    live = {s.name for s in sessions.values()}
    saved = [name for name in list_sessions() if name not in live]
    if saved:
        print("saved (%chat resume NAME): " + ", ".join(saved))


@_subcommand("resume", "Reopen a saved session (e.g. after a kernel restart) as -S NAME.",
             _arg("name", metavar="NAME", help="The saved session's name."), session_flag=False)
def _resume(magics: ChatMagics, args: Any) -> None:
    session = magics.workspace.resume_session(args.name)
    magics.workspace.replace_session(args.name, session)
    print(f"resumed {args.name}: {len(session.history)} messages on {session.model}; "
          f"use %%chat -S {args.name}")


@_subcommand("usage", "Tokens used by this session (as reported by the provider).")
def _usage(magics: ChatMagics, args: Any) -> None:
    session = _session(magics, args)
    status = session.status()
    totals = {"prompt_tokens": status.prompt_tokens,
              "completion_tokens": status.completion_tokens,
              "turns": magics.workspace.cells.get(args.session, 0)}
    print(f"session {args.session}: {totals['prompt_tokens']:,} prompt + "
          f"{totals['completion_tokens']:,} completion tokens over {totals['turns']} cells")


@_subcommand("models", "Known models, their context windows and output limits.",
             session_flag=False)
def _models(magics: ChatMagics, args: Any) -> None:
    from ..catalogue import MODELS

    keys = [v for v in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY") if os.environ.get(v)]
    print(f"default: {magics.model()}; keys set: {', '.join(keys) or 'none (emulator)'}")
    for family, (window, output) in MODELS.items():
        provider = ("emulator" if family == "emulator"
                    else "anthropic" if family.startswith("claude") else "openai")
        print(f"  {provider}:{family:<22} window {window:>9,}  max output {output:>7,}"
              if provider != "emulator" else
              f"  {'emulator, emulator:anthropic':<31} window {window:>9,}  max output "
              f"{output:>7,} (the embedded emulator; %chat emulator changes it)")


@_subcommand("tools", "Tools the model is offered (built-in ones too) and the ones registered "
             "with @chat_tool (offer those with %%chat --tools NAME).")
def _tools(magics: ChatMagics, args: Any) -> None:
    from ..tools import registered_tools

    registry = registered_tools()
    session = _session(magics, args)
    offered = {tool.name: tool for tool in session.tools}
    print(f"offered to the model in session {args.session}:"
          + ("" if offered else " none"))
    for name, tool in offered.items():
        print(f"  {name}{' (built-in)' if _is_builtin(tool) else ''}: {_first_line(tool)}")
    others = {name: tool for name, tool in registry.items() if name not in offered}
    if others:
        print("registered, not offered yet (add with %%chat --tools NAME):")
        for name, tool in others.items():
            print(f"  {name}: {_first_line(tool)}")
    elif not registry:
        print("register your own with @chat_tool (from ipy_ctxrecovery import chat_tool)")


def _is_builtin(tool: Any) -> bool:
    """A tool the package itself provides (``read_file``), not one the user wrote."""
    from .. import tools as tools_module

    return getattr(tool.function, "__module__", None) == tools_module.__name__


def _first_line(tool: Any) -> str:
    lines = (tool.description or "").strip().splitlines()
    return lines[0] if lines else ""


@_subcommand("config", "Show or set settings: KEY=VALUE with env-var or field names.",
             _arg("assignments", nargs="*", metavar="KEY=VALUE",
                  help="e.g. CHATCLI_MAX_PAYLOAD=5MB or raise_on_error=False; none: show all "
                       "settings and where each comes from. Live sessions keep their "
                       "history, usage and learned limits."),
             session_flag=False)
def _config(magics: ChatMagics, args: Any) -> None:
    if not args.assignments:
        _show_config(magics)
        return
    traits = magics.class_traits(config=True)
    as_typed: dict[str, str] = {}  # validation messages name the key the way it was typed
    settings_values: dict[str, str] = {}
    trait_values: dict[str, Any] = {}
    for item in args.assignments:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"%chat config: {item!r} is not KEY=VALUE, e.g. "
                             "CHATCLI_MAX_PAYLOAD=5MB or raise_on_error=False.")
        field = ENV_VARS.get(key.upper(), key.lower().replace("-", "_"))
        if field in {"max_payload", "context_window"} or field not in traits:
            settings_values[field] = value
            as_typed[key] = value
        else:
            trait_values[field] = _trait_value(magics, traits[field], key, value)
    try:
        magics.settings().updated(as_typed, source="setting")
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
    print("set " + ", ".join(args.assignments))


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


def _show_config(magics: ChatMagics) -> None:
    settings = magics.settings()
    overrides = dict(magics.settings_overrides)
    for trait in ("max_payload", "context_window"):
        if getattr(magics, trait) is not None:
            overrides[trait] = getattr(magics, trait)
    for var, field in ENV_VARS.items():
        value = getattr(settings, field)
        source = ("%chat config" if field in overrides
                  else "environment" if os.environ.get(var, "").strip() else "default")
        shown = format_size(value) if field == "max_payload" and value else value
        print(f"{var:<38} {field:<30} {shown!s:<10} ({source})")
    for name in sorted(magics.class_traits(config=True)):
        if name not in {"max_payload", "context_window", "settings_overrides"}:
            print(f"ChatMagics.{name:<27} {getattr(magics, name)!r}")


_EMULATOR_FLAGS = (
    _arg("--context-window", type=int, default=None, metavar="N", help="Context window in tokens."),
    _arg("--max-body", default=None, metavar="SIZE", help="413 above this body size, e.g. 32KB (0 = none)."),
    _arg("--body-limit-style", default=None, metavar="STYLE", help="nginx, cloudflare, aws or envoy."),
    _arg("--waf-over", default=None, metavar="SIZE", help="WAF 403 block page above this size."),
    _arg("--drop-over", default=None, metavar="SIZE", help="Drop the connection above this size."),
    _arg("--max-output-tokens", type=int, default=None, metavar="N", help="Output token limit."),
    _arg("--latency", type=float, default=None, metavar="S", help="Seconds of delay per response."),
)


@_subcommand("emulator", "Restart the built-in emulator with these limits, e.g. --max-body 32KB to "
             "rehearse a proxy (no flags: show the current ones).",
             *_EMULATOR_FLAGS, session_flag=False)
def _emulator(magics: ChatMagics, args: Any) -> None:
    limits: dict[str, Any] = {}
    for key in ("context_window", "max_output_tokens", "latency", "body_limit_style"):
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
    try:
        ws.restart_emulator(limits, notes)
    except (ConfigError, ValueError, TypeError) as e:
        raise UsageError(f"%chat emulator: {e}") from e
    print(f"emulator restarted: {_emulator_limits(magics)}")
    for name, note in notes:
        ws.tell(name, [note])


#: How each emulator limit reads in a status line (plain words, not the flag names).
_LIMIT_WORDS: dict[str, Callable[[Any], str]] = {
    "context_window": lambda v: f"context window {v:,} tokens",
    "max_body": lambda v: f"rejects requests over {format_size(v)} (HTTP 413)",
    "body_limit_style": lambda v: f"{v}-style 413 page",
    "waf_over": lambda v: f"firewall blocks requests over {format_size(v)} (HTTP 403)",
    "drop_over": lambda v: f"drops the connection for requests over {format_size(v)}",
    "max_output_tokens": lambda v: f"answers at most {v:,} tokens",
    "latency": lambda v: f"{v:g} s delay per answer",
}


def _emulator_limits(magics: ChatMagics) -> str:
    limits = magics.workspace.emulator_limits
    if not limits:
        return "default limits (context window 8,192 tokens, no body limit)"
    return "; ".join(_LIMIT_WORDS[key](value) if key in _LIMIT_WORDS
                     else f"{key.replace('_', ' ')} {value}" for key, value in limits.items())


@_subcommand("export", "Write the transcript to PATH (.json or .md), private to you (0600).",
             _arg("path", metavar="PATH", help="Where to write: a .json or .md file."))
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
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as e:
        raise UsageError(f"%chat export: cannot write {args.path!r} ({e.strerror}).") from e
    print(f"exported {len(messages)} messages to {path}")


def _markdown(session: Any, messages: Any) -> str:
    lines = [f"# Chat transcript: {session.name}", "", f"Model: `{session.model}`", ""]
    for message in messages:
        lines += [f"## {message.role.value}", "", message.text or _describe_blocks(message), ""]
    return "\n".join(lines)


@_subcommand("panel", "Show the live context panel of a session (notebooks).")
def _panel(magics: ChatMagics, args: Any) -> Any:
    _session(magics, args)
    return magics.workspace.panel(args.session)


from . import explore  # noqa: E402, F401  (registers %chat explore)
