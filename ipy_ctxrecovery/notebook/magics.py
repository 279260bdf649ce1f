"""The notebook layer: ``%%chat`` and ``%chat`` magics, configured through traitlets.

A thin layer (STYLE: IPython's autoreload): :class:`~ipy_ctxrecovery.session.ChatSession`
does the work; ``ChatMagics`` parses flags, picks the session, shows what happens, and
owns the embedded emulator (started on first use, stopped by ``%unload_ext``).
The ``%chat`` subcommands live in :mod:`ipy_ctxrecovery._subcommands`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Mapping
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments
from traitlets import Bool, Dict, Enum, Float, Int, TraitError, Unicode, Union, observe, validate

from .. import errors
from .. import events as ev
from ..config import ENV_VARS, ConfigError, Settings, format_size
from ..wording import describe
from . import subcommands
from .display import (
    FORMATS,
    Answer,
    EventPrinter,
    Streamer,
    extract_code,
    parse_json_answer,
    usage_dict,
)
from .turn_card import CARD_MODES, TurnCard, TurnRecord, card_wanted
from .workspace import DEFAULT_SESSION, Workspace

__all__ = ["ChatMagics", "get_magics", "load", "unload"]

# Used when only a key is configured: current, non-deprecated models in both SDKs' lists.
DEFAULT_OPENAI_MODEL = "openai:gpt-5.4-mini"
DEFAULT_ANTHROPIC_MODEL = "anthropic:claude-sonnet-5-5"


def auto_model(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The model used when none is configured, and why: a key in the environment, else the emulator."""
    source = os.environ if env is None else env
    if source.get("OPENAI_API_KEY", "").strip():
        return DEFAULT_OPENAI_MODEL, "OPENAI_API_KEY is set"
    if source.get("ANTHROPIC_API_KEY", "").strip():
        return DEFAULT_ANTHROPIC_MODEL, "ANTHROPIC_API_KEY is set"
    return "emulator", "no OPENAI_API_KEY/ANTHROPIC_API_KEY set"


def env_settings(env: Mapping[str, str] | None = None) -> tuple[Settings, list[str]]:
    """Settings from the CHATCLI_* variables, skipping bad ones with one warning line each."""
    source = os.environ if env is None else env
    settings, warnings = Settings(), []
    for var, field_name in ENV_VARS.items():
        raw = source.get(var, "")
        if not raw.strip():
            continue
        try:
            settings = settings.updated({var: raw}, source="environment variable")
        except ConfigError as e:
            default = getattr(Settings(), field_name)
            shown = "none" if default is None else default
            warnings.append(f"⚠ ignoring {var}: {e} Using the default ({shown}).")
    return settings, warnings


@magics_class
class ChatMagics(Magics):
    """Chat with an LLM from notebook cells; long conversations survive their limits.

    ``ChatMagics`` is a traitlets ``Configurable``: set its traits with
    ``%config ChatMagics.<name> = value``, in ``ipython_config.py``
    (``c.ChatMagics.<name> = value``) or with ``%chat config name=value``.

    Precedence, highest first: a flag on the ``%%chat`` line (``-m``, ``--max-tokens``,
    ``-f``, ``--no-stream``, ``--system``) > ``%chat config`` / ``%config`` (the two write the
    same values) > environment variables (``CHATCLI_*`` of the SPEC; an API key picks the
    default model) > built-in defaults.
    """

    default_model = Unicode(
        "", help="Model for %%chat cells without one ('' = emulator unless an API key is set)."
    ).tag(config=True)
    max_payload = Union(
        [Unicode(), Int()], default_value=None, allow_none=True,
        help="Proxy/gateway body cap such as 5MB or 512KB (overrides CHATCLI_MAX_PAYLOAD; 0 = none).",
    ).tag(config=True)
    context_window = Union(
        [Int(), Unicode()], default_value=None, allow_none=True,
        help="Context window in tokens (overrides CHATCLI_CONTEXT_WINDOW and the catalogue).",
    ).tag(config=True)
    max_tokens = Int(None, allow_none=True, help="Default max_tokens for answers.").tag(config=True)
    system = Unicode(None, allow_none=True, help="System prompt for new sessions.").tag(config=True)
    raise_on_error = Bool(
        True, help="A failed chat fails the cell (Run-All stops); False prints the sentence instead."
    ).tag(config=True)
    stream = Bool(True, help="Stream answers as they arrive.").tag(config=True)
    default_format = Enum(FORMATS, "markdown", help="Answer format: " + ", ".join(FORMATS)).tag(
        config=True)
    show_panel = Bool(
        False, help="Also show the session's live panel above its first %%chat cell "
        "(%chat panel shows it anywhere; a saved notebook keeps its last snapshot).",
    ).tag(config=True)
    turn_card = Enum(
        CARD_MODES, "auto",
        help="The static record under each %%chat cell: 'auto' when something happened "
        "(compaction, recovery, failure...), 'always', or 'never'.",
    ).tag(config=True)
    show_events = Bool(True, help="Print one status line per recovery action.").tag(config=True)
    verbose = Bool(False, help="Also print routine pre-flight and end-of-turn lines.").tag(
        config=True)
    live_display = Enum(
        ("auto", "always", "never"), "auto",
        help="Live display handles: 'auto' uses them under a Jupyter kernel, not in a terminal.",
    ).tag(config=True)
    stream_interval = Float(0.1, help="Seconds between streamed display updates.").tag(config=True)
    settings_overrides = Dict(
        help="Other Settings fields set with %chat config (field name -> text value)."
    ).tag(config=True)
    read_file = Bool(
        True, help="Offer the built-in read_file tool (never dotfiles or credential files)."
    ).tag(config=True)
    read_file_root = Unicode(
        None, allow_none=True, help="Directory read_file reads under (None = working directory)."
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.workspace = Workspace(self)
        self._warned: set[str] = set()

    # -- configuration ------------------------------------------------------------------
    @validate("max_payload")
    def _check_max_payload(self, proposal: Any) -> Any:
        value = proposal["value"]
        if value is not None:
            try:
                Settings().updated({"max_payload": value}, source="ChatMagics.max_payload")
            except ConfigError as e:
                raise TraitError(str(e)) from None
        return value

    @validate("context_window")
    def _check_context_window(self, proposal: Any) -> Any:
        value = proposal["value"]
        if value is None:
            return None
        try:
            return Settings().updated({"context_window": value}).context_window
        except ConfigError as e:
            raise TraitError(str(e)) from None

    @validate("max_tokens")
    def _check_max_tokens(self, proposal: Any) -> Any:
        value = proposal["value"]
        if value is not None and value < 1:
            raise TraitError(f"max_tokens {value} is too small; give a positive number, "
                             "or None for the model's default")
        return value

    @validate("read_file_root")
    def _check_read_file_root(self, proposal: Any) -> Any:
        try:
            return Settings().updated({"read_file_root": proposal["value"]}).read_file_root
        except ConfigError as e:
            raise TraitError(str(e)) from None

    @observe("max_payload", "context_window", "settings_overrides", "read_file",
             "read_file_root")
    def _settings_changed(self, change: Any) -> None:
        # Updated in place: a cap learned from a rejection and the usage counters stay.
        settings = self.settings()
        for name, session in self.workspace.sessions.items():
            self.workspace.tell(name, session.update(settings=settings))

    @observe("max_tokens")
    def _max_tokens_changed(self, change: Any) -> None:
        for session in self.workspace.sessions.values():
            session.update(max_tokens=change["new"])

    def settings(self) -> Settings:
        """The effective Settings: env vars, then %config/%chat config values on top."""
        base, warnings = env_settings()
        for line in warnings:
            self.warn_once(line)
        values: dict[str, Any] = dict(self.settings_overrides)
        if self.max_payload is not None:
            values["max_payload"] = self.max_payload
        if self.context_window is not None:
            values["context_window"] = self.context_window
        if not self.read_file:
            values["read_file"] = False
        if self.read_file_root is not None:
            values["read_file_root"] = self.read_file_root
        try:
            return base.updated(values, source="setting")
        except ConfigError as e:
            self.warn_once(f"⚠ ignoring %chat config values: {e}")
            return base

    def model(self) -> str:
        return self.default_model.strip() or auto_model()[0]

    def warn_once(self, line: str) -> None:
        if line not in self._warned:
            self._warned.add(line)
            print(line, file=sys.stderr)

    def is_live(self) -> bool:
        if self.live_display == "always":
            return True
        if self.live_display == "never":
            return False
        return getattr(self.shell, "kernel", None) is not None

    # -- panels ----------------------------------------------------------------------------
    def show_panel_for(self, name: str) -> None:
        if not (self.show_panel and self.is_live()):
            return
        panel = self.workspace.panel(name)
        if not panel.shown:
            panel.show()

    def show_card(self, record: TurnRecord) -> None:
        """Write the turn's static card under the cell (``turn_card``; notebook front ends)."""
        if self.is_live() and card_wanted(self.turn_card, record):
            from IPython.display import display

            display(TurnCard(record))

    def close(self) -> None:
        """Close panels, sessions and the emulator (``%unload_ext``)."""
        self.workspace.close()

    # -- %%chat ----------------------------------------------------------------------------
    @no_var_expand
    @magic_arguments(name="%chat")  # the help formatter adds one "%": the usage reads %%chat
    @argument("MODEL", nargs="?", default=None,
              help="Model: openai:MODEL, anthropic:MODEL, emulator or emulator:anthropic.")
    @argument("-m", "--model", dest="model_flag", default=None, metavar="MODEL",
              help="Model (same as the positional MODEL).")
    @argument("-S", "--session", default=DEFAULT_SESSION, metavar="NAME",
              help="Named conversation (default: one per kernel).")
    @argument("-f", "--format", choices=FORMATS, default=None,
              help="markdown (default), text, code (answer goes to a new cell) or json.")
    @argument("--system", default=None, metavar="TEXT", help="System prompt for this session.")
    @argument("--max-tokens", type=int, default=None, metavar="N",
              help="Output token limit for this answer.")
    @argument("--new", action="store_true", help="Start this session afresh.")
    @argument("--no-history", action="store_true", help="Don't record this exchange.")
    @argument("--no-stream", action="store_true", help="Show the answer only when complete.")
    @argument("-o", "--option", nargs=2, action="append", metavar=("KEY", "VALUE"), default=None,
              help="Extra model option, e.g. -o temperature 0.2 (repeatable).")
    @argument("--no-read-file", action="store_true",
              help="Answer this cell without the built-in read_file tool.")
    @argument("--tools", default=None, metavar="NAME,...",
              help="Comma-separated @chat_tool names to offer (they stay offered in the session).")
    @cell_magic("chat")
    def chat_cell(self, line: str, cell: str) -> Answer | None:
        """Send the cell body, as written, as the user message of a conversation.

        The answer streams into the cell and is the cell's result (``Out[n]``, ``_``);
        end the ``%%chat`` line or the body with ``;`` to silence it. When recovery is exhausted
        the cell fails with one sentence (``%config ChatMagics.raise_on_error = False`` to
        print it instead). Recovery actions are shown one line each.
        """
        line = line.strip()
        cell = cell.rstrip("\r\n")  # the cell's own line end is not part of the message
        silent = line.endswith(";") or cell.rstrip().endswith(";")
        args = self._parse(self.chat_cell.parser, line.rstrip(";"), "%%chat")
        model = self._pick_model(args)
        fmt = args.format or self.default_format
        max_tokens = args.max_tokens if args.max_tokens is not None else self.max_tokens
        if max_tokens is not None and max_tokens < 1:
            raise UsageError(f"--max-tokens {max_tokens} is too small; give a positive number.")
        options = _parse_options(args.option or [])
        tools = _lookup_tools(args.tools)
        session = self._session_for_cell(args.session, model, args, tools)
        self.show_panel_for(args.session)

        stream = self.stream and not args.no_stream
        # A silenced cell (";") shows no answer at all, so it does not stream one either.
        streamer = Streamer(live=stream and self.is_live() and not silent, fmt=fmt,
                            interval=self.stream_interval)
        printer = EventPrinter(verbose=self.verbose) if self.show_events else None
        # Escalations, and the session's own "still cut" event where it has one.
        cut_events: list[ev.Event] = []
        watched = tuple(k for k in (ev.Escalation, getattr(ev, "Truncated", None)) if k)
        subscriptions = [session.subscribe(printer)] if printer else []
        subscriptions.append(session.subscribe(
            lambda e: cut_events.append(e) if isinstance(e, watched) else None))
        record = self._turn_record(args.session, session)
        subscriptions.append(session.subscribe(record.feed))
        panel = self.workspace.panels.get(args.session)
        on_text = _tee(streamer, record.text_arrived, panel.text_arrived if panel else None)
        if panel is not None:
            panel.begin_turn()
        started = time.monotonic()
        answered = interrupted = False
        failure: errors.ChatError | None = None
        try:
            with session.offering(builtin_tools=not args.no_read_file):
                reply = session.send(cell, max_tokens=max_tokens, stream=stream,
                                     on_text=on_text if stream else None,
                                     record=not args.no_history, options=options or None)
            answered = True
        except errors.ChatError as e:
            failure = e
        except KeyboardInterrupt:
            # Ctrl-C, or the panel's Cancel: the history is as before; the card says so.
            interrupted = True
            record.interrupted()
            raise
        finally:
            # A failure or an interrupt leaves the partial streamed text as the user saw it.
            if not answered:
                streamer.finish()
            for unsubscribe in subscriptions:
                unsubscribe()
            if panel is not None:
                panel.end_turn(interrupted=interrupted)
            record.finish(elapsed=time.monotonic() - started)
            if not answered:
                self.show_card(record)  # under the partial answer, before the cell fails
        if failure is not None:
            self.fail(str(failure), failure)
            return None
        record.finish(elapsed=record.elapsed or 0.0,
                      prompt_tokens=reply.usage.prompt_tokens or 0,
                      completion_tokens=reply.usage.completion_tokens or 0)
        answer = self._answer(reply, fmt, args.session)
        if answer.finish_reason == "length":
            told = [e for e in cut_events if not isinstance(e, ev.Escalation)]
            if not told:
                print(_still_cut([e for e in cut_events if isinstance(e, ev.Escalation)],
                                 max_tokens))
            elif printer is None:  # the printer, when on, showed the session's line already
                print(describe(told[-1]))
        if fmt == "code":
            assert self.shell is not None
            self.shell.set_next_input(extract_code(answer), replace=False)
        if silent:
            self.show_card(record)
            return None
        if not self._is_cell_result():
            streamer.finish()  # called from code: the streamed text is all the user sees
            self.show_card(record)
            return answer
        if streamer.finish(answer):
            # The streamed area now holds the answer: returning it too would show it twice
            # (and leave an empty output if the area were cleared), so it is put in Out[n]
            # and _ the way IPython's display hook does, and the cell returns None.
            self._store_result(answer)
            self.show_card(record)
            return None
        if self.is_live() and card_wanted(self.turn_card, record):
            # The card goes under the answer: the answer is displayed here, then the card.
            from IPython.display import display

            display(answer)
            self._store_result(answer)
            self.show_card(record)
            return None
        return answer

    def _turn_record(self, name: str, session: Any) -> TurnRecord:
        """A record of the coming turn, starting from the session's cap and window."""
        return TurnRecord(session=name, estimate=session.estimator.estimate,
                          cap=session.caps.effective(), cap_source=session.caps.source,
                          window=session.window)

    def _store_result(self, answer: Answer) -> None:
        hook = getattr(self.shell, "displayhook", None)
        if hook is None:
            return
        hook.update_user_ns(answer)
        hook.fill_exec_result(answer)

    def _is_cell_result(self) -> bool:
        """True when this call is the running cell's own ``%%chat`` (IPython displays its value)."""
        history = getattr(self.shell, "history_manager", None)
        raw = history.input_hist_raw if history is not None else []
        return bool(raw) and raw[-1].lstrip().startswith("%%chat")

    def _parse(self, parser: Any, line: str, prog: str) -> Any:
        try:
            return parser.parse_args(shlex.split(line))
        except ValueError as e:  # shlex: an unbalanced quote
            raise UsageError(f"{prog}: cannot parse the line ({e}); check the quotes.") from e
        except UsageError as e:
            raise UsageError(f"{prog}: {e}; see {prog}? for the options.") from e

    def _pick_model(self, args: Any) -> str | None:
        if args.MODEL and args.model_flag and args.model_flag != args.MODEL:
            raise UsageError(f"two models given ({args.MODEL} and -m {args.model_flag}); "
                             "give only one.")
        return args.MODEL or args.model_flag

    def _session_for_cell(self, name: str, model: str | None, args: Any,
                          tools: tuple[Any, ...]) -> Any:
        ws = self.workspace
        existing = ws.sessions.get(name)
        if existing is None or args.new:
            session = ws.new_session(name, model or self.model(), system=args.system,
                                     tools=tools)
            ws.replace_session(name, session)
            return session
        if args.system is not None and args.system != existing.system:
            raise UsageError(f"--system applies when a session starts; add --new to restart "
                             f"session {name!r} with it.")
        # Same conversation, perhaps on another model or with more tools.
        return ws.update_session(name, model=model, tools=tools)

    def fail(self, sentence: str, error: BaseException) -> None:
        """A chat that failed for good: fail the cell, or print (``raise_on_error``)."""
        if self.raise_on_error:
            # IPython prints a UsageError as one line, without a traceback, and the cell
            # fails, so Run-All stops.
            raise UsageError(sentence) from error
        print(sentence, file=sys.stderr)
        return None

    def _answer(self, reply: Any, fmt: str, name: str) -> Answer:
        usage = usage_dict(getattr(reply, "usage", None))
        self.workspace.answered(name)
        actions = list(reply.actions)
        answer = Answer(reply.text or "", model=str(getattr(reply, "model", "")), usage=usage,
                        actions=actions, finish_reason=_str(getattr(reply, "finish_reason", None)),
                        answer_format=fmt, session=name)
        if fmt == "json":
            try:
                parse_json_answer(answer)
            except ValueError:
                print("ℹ the answer is not valid JSON; returned as text", file=sys.stderr)
        return answer

    # -- %chat -----------------------------------------------------------------------------
    @line_magic("chat")
    def chat_line(self, line: str) -> Any:
        """Manage conversations: ``%chat SUBCOMMAND [args]``; ``%chat help`` lists them."""
        return subcommands.run_subcommand(self, line)


ChatMagics.chat_line.__doc__ = (ChatMagics.chat_line.__doc__ or "") + "\n\n" + \
    subcommands.summary_text()


def _still_cut(escalations: list[Any], requested: int | None) -> str:
    """One line for an answer still cut at the token limit once escalations ran out."""
    limit = escalations[-1].max_tokens if escalations else requested
    at = f"max_tokens={limit:,}" if limit else "the model's output limit"
    tried = (f"after {len(escalations)} escalation{'s' if len(escalations) != 1 else ''}"
             if escalations else "with no escalation left")
    return (f"⚠ answer still cut at {at} {tried} — raise --max-tokens or "
            "CHATCLI_MAX_TOKEN_ESCALATIONS, or ask for a shorter answer")


def _tee(*callbacks: Any) -> Any:
    """One ``on_text`` callback calling each of ``callbacks`` (None ones skipped)."""
    chosen = [c for c in callbacks if c is not None]

    def on_text(delta: str) -> None:
        for callback in chosen:
            callback(delta)

    return on_text


def _str(value: Any) -> str | None:
    return None if value is None else str(getattr(value, "value", value))


def _parse_options(pairs: list[list[str]]) -> dict[str, Any]:
    """``-o KEY VALUE`` pairs; a VALUE that parses as JSON (0.2, true, [1]) is used as such."""
    options: dict[str, Any] = {}
    for key, raw in pairs:
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


def _lookup_tools(names: str | None) -> tuple[Any, ...]:
    if not names:
        return ()
    from .. import tools as tools_module

    registry = tools_module.registered_tools()
    chosen = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if name not in registry:
            known = ", ".join(sorted(registry)) or "none registered yet — use @chat_tool"
            raise UsageError(f"--tools: no tool named {name!r}; known tools: {known}.")
        chosen.append(registry[name])
    return tuple(chosen)


# -- IPython connectivity -------------------------------------------------------------------

def get_magics(shell: Any = None) -> ChatMagics | None:
    """The loaded ChatMagics of ``shell`` (default: the running one), or None."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is None:
        return None
    found = shell.magics_manager.registry.get("ChatMagics")
    return found if isinstance(found, ChatMagics) else None


def load(ipython: Any) -> None:
    """Register the magics and print one line: the default model and the active cap."""
    # Magics.__init__ adds the instance to shell.configurables (so %config finds it) and
    # would take the shell as parent, failing on a bad value from ipython_config.py; the
    # values are applied one at a time instead, a bad one skipped with a warning.
    magics = ChatMagics(shell=ipython, parent=None)
    for key, value in dict(ipython.config.get("ChatMagics", {})).items():
        try:
            setattr(magics, key, value)
        except (TraitError, ValueError, TypeError, AttributeError) as e:
            print(f"⚠ ignoring ChatMagics.{key}: {e} Using the default.", file=sys.stderr)
    ipython.register_magics(magics)
    settings = magics.settings()
    model = magics.model()
    reason = "" if magics.default_model.strip() else f" ({auto_model()[1]})"
    cap = (f"payload cap {format_size(settings.max_payload)}" if settings.max_payload
           else "no payload cap configured")
    print(f"ipy_ctxrecovery: %%chat uses {model}{reason}; {cap}. %chat help lists commands.")


def unload(ipython: Any) -> None:
    """Unregister the magics, close sessions and stop the embedded emulator."""
    magics = get_magics(ipython)
    if magics is None:
        return
    magics.close()
    manager = ipython.magics_manager
    for kind in ("line", "cell"):
        if manager.magics[kind].get("chat") is not None:
            del manager.magics[kind]["chat"]
    manager.registry.pop("ChatMagics", None)
    ipython.configurables[:] = [c for c in ipython.configurables if c is not magics]

