"""The notebook layer: ``%%chat`` and ``%chat`` magics, configured through traitlets.

A thin layer (STYLE: IPython's autoreload): :class:`~ipy_ctxrecovery.session.ChatSession`
does the work; ``ChatMagics`` parses flags, picks the session, shows what happens, and
owns the embedded emulator (started on first use, stopped by ``%unload_ext``).
The ``%chat`` subcommands live in :mod:`.subcommands`, the plain-text output in
:mod:`.display`; every line's wording comes from :mod:`ipy_ctxrecovery.wording`.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments
from traitlets import Bool, Dict, Enum, Float, Int, TraitError, Unicode, Union, observe, validate
from traitlets.config import Config

from .. import errors
from ..core import events as ev
from ..core.wording import (
    VERBOSITIES,
    max_tokens_above_limit_line,
    plural,
)
from ..settings import ConfigError, Settings, format_size
from . import (
    explore,  # noqa: F401  (registers %chat explore)
    subcommands,
)
from .cell_cancel import CellCancel
from .cell_inputs import (
    cell_error_text,
    check_model_word,
    check_options,
    interpolate,
    parse_options,
    whole_number,
)
from .display import (
    FORMATS,
    Answer,
    ChatInterrupted,
    EventPrinter,
    Streamer,
    StreamMode,
    event_record,
    extract_code,
    parse_json_answer,
    usage_dict,
)
from .environment import (
    auto_model,
    base_url_problem,
    default_endpoint,
    describe_endpoint,
    env_settings,
)
from .panel import kernel_id
from .turn_card import CARD_MODES, TurnCard, TurnRecord, card_wanted
from .workspace import DEFAULT_SESSION, Workspace

__all__ = ["ChatInterrupted", "ChatMagics", "get_magics", "load", "unload"]

def _accepted(trait: Any) -> str:
    """What a trait takes, in words (for a refused value)."""
    if isinstance(trait, Enum):
        return "use one of " + ", ".join(str(v) for v in trait.values or ())
    if isinstance(trait, Bool):
        return "use True or False"
    if isinstance(trait, Int):
        return "use a whole number" + (" or None" if trait.allow_none else "")
    if isinstance(trait, Float):
        return "use a number"
    if isinstance(trait, Unicode):
        return "use a text" + (" or None" if trait.allow_none else "")
    return "see %config ChatMagics for what it takes"


MAX_STREAM_INTERVAL = 3600.0
"""The longest ``stream_interval`` taken (an hour: the answer shows once, at its end)."""


@magics_class
class ChatMagics(Magics):
    """Chat with an LLM from notebook cells; long conversations survive their limits.

    ``ChatMagics`` is a traitlets ``Configurable``: set its traits with
    ``%config ChatMagics.<name> = value``, in ``ipython_config.py``
    (``c.ChatMagics.<name> = value``) or with ``%chat config name=value``. A bad value is
    refused with one sentence and the setting keeps its value.

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
    verbosity = Enum(
        VERBOSITIES, "normal",
        help="Status lines: 'quiet' (only a cut answer or dropped context), 'normal' (one "
             "line per thing that happened) or 'debug' (every step with its numbers; the "
             "output's metadata always has them).",
    ).tag(config=True)
    show_events = Bool(
        True, help="Deprecated: False is verbosity = 'quiet'.").tag(config=True)
    verbose = Bool(False, help="Deprecated: True is verbosity = 'debug'.").tag(config=True)
    live_display = Enum(
        ("auto", "always", "print", "never"), "auto",
        help="How an answer streams: 'auto' into a display area under a Jupyter kernel and "
             "as printed text in a terminal; 'always' a display area; 'print' printed text; "
             "'never' shown once, complete.",
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
        self.failed_cells: dict[int, tuple[str, str]] = {}
        """Execution count -> (source, traceback) of cells that raised (``Err[n]``)."""

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

    @validate("stream_interval")
    def _check_stream_interval(self, proposal: Any) -> Any:
        value = proposal["value"]
        if not 0 <= value <= MAX_STREAM_INTERVAL:
            raise TraitError(f"stream_interval {value!r} is not a number of seconds from 0 to "
                             f"{MAX_STREAM_INTERVAL:g}; give e.g. 0.1 (0: every piece as it "
                             "arrives)")
        return value

    @validate("read_file_root")
    def _check_read_file_root(self, proposal: Any) -> Any:
        try:
            return Settings().updated({"read_file_root": proposal["value"]}).read_file_root
        except ConfigError as e:
            raise TraitError(str(e)) from None

    @observe("show_events")
    def _show_events_changed(self, change: Any) -> None:
        if not change["new"]:
            self.verbosity = "quiet"
        elif self.verbosity == "quiet":
            self.verbosity = "normal"

    @observe("verbose")
    def _verbose_changed(self, change: Any) -> None:
        if change["new"]:
            self.verbosity = "debug"
        elif self.verbosity == "debug":
            self.verbosity = "normal"

    def update_config(self, config: Config) -> None:
        """``%config ChatMagics.x = v``: a value this class refuses is said in one sentence
        (not logged as an error) and kept out of the shell's configuration, so it is not
        applied again by ``%reload_ext``; the setting keeps its value."""
        mine = config.get("ChatMagics")
        if isinstance(mine, Config):
            for key in list(mine):
                problem = self.refusal(key, mine[key])
                if problem is None:
                    continue
                print(f"⚠ %config ChatMagics.{key}: {problem} It stays "
                      f"{getattr(self, key, None)!r}.", file=sys.stderr, flush=True)
                del mine[key]
                self._forget_shell_value(key)
        super().update_config(config)

    def refusal(self, key: str, value: Any) -> str | None:
        """Why ``value`` cannot be set as trait ``key`` (one sentence), or None when it can."""
        trait = self.traits(config=True).get(key)
        if trait is None:
            return None      # traitlets warns about an unknown name itself
        try:
            trait._validate(self, value)
        except TraitError as e:
            text = str(e).strip()
            if not text.startswith(key):     # traitlets' own wording: say what is accepted
                text = f"{key}={value!r} is not valid; {_accepted(trait)}"
            return text.rstrip(".") + "."
        return None

    def _forget_shell_value(self, key: str) -> None:
        """The shell merges a %config line into its own configuration before this class
        sees it: a refused value is replaced there by the one in force (or removed)."""
        shell_config = getattr(self.shell, "config", None)
        section = shell_config.get("ChatMagics") if shell_config is not None else None
        if not isinstance(section, Config) or key not in section:
            return
        if self.trait_has_value(key) and getattr(self, key) != self.trait_defaults(key):
            section[key] = getattr(self, key)
        else:
            del section[key]

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
            print(line, file=sys.stderr, flush=True)

    def stream_mode(self) -> StreamMode:
        """How answers stream here: ``display``, ``print`` or ``off`` (``live_display``)."""
        if self.live_display == "always":
            return "display"
        if self.live_display == "print":
            return "print"
        if self.live_display == "never":
            return "off"
        return "display" if self.is_kernel() else "print"

    def is_kernel(self) -> bool:
        return getattr(self.shell, "kernel", None) is not None

    def is_live(self) -> bool:
        """Display handles are available (a Jupyter front end, or ``live_display='always'``)."""
        return self.stream_mode() == "display"

    # -- panels ----------------------------------------------------------------------------
    def show_panel_for(self, name: str) -> None:
        if not (self.show_panel and self.is_live()):
            return
        panel = self.workspace.panel(name)
        if not panel.shown:
            panel.show()

    def cell_cancel(self) -> CellCancel | None:
        """A Cancel for the running cell's output while a summary runs (subscribe it to the
        session; close it when the turn ends), or None where there is no front end."""
        return CellCancel(kernel_id=kernel_id()) if self.is_live() else None

    def show_card(self, record: TurnRecord) -> None:
        """Write the turn's static card under the cell (``turn_card``; notebook front ends)."""
        if self.is_live() and card_wanted(self.turn_card, record):
            from IPython.display import display

            display(TurnCard(record))

    def close(self) -> None:
        """Close panels, sessions and the emulator (``%unload_ext``)."""
        self.workspace.close()

    # -- failed cells (Err[n], %chat error) --------------------------------------------------
    def last_failed_cell(self) -> tuple[str, str] | None:
        """(source, traceback) of the latest cell that raised, not counting chat cells (their
        failure is already one sentence); else the last exception IPython kept."""
        for count in sorted(self.failed_cells, reverse=True):
            source, trace = self.failed_cells[count]
            if not source.lstrip().startswith(("%chat", "%%chat")):
                return source, trace
        error = getattr(sys, "last_value", None)
        if isinstance(error, BaseException) and not isinstance(error, UsageError):
            return "", cell_error_text(error)
        return None

    def record_cell(self, result: Any) -> None:
        """``post_run_cell`` hook: keep the source and traceback of a cell that raised."""
        error = getattr(result, "error_in_exec", None)
        count = getattr(result, "execution_count", None)
        if error is None or count is None:
            return
        source = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        self.failed_cells[count] = (source, cell_error_text(error))
        for old in sorted(self.failed_cells)[:-50]:     # the recent ones are what is asked
            del self.failed_cells[old]

    # -- %%chat ----------------------------------------------------------------------------
    @no_var_expand
    @magic_arguments(name="%chat")  # the help formatter adds one "%": the usage reads %%chat
    @argument("MODEL", nargs="?", default=None,
              help="Model: openai:MODEL, anthropic:MODEL, emulator or emulator:anthropic "
                   "(%%chat models lists the known ones). The message itself goes in the cell "
                   "body, never on this line.")
    @argument("-m", "--model", dest="model_flag", default=None, metavar="MODEL",
              help="Model (same as the positional MODEL).")
    @argument("-S", "--session", default=DEFAULT_SESSION, metavar="NAME",
              help="Named conversation (default: one per kernel).")
    @argument("-f", "--format", choices=FORMATS, default=None,
              help="markdown (default), text, code (every code block of the answer, with its "
                   "language, goes to a new cell) or json.")
    @argument("-s", "--system", default=None, metavar="TEXT",
              help="System prompt for this session.")
    @argument("-i", "--interpolate", action="store_true",
              help="Fill in {name} from the kernel's variables, {In[3]}/{Out[3]} from cell 3's "
                   "input/output and {Err[3]} from its traceback ({{ }} for literal braces). "
                   "Off by default because code pasted into a message is full of braces.")
    @argument("--max-tokens", type=whole_number, default=None, metavar="N",
              help="Output token limit for this answer (at most the model's own limit).")
    @argument("--new", action="store_true",
              help="Start a new conversation (a saved one under this name is kept under a "
                   "name of its own).")
    @argument("-c", "--continue", dest="continue_", action="store_true",
              help="Continue the most recently used saved session (like llm -c).")
    @argument("--no-history", action="store_true", help="Don't record this exchange.")
    @argument("--no-stream", action="store_true", help="Show the answer only when complete.")
    @argument("-o", "--option", nargs=2, action="append", metavar=("KEY", "VALUE"), default=None,
              help="Model option the provider's SDK takes, e.g. -o temperature 0.2 (repeatable; "
                   "checked against its parameters). -o extra.KEY VALUE sends any other field "
                   "as is, e.g. -o extra.top_k 40 for a vLLM server.")
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
        print it instead). What recovery does is shown one line per step
        (``%config ChatMagics.verbosity = "quiet" | "normal" | "debug"``); Ctrl-C stops a
        request and leaves the history as it was before the cell.
        """
        return self.chat(line, cell, as_result=self._is_cell_result())

    def chat(self, line: str, cell: str, *, as_result: bool) -> Answer | None:
        """One ``%%chat``: ``as_result`` when the answer is the running cell's own result
        (then it is shown once, where it streamed); otherwise it is returned to the code
        that called it, after being shown live (a loop of calls shows every answer)."""
        line = line.strip()
        cell = cell.rstrip("\r\n")  # the cell's own line end is not part of the message
        silent = line.endswith(";") or cell.rstrip().endswith(";")
        args = self._parse(self.chat_cell.parser, line.rstrip(";"), "%%chat")
        model = self._pick_model(args)
        if args.interpolate:
            assert self.shell is not None
            errors_by_cell = {n: text for n, (_, text) in self.failed_cells.items()}
            cell = interpolate(cell, self.shell.user_ns, errors_by_cell)
        if not cell.strip():
            raise UsageError("%%chat: the cell has no message; write it below the %%chat line.")
        fmt = args.format or self.default_format
        max_tokens = args.max_tokens if args.max_tokens is not None else self.max_tokens
        if max_tokens is not None and max_tokens < 1:
            raise UsageError(f"--max-tokens {max_tokens} is too small; give a positive number.")
        tools = _lookup_tools(args.tools)
        args.session, session = self._session_for_cell(args.session, model, args, tools)
        options = check_options(parse_options(args.option or []), session.provider)
        self.show_panel_for(args.session)

        stream = self.stream and not args.no_stream
        # A silenced cell (";") shows no answer at all, so it does not stream one either.
        mode: StreamMode = self.stream_mode() if stream and not silent else "off"
        streamer = Streamer(mode=mode, fmt=fmt, interval=self.stream_interval,
                            mask=session.redactor.stored)
        printer = EventPrinter(verbosity=self.verbosity, before_line=streamer.break_line,
                               mid_line=lambda: streamer.line_open,
                               model_limit=None if session.info.guessed else session.output_cap,
                               model=session.model)
        if max_tokens is not None and not session.info.guessed \
                and max_tokens > session.output_cap:
            printer.say(max_tokens_above_limit_line(max_tokens, session.output_cap,
                                                    session.model))
            max_tokens = session.output_cap
        subscriptions = [session.subscribe(printer)]
        record = self._turn_record(args.session, session)
        subscriptions.append(session.subscribe(record.feed))
        canceller = self.cell_cancel()
        if canceller is not None:    # Cancel in this cell's output while a summary runs
            subscriptions.append(session.subscribe(canceller))
        panel = self.workspace.panels.get(args.session)
        on_text = _tee(streamer, record.text_arrived, panel.text_arrived if panel else None)
        if panel is not None:
            panel.begin_turn(cell=record.cell)
        started = time.monotonic()
        answered = interrupted = False
        failure: errors.ChatError | None = None
        try:
            with session.offering(builtin_tools=not args.no_read_file):
                reply = session.send(cell, max_tokens=max_tokens, stream=stream,
                                     on_text=on_text if stream else None,
                                     record=not args.no_history, options=options or None)
            answered = True
            printer.release()        # an escalation's line, after the answer it continued
        except errors.ChatError as e:
            failure = e
        except errors.CtxRecoveryError as e:   # bad input (a message that cannot be stored,
            raise UsageError(str(e)) from e      # a session open elsewhere): one sentence
        except KeyboardInterrupt:
            # Ctrl-C, or the panel's Cancel: the history is as before; the card says so.
            interrupted = True
            record.interrupted()
            record.kept_messages = len(session.history)    # the card counts the same
            kept = (f"the working history is as it was before this cell "
                    f"({plural(record.kept_messages, 'message')})")
            said = "your message stays in the transcript" if not args.no_history else \
                "nothing was recorded"
            streamer.break_line()
            raise ChatInterrupted(f"the request was interrupted — {kept}; {said}.") from None
        finally:
            # A failure or an interrupt leaves the partial streamed text as the user saw it.
            if not answered:
                record.kept_messages = len(session.history)
                streamer.finish()
                printer.release()
            if canceller is not None:
                canceller.close(interrupted=interrupted)
            for unsubscribe in subscriptions:
                unsubscribe()
            if panel is not None:
                panel.end_turn(interrupted=interrupted)
            record.finish(elapsed=time.monotonic() - started)
            record.ended_at = time.time()
            self.workspace.last_turns[args.session] = record
            if not answered:
                self.show_card(record)  # under the partial answer, before the cell fails
        if failure is not None:
            self.fail(str(failure), failure)
            return None
        record.finish(elapsed=record.elapsed or 0.0,
                      prompt_tokens=reply.usage.prompt_tokens or 0,
                      completion_tokens=reply.usage.completion_tokens or 0,
                      cached_tokens=getattr(reply.usage, "cached_tokens", 0) or 0,
                      cache_write_tokens=getattr(reply.usage, "cache_write_tokens", 0) or 0,
                      cache_write_1h_tokens=getattr(reply.usage, "cache_write_1h_tokens", 0) or 0)
        if _str(reply.finish_reason) == "length" \
                and not any(isinstance(e, ev.Truncated) for e in printer.events):
            # Cut with no escalation event (a cut tool call, say): still said once.
            cuts = [e for e in printer.events if isinstance(e, ev.Escalation)]
            limit = cuts[-1].max_tokens if cuts else (max_tokens or session.output_cap)
            printer(ev.Truncated(max_tokens=limit, escalations=len(cuts)))
        answer = self._answer(reply, fmt, args.session, printer, session.redactor.stored)
        if fmt == "code":
            assert self.shell is not None
            code = extract_code(answer)
            if code is None:
                print("ℹ -f code: the answer has no code block and is not Python as it stands, "
                      "so no cell was made from it.", file=sys.stderr)
            else:
                self.shell.set_next_input(code, replace=False)
        if silent:
            streamer.finish()
            self.show_card(record)
            return None
        if not as_result:
            if not streamer.finish(answer):
                # Nothing was shown live (--no-stream, live_display='never'): show it now, so
                # a loop of calls shows every answer; it is not shown a second time.
                self._display(answer)
            self.show_card(record)
            return answer
        if streamer.finish(answer):
            # The streamed area (or the printed text) is the answer: returning it too would
            # show it twice (and leave an empty output if the area were cleared), so it is put
            # in Out[n] and _ the way IPython's display hook does, and the cell returns None.
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

    def _display(self, answer: Answer) -> None:
        from IPython.display import display

        display(answer)
        answer.shown = True

    def _turn_record(self, name: str, session: Any) -> TurnRecord:
        """A record of the coming turn, starting from the session's cap and window."""
        return TurnRecord(session=name, estimate=session.estimator.estimate,
                          cap=session.caps.effective(), cap_source=session.caps.source,
                          window=session.window, cell=self._cell(),
                          model=str(session.model), prices=session.settings.prices)

    def _cell(self) -> int | None:
        """The running cell's execution count (None outside a shell). The display hook's
        ``prompt_count`` is the running cell's ``In [N]`` in every IPython: IPython 9 moves
        ``execution_count`` on before the cell runs, IPython 8 after."""
        hook = getattr(self.shell, "displayhook", None)
        count = getattr(hook, "prompt_count", None)
        if not isinstance(count, int):
            count = getattr(self.shell, "execution_count", None)
        return count if isinstance(count, int) else None

    def _store_result(self, answer: Answer) -> None:
        hook = getattr(self.shell, "displayhook", None)
        if hook is None:
            return
        hook.update_user_ns(answer)
        hook.fill_exec_result(answer)

    def _is_cell_result(self) -> bool:
        """True when this call is the running cell's own ``%%chat`` (IPython displays its value)."""
        return self.is_cell_result("%%chat")

    def is_cell_result(self, prefix: str) -> bool:
        """True when the running cell is ``prefix …`` itself, not code calling the magic."""
        history = getattr(self.shell, "history_manager", None)
        raw = history.input_hist_raw if history is not None else []
        return bool(raw) and raw[-1].lstrip().startswith(prefix)

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
        model = args.MODEL or args.model_flag
        if model is not None:
            check_model_word(model, positional=bool(args.MODEL))
        return model

    def _session_for_cell(self, name: str, model: str | None, args: Any,
                          tools: tuple[Any, ...]) -> tuple[str, Any]:
        ws = self.workspace
        if args.continue_:
            if args.new or name != DEFAULT_SESSION:
                raise UsageError("-c/--continue picks the latest saved session itself; give "
                                 "it without -S or --new.")
            return ws.continue_latest(model, tools)
        return name, ws.open_session(name, model, system=args.system, tools=tools,
                                     new=args.new)

    def fail(self, sentence: str, error: BaseException) -> None:
        """A chat that failed for good: fail the cell, or print (``raise_on_error``)."""
        if self.raise_on_error:
            # IPython prints a UsageError as one line, without a traceback, and the cell
            # fails, so Run-All stops.
            raise UsageError(sentence) from error
        print(sentence, file=sys.stderr)
        return None

    def _answer(self, reply: Any, fmt: str, name: str, printer: EventPrinter,
                mask: Callable[[str], str]) -> Answer:
        """The answer as shown and returned: masked as the transcript keeps it (the
        session's credentials, and the well-known secret formats unless opted out)."""
        usage = usage_dict(getattr(reply, "usage", None))
        answer = Answer(mask(reply.text or ""), model=str(getattr(reply, "model", "")), usage=usage,
                        actions=list(reply.actions),
                        finish_reason=_str(getattr(reply, "finish_reason", None)),
                        answer_format=fmt, session=name,
                        events=[event_record(e) for e in printer.events])
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


def _tee(*callbacks: Any) -> Any:
    """One ``on_text`` callback calling each of ``callbacks`` (None ones skipped)."""
    chosen = [c for c in callbacks if c is not None]

    def on_text(delta: str) -> None:
        for callback in chosen:
            callback(delta)

    return on_text


def _str(value: Any) -> str | None:
    return None if value is None else str(getattr(value, "value", value))


_BUILTIN_TOOL = "read_file"
"""The tool the package offers itself (``session/tools.py``), not one ``--tools`` names."""


def _lookup_tools(names: str | None) -> tuple[Any, ...]:
    if not names:
        return ()
    from ..session import tools as tools_module

    registry = tools_module.registered_tools()
    if not names.replace(",", "").strip():
        raise UsageError(f"--tools {names!r} names no tool; give names separated by commas, "
                         "e.g. --tools search,lookup.")
    chosen = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if name == _BUILTIN_TOOL:
            raise UsageError(f"--tools: {name} is built in and offered without --tools "
                             "(unless --no-read-file or read_file=False).")
        if name not in registry:
            known = (f"registered with @chat_tool: {', '.join(sorted(registry))}" if registry
                     else "none is registered with @chat_tool yet")
            raise UsageError(f"--tools: no tool named {name!r}; {known} ({_BUILTIN_TOOL} is "
                             "built in and offered without --tools).")
        chosen.append(registry[name])
    return tuple(chosen)


# -- IPython connectivity -------------------------------------------------------------------

_SEMICOLON_MAGIC = re.compile(r"^(\s*%%chat);")


def semicolon_after_magic(lines: list[str]) -> list[str]:
    """Input transformer: ``%%chat;`` (the silencing ``;`` right after the name) is read as
    ``%%chat ;`` — IPython would otherwise look for a magic called ``chat;``."""
    if lines and _SEMICOLON_MAGIC.match(lines[0]):
        lines = [_SEMICOLON_MAGIC.sub(r"\1 ;", lines[0], count=1), *lines[1:]]
    return lines


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
    """Register the magics and print one line, after any warning it depends on: the default
    model, where its requests go, and the active cap."""
    # Magics.__init__ adds the instance to shell.configurables (so %config finds it) and
    # would take the shell as parent, failing on a bad value from ipython_config.py; the
    # values are applied one at a time instead, a bad one skipped with a warning.
    magics = ChatMagics(shell=ipython, parent=None)
    section = ipython.config.get("ChatMagics", {})
    for key, value in dict(section).items():
        try:
            setattr(magics, key, value)
        except (TraitError, ValueError, TypeError, AttributeError) as e:
            print(f"⚠ ignoring ChatMagics.{key}: {e} Using the default.", file=sys.stderr,
                  flush=True)
            if isinstance(section, Config):
                del section[key]    # said once: not again at the next %reload_ext
    ipython.register_magics(magics)
    ipython.events.register("post_run_cell", magics.record_cell)
    cleanup = ipython.input_transformers_cleanup
    if semicolon_after_magic not in cleanup:
        cleanup.append(semicolon_after_magic)
    settings = magics.settings()   # warns about bad CHATCLI_* values first
    model = magics.model()
    reason = "" if magics.default_model.strip() else f" ({auto_model()[1]})"
    where = describe_endpoint(default_endpoint(model))
    cap = (f"payload cap {format_size(settings.max_payload)}" if settings.max_payload
           else "no payload cap configured")
    sys.stderr.flush()
    print(f"ipy_ctxrecovery: %%chat uses {model}{reason}" + (f" at {where}" if where else "")
          + f"; {cap}. %chat help lists commands.", flush=True)
    problem = base_url_problem(model)
    if problem is not None:     # said now; the first cell's session refuses it too
        magics.warn_once(f"⚠ {problem}")
    was_open = getattr(ipython, _REOPEN, None)
    if was_open is not None:
        delattr(ipython, _REOPEN)
        magics.workspace.reopen(*was_open)


_REOPEN = "_ipy_ctxrecovery_reopen"
"""Shell attribute: the sessions open when the extension was unloaded, reopened on load
(``%reload_ext`` keeps a kernel's conversations)."""


def unload(ipython: Any) -> None:
    """Unregister the magics, close sessions (saved: a later load reopens them) and stop the
    embedded emulator."""
    magics = get_magics(ipython)
    if magics is None:
        return
    ws = magics.workspace
    setattr(ipython, _REOPEN, ([(key, s.name) for key, s in ws.sessions.items()
                                if s.last_used() is not None], ws.current))
    magics.close()
    with contextlib.suppress(ValueError):
        ipython.events.unregister("post_run_cell", magics.record_cell)
    cleanup = ipython.input_transformers_cleanup
    if semicolon_after_magic in cleanup:
        cleanup.remove(semicolon_after_magic)
    manager = ipython.magics_manager
    for kind in ("line", "cell"):
        if manager.magics[kind].get("chat") is not None:
            del manager.magics[kind]["chat"]
    manager.registry.pop("ChatMagics", None)
    ipython.configurables[:] = [c for c in ipython.configurables if c is not magics]
