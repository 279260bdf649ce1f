"""ChatSession: the turn loop that ties the recovery core, the tools and a provider together.

One :meth:`ChatSession.send` is one user turn::

    pre-flight (exact body bytes) → microcompact → tool-result budget → compaction if over
    budget → send → on failure: auth → refresh once; transient → retry with backoff;
    output_limit → clamp max_tokens; recoverable → ladder (exact fit first), resend
    → on a max_tokens stop: escalate, continue, stitch → on tool calls: run the tools,
    append their results, go round again (at most ``settings.max_tool_rounds``).

The provider-facing half (one request with pre-flight and recovery) is the
:class:`~ipy_ctxrecovery.recovery.RequestLoop` mixin in ``recovery.py``; the values a
session hands back (:class:`Reply`, :class:`SessionStatus`, ``KEEP``) live in ``_values.py``.

Every step is a pure function of the history; the session swaps the new history in only
when the whole turn succeeded, so a failed turn leaves :attr:`ChatSession.history` exactly
as it was (the user's message stays in the transcript, on disk).

What the transcript records (``transcript.py``): the user's messages, each assistant
message as the user sees it — an answer cut by ``max_tokens`` and continued is **one**
stitched message; the partial answers and the continuation prompts are not recorded —
the assistant's tool calls and the **full** tool results (before any budget preview).
Messages the package writes for the model (SYSTEM NOTICE, summaries) live only in the
working history and its snapshot.

A session without a ``name`` gets a generated one (``session-<date>-<time>-<pid>-<n>``),
so its transcript and persisted tool results are on disk too; :meth:`ChatSession.resume`
reopens a session by name (after a kernel restart, say) with its working history.
:meth:`ChatSession.update` changes a live session's settings, tools, model, provider or
emulator in place, keeping what it learned where that still applies.

All learned state (caps, token calibration, the one-shot warnings, the payload notice)
belongs to the session object: two sessions in one process never affect each other.
It is saved with the session's files after each turn where it changed, and ``resume``
restores what still applies (same path for caps, same model for calibration: ``learned.py``).
"""

from __future__ import annotations

import itertools
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from . import budget, compactor, escalation, preflight
from ._values import KEEP, Reply, SessionStatus, _Keep
from .catalogue import ModelInfo
from .config import Settings, format_size
from .errors import ChatError, CtxRecoveryError, redact
from .events import (
    Escalation,
    Event,
    EventCallback,
    Failed,
    ToolRun,
    Truncated,
    TurnFinished,
)
from .history import TAG_CONTINUATION, History, Message, Role, ToolCall
from .learned import restore as restore_learned
from .learned import save as save_learned
from .providers.base import Provider, Request, StopReason, TextCallback, Usage
from .recovery import RequestLoop, Turn
from .tools import Tool, as_tool, make_read_file
from .transcript import Transcript, validate_name

__all__ = ["KEEP", "ChatSession", "Reply", "SessionStatus"]

_PARTIAL = "partial_answer"
"""``meta`` key marking the partial assistant answer inside a continuation request."""
_TOOL_LIMIT_RESULT = (
    "[Tool call not run: this turn reached its limit of {n} tool rounds. "
    "Answer with what you have so far.]"
)
_session_counter = itertools.count(1)


class ChatSession(RequestLoop):
    """A conversation with one model, kept alive through every failure the core can recover."""

    def __init__(self, model: str = "emulator", *, client: Any = None,
                 settings: Settings | None = None, system: str | None = None,
                 tools: Iterable[Tool | Callable[..., Any]] = (), max_tokens: int | None = None,
                 name: str | None = None, emulator: Any = None,
                 on_event: EventCallback | None = None, provider: Provider | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 files_root: str | os.PathLike[str] | None = None,
                 builtin_tools: bool = True) -> None:
        self.settings = settings if settings is not None else Settings.from_env()
        self._client = client
        self._emulator = emulator
        self.max_tokens = max_tokens
        self.system = system
        self._sleep = sleep
        # Everything that can reject bad input comes before the provider, which may start
        # an emulator that would otherwise be left running.
        self.name = validate_name(name) if name is not None else _auto_name()
        user_tools = [as_tool(t) for t in tools]
        self._files = Transcript(self.name)
        self._store = budget.ResultStore(self._files.results_dir, self._files.health)
        self._files_root = Path(files_root) if files_root is not None else Path.cwd()
        self._builtin: dict[str, Tool] = {}
        if builtin_tools:
            builtin = make_read_file(self._files_root, self._files.results_dir)
            self._builtin[builtin.name] = builtin
        self._tools: dict[str, Tool] = {**self._builtin, **{t.name: t for t in user_tools}}
        self._owns_provider = provider is None
        self._provider = provider if provider is not None else self._make_provider(model)
        self.model = self._provider.model
        self._subscribers: list[EventCallback] = []
        if on_event is not None:
            self._subscribers.append(on_event)

        # Learned state: this session's only.
        self.caps = preflight.Caps.from_settings(self.settings)
        self.estimator = preflight.TokenEstimator.from_settings(self.settings)
        self._warned = False
        self._payload_notice_sent = False
        self._prompt_tokens = 0
        self._completion_tokens = 0
        self._compactions = 0
        self._recoveries = 0
        self._undo: tuple[History, int] | None = None
        self._encoded: tuple[Request, bytes] | None = None
        self._last_compaction: compactor.CompactionReport | None = None
        self._output_limit: int | None = None
        self._learned_window: int | None = None
        self._cap_note: str | None = None
        self._learned_saved: dict[str, Any] | None = None  # what learned.save last wrote

        self._history: History = (Message.system(system),) if system else ()
        self._transcript: list[Message] = list(self._files.messages())
        if system and not any(m.role is Role.SYSTEM and m.text == system
                              for m in self._transcript):
            self._record(Message.system(system))
        self._files.save_meta({"model": self.model, "system": system})
        if not self._files.has_history():
            # An existing snapshot stays until this session's first turn replaces it, so
            # opening a session by name never loses what ``resume`` would restore.
            self._files.checkpoint(self._history)

    # -- construction helpers -------------------------------------------------------------
    def _make_provider(self, model: str) -> Provider:
        from . import providers

        factory: Callable[..., Provider] = providers.make_provider
        return factory(model, client=self._client, settings=self.settings,
                       emulator=self._emulator)

    @classmethod
    def resume(cls, name: str, **kwargs: Any) -> ChatSession:
        """Reopen the named session from disk: its transcript and its working history.

        ``kwargs`` are the constructor's (a new ``emulator``/``client``/``provider``...);
        the model and system prompt default to the stored ones. What the session learned
        comes back where it still applies: caps on the same base URL and emulator object,
        token calibration on the same model string (``learned.py``).
        """
        if not Transcript.exists(name):
            raise CtxRecoveryError(
                f"there is no saved session named {name!r}; start one with "
                f"ChatSession(name={name!r}).")
        files = Transcript(name)
        meta = files.load_meta()
        if "provider" not in kwargs and meta.get("model"):
            kwargs.setdefault("model", meta["model"])
        kwargs.setdefault("system", meta.get("system"))
        session = cls(name=name, **kwargs)
        snapshot = session._files.load_history()   # later turns journal against it
        if snapshot is not None:
            session._history = snapshot
        session._cap_note = restore_learned(session)
        return session

    def update(self, *, settings: Settings | None = None,
               tools: Iterable[Tool | Callable[..., Any]] | None = None,
               model: str | None = None, provider: Provider | None = None,
               emulator: Any = None, client: Any = KEEP,
               max_tokens: int | None | _Keep = KEEP) -> tuple[str, ...]:
        """Change this live session in place; what it learned stays where it still applies.

        An argument left out (None, or :data:`KEEP` where None is a value) changes nothing.
        The history, the transcript and the counters (usage tokens, compactions,
        recoveries) always stay. Everything is checked, and a new provider built, before
        anything changes: on an error the session is exactly as it was.

        - ``settings``: used from the next request. A new ``max_payload`` replaces the
          configured cap; the learned bounds (largest body that passed, smallest rejected)
          stay, so a cap learned below the new configured one still wins. The token
          calibration stays; before any calibration sample, a new ``chars_per_token`` is
          the new starting estimate. A new explicit ``context_window`` replaces a window
          learned from a context-overflow error (a new model or path forgets it too).
        - ``tools``: the tools offered from the next request, replacing the ones given
          before; the built-in ``read_file`` stays when the session has it.
        - ``model``: a new provider for that model string, built by the session (with
          ``emulator`` for ``emulator*`` models). ``client`` defaults to the session's own
          client on the same model and to the SDK's default client on another one.
        - ``provider``: use this provider as is (the caller keeps ownership of it).
        - ``emulator``: the emulator ``emulator*`` models talk to (a restarted one); a
          session on such a model gets a provider rebuilt on it, another one only keeps
          it for a later switch.
        - ``max_tokens``: the default output limit (None: the provider's default).

        What a new provider resets:

        - token calibration and a learned output limit belong to the model and its
          tokenizer: they stay when the model string is unchanged (``emulator`` vs
          ``emulator:anthropic`` are different wire formats, so different) and reset
          otherwise;
        - learned payload caps (largest ok, smallest rejected, an assumed cap) belong to
          the network path: they stay when the new provider talks to the same base URL
          through the same emulator (another model behind the same proxy), and reset
          otherwise. A new emulator is a new path (its limits may differ), so its
          learned cap and learned output limit reset; the configured cap always stays.

        Returns a sentence for a learned or assumed payload cap that was dropped (empty
        when none was: recalibrating tokens needs no action from anyone);
        :meth:`status` also says why the cap is gone until a new one is learned.
        """
        if provider is not None and (model is not None or emulator is not None):
            raise CtxRecoveryError("give update() either provider= or model=/emulator=, "
                                   "not both.")
        new_settings = settings if settings is not None else self.settings
        new_tools = None if tools is None else [as_tool(t) for t in tools]
        old_provider = self._provider
        new_provider: Provider | None = provider
        spec = model if model is not None else self.model
        on_emulator = spec.split(":", 1)[0].strip().lower() == "emulator"
        if new_provider is None and (model is not None or (emulator is not None
                                                           and on_emulator)):
            same_model = spec == self.model
            use_client = client if not isinstance(client, _Keep) \
                else (self._client if same_model else None)
            from . import providers

            new_provider = providers.make_provider(
                spec, client=use_client,
                emulator=emulator if emulator is not None else self._emulator,
                settings=new_settings)
            self._client = use_client
        if emulator is not None:
            self._emulator = emulator  # kept for a later switch back to an emulator model
        notes: list[str] = []

        if settings is not None:
            if settings.context_window is not None \
                    and settings.context_window != self.settings.context_window:
                self._learned_window = None  # the user chose a window: it replaces the learned one
            if settings.max_payload != self.caps.configured:
                self._cap_note = None  # the user chose a cap: the old note is moot
            self.settings = settings
            self.caps.configured = settings.max_payload
            self.caps.learned_fraction = settings.learned_cap_fraction
            if self.estimator.samples == 0:
                self.estimator.bytes_per_token = settings.chars_per_token
        if new_tools is not None:
            self._tools = {**self._builtin, **{t.name: t for t in new_tools}}
        if not isinstance(max_tokens, _Keep):
            self.max_tokens = max_tokens

        if new_provider is not None and new_provider is not old_provider:
            why = _path_change(old_provider, new_provider)
            if new_provider.model != old_provider.model:
                self.estimator = preflight.TokenEstimator.from_settings(self.settings)
                self._output_limit = None
                self._learned_window = None
            if why is not None:
                learned = self.caps.learned
                if learned is not None or self.caps.assumed is not None:
                    shown = format_size(learned if learned is not None
                                        else self.caps.assumed or 0)
                    kind = "learned" if learned is not None else "assumed"
                    note = f"{kind} payload cap {shown} forgotten: {why} may have other limits"
                    notes.append(note)
                    self._cap_note = note
                self.caps = preflight.Caps.from_settings(self.settings)
                self._output_limit = None
                self._learned_window = None
            self._provider = new_provider
            self.model = new_provider.model
            owned, self._owns_provider = self._owns_provider, provider is None
            self._files.save_meta({"model": self.model, "system": self.system})
            closer = getattr(old_provider, "close", None)
            if owned and callable(closer):
                closer()  # only what the session built itself, never a user's provider
        self._encoded = None  # the cached body belongs to the old provider, tools or limit
        save_learned(self)
        return tuple(notes)

    # -- public views ---------------------------------------------------------------------
    @property
    def history(self) -> History:
        """The working history: what the model sees (compacted as needed)."""
        return self._history

    @property
    def transcript(self) -> History:
        """Everything said in this session, never compacted."""
        return tuple(self._transcript)

    @property
    def tools(self) -> tuple[Tool, ...]:
        return tuple(self._tools.values())

    @property
    def provider(self) -> Provider:
        return self._provider

    @property
    def directory(self) -> Path:
        """The session's private data directory."""
        return self._files.directory

    @property
    def info(self) -> ModelInfo:
        return self._provider.info

    def subscribe(self, callback: EventCallback) -> Callable[[], None]:
        """Call ``callback(event)`` for every event; returns a function that unsubscribes."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def status(self) -> SessionStatus:
        body = self._measure(self._history, self.max_tokens)
        info = self._provider.info
        return SessionStatus(
            name=self.name, model=self.model, history_bytes=body,
            est_tokens=self.estimator.estimate(body), window=self.window,
            window_guessed=info.guessed and self.settings.context_window is None
            and self._learned_window is None,
            window_learned=self._learned_window is not None,
            cap=self.caps.effective(), cap_source=self.caps.source,
            messages=len(self._history), transcript_messages=len(self._transcript),
            prompt_tokens=self._prompt_tokens, completion_tokens=self._completion_tokens,
            compactions=self._compactions, recoveries=self._recoveries,
            cap_note=self._cap_note if self.caps.learned is None and self.caps.assumed is None
            else None)

    # -- events ---------------------------------------------------------------------------
    def _emit(self, event: Event, turn: Turn | None = None) -> None:
        if turn is not None and not isinstance(event, TurnFinished) and event.message:
            turn.actions.append(event.message)
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception as e:  # a display bug must not end the turn, nor go unnoticed
                warnings.warn(redact(f"event subscriber {callback!r} raised "
                                     f"{type(e).__name__}: {e}"),
                              RuntimeWarning, stacklevel=2)

    # -- transcript -----------------------------------------------------------------------
    def _record(self, message: Message) -> None:
        self._transcript.append(message)
        self._files.append(message)

    # -- the turn -------------------------------------------------------------------------
    def send(self, text: str, *, max_tokens: int | None = None, stream: bool = True,
             on_text: TextCallback | None = None, record: bool = True,
             options: Mapping[str, Any] | None = None) -> Reply:
        """Send ``text`` as the user's message and return the assistant's answer.

        Raises :class:`ChatError` (one sentence, secrets redacted) when the request failed
        for good; the working history is then exactly as before. ``record=False`` sends
        the exchange without keeping it (history and transcript untouched).
        """
        timeout = self.settings.turn_timeout
        turn = Turn(deadline=None if timeout is None else time.monotonic() + timeout)
        user = Message.user(text)
        if record:
            self._record(user)
        working = self._history + (user,)
        limit = max_tokens if max_tokens is not None else self.max_tokens
        try:
            final, answer, stop = self._run_turn(working, limit, turn, stream=stream,
                                                 on_text=on_text, options=options,
                                                 record=record)
        except ChatError as e:
            self._emit(Failed(message=f"✗ {e}", failure_kind=e.failure.kind.value), turn)
            raise
        finally:
            save_learned(self)  # a failed turn may still have learned a limit
        if record:
            self._history = final
            if turn.compacted_from is not None:
                self._undo = turn.compacted_from
            self._files.save_history(final)
        body = self._measure(final, limit, options)
        est = self.estimator.estimate(body)
        self._emit(TurnFinished(message=f"history {format_size(body)} ≈ {est:,} tokens "
                                        f"({100 * est / self.window:.0f}% of the "
                                        f"{self.window:,}-token window)",
                                history_bytes=body,
                                est_tokens=est, window=self.window,
                                cap=self.caps.effective()), turn)
        return Reply(text=answer.text, finish_reason=stop.value,
                     usage=Usage(turn.prompt_tokens, turn.completion_tokens),
                     actions=tuple(turn.actions), model=self.model)

    def _run_turn(self, history: History, max_tokens: int | None, turn: Turn, *,
                  stream: bool, on_text: TextCallback | None,
                  options: Mapping[str, Any] | None,
                  record: bool) -> tuple[History, Message, StopReason]:
        """Round trips until the model answers without tool calls (or a bound is reached)."""
        rounds = 0
        limit_told = False
        while True:
            history, answer, stop, max_tokens = self._answer(
                history, max_tokens, turn, stream=stream, on_text=on_text, options=options)
            if record:
                self._record(answer)
            history = history + (answer,)
            if not answer.tool_calls:
                return history, answer, stop
            rounds += 1
            over = rounds > self.settings.max_tool_rounds
            results = []
            for call in answer.tool_calls:
                if over:
                    # Every call gets an answer, so the history stays valid.
                    content = _TOOL_LIMIT_RESULT.format(n=self.settings.max_tool_rounds)
                    result = Message.tool(call.id, content, is_error=True, name=call.name)
                else:
                    result = self._run_tool(call, turn)
                if record:
                    self._record(result)
                results.append(result)
            history = history + tuple(results)
            if over:
                if limit_told:
                    return history, answer, StopReason.TOOL_CALLS
                limit_told = True
                self._emit(ToolRun(
                    message=f"🔧 tool round limit ({self.settings.max_tool_rounds}) reached — "
                            "asking the model to answer with what it has",
                    name=answer.tool_calls[0].name, ok=False), turn)

    def _run_tool(self, call: ToolCall, turn: Turn) -> Message:
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            content, is_error = f"Error: there is no tool named {call.name!r} (tools: {known}).", True
        else:
            content, is_error = tool.run(call.arguments)
        self._emit(ToolRun(message=f"🔧 {call.name}: {'ok' if not is_error else 'error'}"
                           f" ({len(content):,} chars)", name=call.name, ok=not is_error), turn)
        return Message.tool(call.id, content, is_error=is_error, name=call.name)

    def _answer(self, history: History, max_tokens: int | None, turn: Turn, *,
                stream: bool, on_text: TextCallback | None,
                options: Mapping[str, Any] | None,
                ) -> tuple[History, Message, StopReason, int | None]:
        """One answer from the model, continued past ``max_tokens`` stops and stitched.

        Returns the history that was sent (compacted as needed, without the partial answers
        and continuation prompts), the stitched assistant message, its stop reason and the
        max_tokens in force afterwards.
        """
        parts: list[str] = []
        escalations = 0
        while True:
            request_history = history
            if parts:
                partial = Message.assistant(escalation.stitch(parts))
                partial = Message(partial.role, partial.blocks, meta={_PARTIAL: True})
                request_history = history + (partial, escalation.continuation_message())
            sent, response, max_tokens = self._send_recovering(
                request_history, max_tokens, turn, stream=stream, on_text=on_text,
                options=options)
            history = tuple(m for m in sent
                            if not m.meta.get(_PARTIAL) and m.tag != TAG_CONTINUATION)
            message = response.message
            if response.stop is not StopReason.LENGTH:
                break
            # With no explicit max_tokens, where the answer was cut is the limit in force.
            current = max_tokens or response.usage.completion_tokens \
                or self.output_cap
            nxt = escalation.next_max_tokens(
                current, escalations, model_cap=self.output_cap,
                max_escalations=self.settings.max_token_escalations)
            if nxt is None:
                # Out of escalations: the answer is kept as it is, cut — say so.
                self._emit(Truncated(
                    message=f"⚠ answer still cut at max_tokens={current:,} after "
                            f"{escalations} escalation{'s' if escalations != 1 else ''} — "
                            "raise max_tokens or CHATCLI_MAX_TOKEN_ESCALATIONS",
                    max_tokens=current, escalations=escalations), turn)
                break
            escalations += 1
            self._emit(Escalation(
                message=f"↗ answer cut at max_tokens={current:,} — continuing with "
                        f"max_tokens={nxt:,} (escalation {escalations}/"
                        f"{self.settings.max_token_escalations})",
                attempt=escalations, max_tokens=nxt), turn)
            max_tokens = nxt
            if message.tool_calls:
                continue        # a cut tool call cannot be continued: ask again, larger
            parts.append(message.text)
        if parts:
            text = escalation.stitch([*parts, message.text])
            message = Message.assistant(text, message.tool_calls)
        return history, message, response.stop, max_tokens

    # -- history management -----------------------------------------------------------------
    def compact(self, instructions: str | None = None) -> compactor.CompactionReport:
        """Compact the working history now (the SPEC's ``/compact``)."""
        turn = Turn()
        before = self._history
        current = self._measure(before, self.max_tokens)
        trigger = compactor.compaction_budget(
            self.settings, window_tokens=self.window,
            bytes_per_token=self.estimator.bytes_per_token, cap=self.caps.effective(),
            ratio=self.settings.manual_compact_ratio)
        target = min(compactor.compaction_target(trigger, self.settings),
                     int(current * self.settings.manual_compact_ratio))
        new = self._compact(before, target, self.max_tokens, turn, instructions=instructions,
                            force=True)
        report = self._last_compaction
        assert report is not None
        if report.applied:
            self._undo = (before, len(new))
            self._history = new
            self._files.save_history(new)
        save_learned(self)
        return report

    def undo_compact(self) -> None:
        """Restore the history from before the last compaction (later messages are kept)."""
        if self._undo is None:
            raise CtxRecoveryError("there is no compaction to undo in this session.")
        before, length_after = self._undo
        later = self._history[length_after:] if len(self._history) >= length_after else ()
        self._history = before + later
        self._undo = None
        self._files.save_history(self._history)

    def reset(self) -> None:
        """Start the working history afresh (the transcript keeps everything).

        What was learned about the network and the model (caps, calibration) stays; the
        payload SYSTEM NOTICE went with the old history, so it may be given again.
        """
        self._history = (Message.system(self.system),) if self.system else ()
        self._undo = None
        self._payload_notice_sent = False
        self._files.mark("reset")
        self._files.save_history(self._history)

    def close(self) -> None:
        """Save the history snapshot and release the provider's client when it has one."""
        self._files.checkpoint(self._history)
        save_learned(self, exact=True)
        closer = getattr(self._provider, "close", None)
        if self._owns_provider and callable(closer):
            closer()  # releases what the provider opened itself, never a user's client

    def __enter__(self) -> ChatSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ChatSession(model={self.model!r}, name={self.name!r}, "
                f"messages={len(self._history)})")


def _path_change(old: Provider, new: Provider) -> str | None:
    """Why ``new`` reaches the model over another network path than ``old`` (None: same path).

    The path is the client's base URL and the emulator behind it; a provider that shows
    neither is taken as a new path (relearning costs at most one rejection).
    """
    old_emulator, new_emulator = getattr(old, "emulator", None), getattr(new, "emulator", None)
    if old_emulator is not new_emulator:
        return "the new emulator"
    old_url = getattr(getattr(old, "client", None), "base_url", None)
    new_url = getattr(getattr(new, "client", None), "base_url", None)
    if old_url is None or new_url is None:
        return "the new provider"
    if str(old_url) != str(new_url):
        return "the new endpoint"
    return None


def _auto_name() -> str:
    return f"session-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_session_counter)}"
