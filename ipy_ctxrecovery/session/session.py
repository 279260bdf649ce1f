"""ChatSession: a conversation with one model, kept alive through every failure the core
can recover — the facade over the session's parts.

One :meth:`ChatSession.send` is one user turn (:class:`~.turns.TurnRunner`): each request
goes through the :class:`~.pipeline.Preparer` (microcompact → tool-result budget →
pre-flight → compaction → fit) and the :class:`~.recovery.RecoveryLoop` (send, retry,
climb the ladder); answers cut at ``max_tokens`` are continued and stitched; tool calls
are run and answered. The parts are built here and get their collaborators through their
constructors: :class:`~.endpoint.Endpoint` (the provider), :class:`~.learned.LearnedLimits`
(caps, window, calibration), :class:`~.sizing.RequestSizer`,
:class:`~.compaction.SessionCompactor`, :class:`~.turn_log.EventBus`.

Every step is a pure function of the history; the session swaps the new history in only
when the whole turn succeeded, so a failed turn leaves :attr:`ChatSession.history` exactly
as it was (the user's message stays in the transcript, on disk).

What the transcript records (``transcript.py``): the user's messages, each assistant
message as the user sees it (one stitched message for a continued answer), the
assistant's tool calls and the **full** tool results. Messages the package writes for the
model (SYSTEM NOTICE, summaries) live only in the working history and its snapshot.

A session without a ``name`` gets a generated one (``session-<date>-<time>-<pid>-<n>``);
:meth:`ChatSession.resume` reopens a session by name with its working history, its counters
(tokens, turns, compactions, recoveries: saved with the history, no extra write per turn,
``store.py``) and what it learned, where that still applies. Learned state belongs to the
session (payload caps to its network path, shared only through a
:class:`~.learned.PathRegistry` it is given).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..core import budget, compactor, prices
from ..core.catalogue import ModelInfo
from ..core.events import BackgroundSummary, EventCallback, Failed, TurnFinished
from ..core.history import History, Message, Role, unstorable_at
from ..core.preflight import TokenEstimator
from ..core.recall import shows_compaction
from ..core.recovery.evidence import Caps
from ..core.wording import cache_note, plural
from ..errors import ChatError, ConfigError, CtxRecoveryError
from ..providers import is_emulator_model
from ..providers.base import CountsTokens, Provider, Request, TextCallback, Usage
from ..settings import Settings
from .background import BackgroundCompactor
from .compaction import SessionCompactor
from .deadline import checker
from .dry_run import dry_run
from .endpoint import Endpoint, path_key
from .learned import LearnedLimits, PathRegistry
from .pipeline import Prepared, Preparer
from .recall import make_recall
from .recovery import RecoveryLoop
from .redactor import Redactor, client_credentials
from .sizing import RequestSizer, RequestSpec
from .store import Transcript, validate_name
from .tools import Tool, as_tool, make_read_file
from .turn_log import EventBus, Shrink, TurnLog
from .turns import ToolBox, TurnRunner
from .values import KEEP, Reply, SessionStatus, _Keep
from .what_if import Plan
from .what_if import plan as plan_what_if

__all__ = ["ChatSession"]

_session_counter = itertools.count(1)
_UNDO_DEPTH = 20
"""How many shrinking turns ``undo_compact`` can step back through."""
_BY_MODEL = "by_model:"
_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens",
                 "cache_write_1h_tokens")
"""A session's usage by model, as its counters store it (``_counters``)."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _one_at_a_time(method: Callable[Concatenate[ChatSession, _P], _R]
                   ) -> Callable[Concatenate[ChatSession, _P], _R]:
    """``method`` run under the session's own lock: a session shared by threads runs its
    turns (and the other changes to its history and files) one after another, so each
    message is said, and written, once. Reentrant: a tool or callback of a turn may call
    the session on the turn's own thread."""
    @functools.wraps(method)
    def serialized(self: ChatSession, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._turn_lock:
            return method(self, *args, **kwargs)
    return serialized


def _make_provider(model: str, client: Any, emulator: Any, settings: Settings) -> Provider:
    from .. import providers

    return providers.make_provider(model, client=client, settings=settings, emulator=emulator)


class ChatSession:
    """A conversation with one model, kept alive through every failure the core can recover."""

    def __init__(self, model: str = "emulator", *, client: Any = None,
                 settings: Settings | None = None, system: str | None = None,
                 tools: Iterable[Tool | Callable[..., Any]] = (), max_tokens: int | None = None,
                 name: str | None = None, emulator: Any = None,
                 on_event: EventCallback | None = None, provider: Provider | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 files_root: str | os.PathLike[str] | None = None,
                 builtin_tools: bool = True, paths: PathRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._turn_lock = threading.RLock()     # ``_one_at_a_time``
        # What the session times its pauses by (the cache's life: docs/caching.md); a
        # test, a bench or a tutorial moves it instead of waiting, with ``Emulator(clock=)``.
        self._clock = clock
        self.settings = settings if settings is not None else Settings.from_env()
        self.max_tokens = max_tokens
        self.system = system
        # Everything that can reject bad input comes before the provider, which may start
        # an emulator that would otherwise be left running.
        self.name = validate_name(name) if name is not None else _auto_name()
        user_tools = [as_tool(t) for t in tools]
        # What is stored, shown in an error or an event, or exported is masked (never what
        # is sent): this session's own credentials and, unless opted out, known formats.
        self.redactor = Redactor(self._credentials, lambda: self.settings.redact_stored)
        self._files = Transcript(self.name, redactor=self.redactor)
        self._files.claim()     # a saved session has one writer: fails here if held elsewhere
        self._store = budget.ResultStore(self._files.results_dir, self._files.health)
        self._files_root = Path(files_root) if files_root is not None else Path.cwd()
        self._builtin_tools = builtin_tools
        self._toolbox = ToolBox(self._make_builtins(self.settings), user_tools)
        self._paths = paths if paths is not None else PathRegistry()
        made = provider is None
        if provider is None:
            try:
                provider = _make_provider(model, client, emulator, self.settings)
            except BaseException:
                # No key yet, a bad model name: the name is free for the retry (it stayed
                # "open in this process already" until the kernel restarted).
                self._files.release()
                raise
        self._endpoint = Endpoint(provider, owned=made, client=client, emulator=emulator,
                                  factory=self._factory)
        self.bus = EventBus(mask=self.redactor.shown)
        if on_event is not None:
            self.bus.subscribe(on_event)
        self.limits = LearnedLimits.fresh(self.settings,
                                          self._paths.limits(self._endpoint.path_key()))
        self._build(sleep)

        self._prompt_tokens = 0
        self._completion_tokens = 0
        self._cached_tokens = 0
        self._cache_write_tokens = 0
        self._by_model: dict[str, list[int]] = {}
        """The totals of ``_USAGE_FIELDS`` by the model that was billed them (a session can
        change model: each model's tokens are priced at its own price)."""
        self._cache_write_1h_tokens = 0
        self._turns_answered = 0
        self._compactions = 0
        self._compactions_before_resume = 0  # their history is not on disk: no undo
        self._undo: list[tuple[Shrink, ...]] = []

        self._history: History = (Message.system(system),) if system else ()
        self._transcript: list[Message] = list(self._files.messages())
        self._started = False   # this object has written its first record (see _record)
        self._compacted_in_turn = False   # a round of a turn started from a compacted history
        self._offer_recall()

    def _make_builtins(self, settings: Settings) -> list[Tool]:
        """The built-in tools ``settings`` ask for (read_file, under its root)."""
        if not (self._builtin_tools and settings.read_file):
            return []
        root = settings.read_file_root or self._files_root
        return [make_read_file(root, self._files.results_dir)]

    def _offer_recall(self) -> None:
        """The built-in recall tool, offered once the session has compacted (``recall.py``)."""
        if not self._builtin_tools:
            return
        settings = lambda: self.settings  # noqa: E731 - the settings in force at the call
        tool = make_recall(self._recall_source, lambda: min(
            settings().recall_max_chars, settings().per_result_max_chars))
        self._toolbox.offer_after_compaction((tool,), self._compacted, self._note_round)

    def _compacted(self) -> bool:
        """Whether this session has compacted (the recall tool is offered from then on)."""
        if self.settings.recall_max_chars <= 0:
            return False
        return self._compactions > 0 or self._compacted_in_turn

    def _note_round(self, history: History) -> None:
        """A round of a turn starts from ``history``: compacted earlier in the turn?"""
        if not self._compacted_in_turn and shows_compaction(history):
            self._compacted_in_turn = True
            self._sizer.forget_encoding()

    def _recall_source(self) -> History | None:
        """What recall searches: the transcript on disk (redacted as stored); without one,
        the in-memory record of what was said, masked the same way."""
        if self._files.path.is_file():
            return self._files.messages()
        return tuple(self.redactor.message(m) for m in self._transcript) or None

    def _credentials(self) -> set[str]:
        """The credential strings this session's client sends (for the redactor)."""
        endpoint = getattr(self, "_endpoint", None)  # None while the provider is built
        if endpoint is None:
            return set()
        own, used = endpoint.client, getattr(endpoint.provider, "client", None)
        found = client_credentials(used)
        return found if own is used else found | client_credentials(own)

    def _factory(self, model: str, client: Any, emulator: Any) -> Provider:
        return _make_provider(model, client, emulator, self.settings)

    def _build(self, sleep: Callable[[float], None]) -> None:
        """The parts of a turn, wired to the session's endpoint, limits and settings."""
        settings = self.settings
        self._sizer = RequestSizer(self._endpoint, self.limits, settings, self._toolbox.specs)
        # The conversation's prompt_cache_key: its files' place, hashed (no path is sent).
        self._endpoint.cache_key = "ipy-ctxrecovery-" + hashlib.sha256(
            str(self._files.directory).encode()).hexdigest()[:24]
        self._compactor = SessionCompactor(self._sizer, self.bus, settings, sleep=sleep)
        self._preparer = Preparer(self._sizer, self._compactor, self._store, self.bus,
                                  settings)
        self._preparer.clock = self._clock
        self._recovery = RecoveryLoop(self._endpoint, self._sizer, self._preparer,
                                      self._compactor, self._store, self.bus, settings, sleep,
                                      while_waiting=self._files.flush)
        self._turns = TurnRunner(self._recovery, self._toolbox, self.bus, settings,
                                 mask=self.redactor.own)
        self._background = BackgroundCompactor(
            self._sizer, settings,
            lambda bus: SessionCompactor(self._sizer, bus, self.settings, sleep=sleep,
                                         calibrate=self._background.calibration))
        self._preparer.swap = self._background.swap
        self._preparer.count = self._count_tokens

    def _count_tokens(self, request: Request) -> int | None:
        """The provider's exact count of ``request``'s input tokens (exact pre-flight; the
        preparer asks only near the window): None from a provider that cannot count."""
        provider = self._endpoint.provider
        if not isinstance(provider, CountsTokens):
            return None
        return provider.count_tokens(request)

    def _configure(self, settings: Settings) -> None:
        self.settings = settings
        self._background.discard()
        for part in (self._sizer, self._compactor, self._preparer, self._recovery,
                     self._turns, self._background):
            part.settings = settings

    # -- opening and changing -------------------------------------------------------------
    @classmethod
    def resume(cls, name: str, **kwargs: Any) -> ChatSession:
        """Reopen the named session from disk: its transcript and its working history.

        ``kwargs`` are the constructor's (a new ``emulator``/``client``/``provider``...);
        the model and system prompt default to the stored ones. What the session learned
        comes back where it still applies: caps on the same network path, token
        calibration on the same model string (``learned.py``).
        """
        if not Transcript.exists(name):
            raise CtxRecoveryError(
                f"there is no saved session named {name!r}; start one with "
                f"ChatSession(name={name!r}).")
        damage = Transcript.damage(name)
        if damage is not None:
            raise ConfigError(damage)
        files = Transcript(name)
        meta = files.load_meta()
        if "provider" not in kwargs and "model" not in kwargs:
            model = meta.get("model") or files.learned_model()
            if model:
                kwargs["model"] = model
            elif kwargs.get("client") is not None:
                # The default model is the emulator, which takes no client.
                raise ConfigError(
                    f"session {name!r} does not say which model it talks to ({files.meta_path} "
                    "is missing or damaged), and client= does not name one; pass "
                    "model='openai:…' or 'anthropic:…' with client=.")
        kwargs.setdefault("system", meta.get("system"))
        session = cls(name=name, **kwargs)
        snapshot = session._files.load_history()   # later turns journal against it
        if snapshot is not None:
            session._history = snapshot
        session._restore_counters(session._files.counters)
        session._restore_learned()
        return session

    def _counters(self) -> dict[str, int]:
        """The session's totals, as saved with its history (``store.py``): the per-model
        ones as ``by_model:MODEL|FIELD`` (the store keeps whole numbers by name)."""
        by_model = {f"{_BY_MODEL}{model}|{field}": value
                    for model, values in self._by_model.items()
                    for field, value in zip(_USAGE_FIELDS, values, strict=True)}
        return {"prompt_tokens": self._prompt_tokens,
                "completion_tokens": self._completion_tokens,
                "turns": self._turns_answered, "compactions": self._compactions,
                "recoveries": self._recovery.recoveries,
                "cached_tokens": self._cached_tokens,
                "cache_write_tokens": self._cache_write_tokens,
                "cache_write_1h_tokens": self._cache_write_1h_tokens, **by_model}

    def _restore_counters(self, saved: Mapping[str, int]) -> None:
        self._prompt_tokens = saved.get("prompt_tokens", 0)
        self._completion_tokens = saved.get("completion_tokens", 0)
        self._cached_tokens = saved.get("cached_tokens", 0)
        self._cache_write_tokens = saved.get("cache_write_tokens", 0)
        self._cache_write_1h_tokens = saved.get("cache_write_1h_tokens", 0)
        self._by_model = {}
        for key, value in saved.items():
            model, _, field = key.removeprefix(_BY_MODEL).rpartition("|")
            if key.startswith(_BY_MODEL) and model and field in _USAGE_FIELDS:
                values = self._by_model.setdefault(model, [0] * len(_USAGE_FIELDS))
                values[_USAGE_FIELDS.index(field)] = value
        self._turns_answered = saved.get("turns", 0)
        self._compactions = self._compactions_before_resume = saved.get("compactions", 0)
        self._recovery.recoveries = saved.get("recoveries", 0)


    def _restore_learned(self) -> None:
        raw = self._files.load_learned()
        if raw is None:
            return
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None
        self.limits.restore(data, model=self.model, path=self._endpoint.path_key(),
                            settings=self.settings, source=str(self._files.learned_path))

    def _save_learned(self, *, exact: bool = False) -> None:
        state = self.limits.to_json(model=self.model, path=self._endpoint.path_key(),
                                    settings=self.settings)
        if self.limits.changed_since_saved(state, exact=exact):
            self._files.save_learned(json.dumps(state, ensure_ascii=False))

    @_one_at_a_time
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
          configured cap; the learned bounds stay, so a cap learned below the new
          configured one still wins. Before any calibration sample, a new
          ``chars_per_token`` is the new starting estimate. A new explicit
          ``context_window`` replaces a window learned from a context-overflow error.
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

        A new provider resets what belongs to the old one: token calibration and a learned
        output limit belong to the model string; learned payload caps to the network path
        (base URL and emulator) — a new emulator is a new path.

        Returns a sentence for a learned or assumed payload cap that was dropped (empty
        when none was); :meth:`status` also says why the cap is gone.
        """
        if provider is not None and (model is not None or emulator is not None):
            raise CtxRecoveryError("give update() either provider= or model=/emulator=, "
                                   "not both.")
        endpoint = self._endpoint
        new_settings = settings if settings is not None else self.settings
        new_tools = None if tools is None else [as_tool(t) for t in tools]
        new_provider: Provider | None = provider
        new_client = endpoint.client
        spec = model if model is not None else self.model
        if new_provider is None and (model is not None or (emulator is not None
                                                           and is_emulator_model(spec))):
            new_client = client if not isinstance(client, _Keep) \
                else (endpoint.client if spec == self.model else None)
            new_provider = _make_provider(
                spec, new_client, emulator if emulator is not None else endpoint.emulator,
                new_settings)
        if new_provider is None and settings is not None and endpoint.owned \
                and (settings.openai_api, settings.openai_store) \
                != (self.settings.openai_api, self.settings.openai_store):
            # The OpenAI wire's API (or its storage) changed: the provider speaks it.
            new_provider = _make_provider(spec, endpoint.client, endpoint.emulator,
                                          new_settings)
        if emulator is not None:
            endpoint.emulator = emulator  # kept for a later switch back to an emulator model
        notes: list[str] = []

        if settings is not None:
            if (settings.read_file, settings.read_file_root) != \
                    (self.settings.read_file, self.settings.read_file_root):
                self._toolbox.replace_builtin(self._make_builtins(settings))
            self.limits.configure(self.settings, settings)
            self._configure(settings)
        if new_tools is not None:
            self._toolbox.replace(new_tools)
        if not isinstance(max_tokens, _Keep):
            self.max_tokens = max_tokens

        if new_provider is not None and new_provider is not endpoint.provider:
            why = endpoint.path_change(new_provider)
            new_path = self._paths.limits(path_key(new_provider))
            note = self.limits.forget(self.settings,
                                      model_changed=new_provider.model != endpoint.model,
                                      path_changed=why, new_path=new_path)
            if note is not None:
                notes.append(note)
            endpoint.client = new_client
            endpoint.replace(new_provider, owned=provider is None)
            self._files.save_meta({"model": self.model, "system": self.system})
        self._sizer.forget_encoding()  # the cached body belongs to the old provider or tools
        self._save_learned()
        return tuple(notes)

    # -- public views ---------------------------------------------------------------------
    @property
    def model(self) -> str:
        return self._endpoint.model

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
        return self._toolbox.tools

    @property
    def tools_after_compaction(self) -> tuple[Tool, ...]:
        """Built-in tools offered only once the session has compacted (recall_transcript)."""
        return self._toolbox.after_compaction

    @property
    def provider(self) -> Provider:
        return self._endpoint.provider

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    def last_used(self) -> float | None:
        """When the session's transcript was last written (None: nothing saved yet)."""
        try:
            return self._files.path.stat().st_mtime
        except OSError:
            return None

    @property
    def directory(self) -> Path:
        """The session's private data directory."""
        return self._files.directory

    @property
    def info(self) -> ModelInfo:
        return self._endpoint.info

    @property
    def caps(self) -> Caps:
        """The payload cap in force and what it was learned from."""
        return self.limits.caps

    @property
    def estimator(self) -> TokenEstimator:
        """Body bytes → tokens, calibrated by the usage replies report."""
        return self.limits.tokens

    @property
    def window(self) -> int:
        """The window in tokens: configured or the model's, or a smaller one learned."""
        return self._sizer.window

    @property
    def output_cap(self) -> int:
        """The most max_tokens may be: the model's output limit, or a lower learned one."""
        return self._sizer.output_cap

    @contextlib.contextmanager
    def offering(self, *, builtin_tools: bool = True) -> Iterator[None]:
        """Within the ``with`` block, offer the built-in tools (read_file) only if
        ``builtin_tools`` (``%%chat --no-read-file``: one answer without them)."""
        with self._toolbox.offering(builtin=builtin_tools):
            self._sizer.forget_encoding()
            yield
        self._sizer.forget_encoding()

    def subscribe(self, callback: EventCallback) -> Callable[[], None]:
        """Call ``callback(event)`` for every event; returns a function that unsubscribes."""
        return self.bus.subscribe(callback)

    def _spec(self, max_tokens: int | None = None, *, stream: bool = False,
              options: Mapping[str, Any] | None = None) -> RequestSpec:
        return RequestSpec(max_tokens=max_tokens if max_tokens is not None else self.max_tokens,
                           options=MappingProxyType(dict(options or {})), stream=stream)

    def history_size(self, history: History | None = None) -> tuple[int, int]:
        """(bytes, estimated tokens) of ``history`` (the working one by default) as this
        session's next request would carry it: its default max_tokens and the tools it
        offers outside any one cell's ``--no-read-file``, not streamed.

        The one measure of a history: :meth:`status` (``%chat status``, the panel between
        turns), the turn's end (``TurnFinished``: the card's "after") and ``what_if``'s
        history line all take it from here, so they agree to the unit. A request's own
        size (pre-flight's, a send's) is another quantity, said as "request"."""
        history = self._history if history is None else history
        request = dataclasses.replace(self._sizer.request(history, self._spec()),
                                      tools=self._toolbox.default_specs())
        body = self._sizer.measure_request(request)
        return body, self.limits.tokens.estimate(body)

    def status(self) -> SessionStatus:
        body, tokens = self.history_size()
        limits = self.limits
        return SessionStatus(
            name=self.name, model=self.model, history_bytes=body,
            est_tokens=tokens, window=self.window,
            window_guessed=not self._sizer.window_known,
            window_learned=limits.window is not None,
            window_source=self._sizer.window_source,
            cap=limits.caps.effective(), cap_source=limits.caps.source,
            messages=len(self._history), transcript_messages=len(self._transcript),
            prompt_tokens=self._prompt_tokens, completion_tokens=self._completion_tokens,
            turns=self._turns_answered,
            compactions=self._compactions, recoveries=self._recovery.recoveries,
            cap_note=limits.visible_cap_note, cached_tokens=self._cached_tokens,
            cache_write_tokens=self._cache_write_tokens,
            cache_write_1h_tokens=self._cache_write_1h_tokens, cost=self._cost(),
            background=self._background.state, counted_tokens=self._preparer.last_count,
            server_compaction=self._sizer.server.status_words(),
            cache_note=cache_note(
                caching=self.settings.prompt_caching, choice=self.settings.cache_retention,
                retention=self._preparer.retention(),
                wire=getattr(self._endpoint.provider, "wire", None)))

    def _cost(self) -> float | None:
        """The estimated USD of every token this session was billed, each model's at its
        own price (None: a price unknown). Tokens no model is recorded for (a session
        saved before it kept them by model) are the current model's."""
        rest = [self._prompt_tokens, self._completion_tokens, self._cached_tokens,
                self._cache_write_tokens, self._cache_write_1h_tokens]
        parts = list(self._by_model.items())
        for _, values in parts:
            rest = [r - v for r, v in zip(rest, values, strict=True)]
        if any(r > 0 for r in rest):
            parts.append((self.model, [max(0, r) for r in rest]))
        total = 0.0
        for model, values in parts:
            if not any(values):
                continue
            prompt, completion, cached, written, written_1h = values
            cost = prices.estimate(model, Usage(prompt, completion, cached, written,
                                                cache_write_1h_tokens=written_1h),
                                   self.settings.prices)
            if cost is None:
                return None
            total += cost.total
        return total

    def _bill(self, log: TurnLog) -> None:
        """Add what ``log``'s requests were billed to the session's totals."""
        self._count(log.prompt_tokens, log.completion_tokens, log.cached_tokens,
                    log.cache_write_tokens, log.cache_write_1h_tokens)

    def _count(self, prompt: int, completion: int, cached: int, written: int,
               written_1h: int = 0) -> None:
        """Add billed tokens to the session's totals, and to its current model's."""
        self._prompt_tokens += prompt
        self._completion_tokens += completion
        self._cached_tokens += cached
        self._cache_write_tokens += written
        self._cache_write_1h_tokens += written_1h
        values = self._by_model.setdefault(self.model, [0] * len(_USAGE_FIELDS))
        for i, n in enumerate((prompt, completion, cached, written, written_1h)):
            values[i] += n

    # -- transcript -----------------------------------------------------------------------
    def _record(self, message: Message, *, later: bool = False) -> None:
        """Keep ``message`` in the transcript; ``later``: its line is written while the
        request is in flight (or when the turn ends, whichever comes first)."""
        if not self._started:
            self._start_files()
        # Written (masked) first: masking past the turn's deadline raises, and the message
        # is then not kept here either.
        self._files.append(message, later=later)
        self._transcript.append(message)

    def _start_files(self) -> None:
        """The first word said through this object: the session's files come into being
        (nothing is saved for a session in which nothing was said), with its metadata and
        system prompt."""
        self._started = True
        self._files.create()
        self._files.save_meta({"model": self.model, "system": self.system})
        if self.system and not any(m.role is Role.SYSTEM and m.text == self.system
                                   for m in self._transcript):
            self._record(Message.system(self.system))

    # -- the turn -------------------------------------------------------------------------
    @_one_at_a_time
    def send(self, text: str, *, max_tokens: int | None = None, stream: bool = True,
             on_text: TextCallback | None = None, record: bool = True,
             options: Mapping[str, Any] | None = None) -> Reply:
        """Send ``text`` as the user's message and return the assistant's answer.

        Raises :class:`ChatError` (one sentence, secrets redacted) when the request failed
        for good; the working history is then exactly as before. ``record=False`` sends
        the exchange without keeping it (history and transcript untouched).
        """
        at = unstorable_at(text)
        if at is not None:
            raise CtxRecoveryError(
                f"Your message cannot be sent or saved: character {at + 1} is a lone "
                f"surrogate ({text[at]!r}), which is not valid Unicode text — it usually "
                "comes from a broken copy-paste or decoding; remove it and send again.")
        timeout = self.settings.turn_timeout
        log = TurnLog(deadline=None if timeout is None else time.monotonic() + timeout)
        user = Message.user(text)
        if record:
            # Masked and written while the request is in flight: a kill before that loses
            # only the turn in flight; the turn's end (failed or not) writes it at the latest.
            self._record(user, later=True)
        spec = self._spec(max_tokens, stream=stream, options=options)
        kept = False
        # Never alongside a turn: a background summary still in flight is waited for.
        self._background.wait(log.left())
        self._tell_background(log)
        # Masking what the turn stores is inside its deadline, like its requests.
        masking = checker(log.deadline, timeout or 0, "masking and saving this turn's messages")
        try:
            with self.redactor.checking(masking):
                result = self._turns.run(self._history + (user,), spec, log, on_text,
                                         self._record if record else None)
            self._turns_answered += 1
            kept = record
        except ChatError as e:
            # The sentence may quote this session's own key (a gateway's 401 body).
            e.args = (self.redactor.shown(str(e)),)
            e.failure = dataclasses.replace(e.failure,
                                            reason=self.redactor.shown(e.failure.reason))
            self.bus.emit(Failed(failure_kind=e.failure.kind, sentence=str(e)), log)
            raise
        finally:
            self._files.flush()
            self._bill(log)
            self._save_learned()  # a failed turn may still have learned a limit
            if not kept:
                # Its tokens and recoveries count: a line with no message but the counters.
                self._files.save_history(self._history, self._counters())
        if record:
            self._history = result.history
            self._keep_shrinks(log.shrinks)
            self._files.save_history(result.history, self._counters())
            self._background.after_turn(self._history, spec)
        body, tokens = self.history_size()     # the history kept (unchanged by record=False)
        self.bus.emit(TurnFinished(history_bytes=body, est_tokens=tokens,
                                   window=self.window, cap=self.caps.effective()), log)
        return Reply(text=result.answer.text, finish_reason=result.stop.value,
                     usage=Usage(log.prompt_tokens, log.completion_tokens, log.cached_tokens,
                                 log.cache_write_tokens,
                                 cache_write_1h_tokens=log.cache_write_1h_tokens),
                     actions=log.actions, model=self.model)

    def dry_run(self, text: str | None = None, *, max_tokens: int | None = None,
                options: Mapping[str, Any] | None = None,
                settings: Settings | None = None) -> Prepared:
        """What the next request would be — its history, spec, size and every preparation
        step (as events) — computed without sending anything or changing the session.

        ``text``: the next user message (None: the history as it is). ``settings``: other
        settings to try. An LLM summary is replaced by an estimate of its size.
        """
        history = self._history + ((Message.user(text),) if text is not None else ())
        return dry_run(history, self._spec(max_tokens, options=options),
                       endpoint=self._endpoint, limits=self.limits, tools=self._toolbox,
                       store=self._store, settings=settings or self.settings,
                       current=self.settings, after=self._preparer)

    def what_if(self, settings: Settings | None = None, /, *, text: str | None = None,
                size: int | None = None, max_tokens: int | None = None,
                options: Mapping[str, Any] | None = None, stream: bool = True,
                **overrides: Any) -> Plan:
        """The next request under other settings, planned without sending or changing
        anything: every message's fate, sizes before/after, pre-flight, compaction, and
        the ladder on a rejection (``what_if.py``).

        ``overrides``: Settings fields, ``cap=`` (configured payload cap) and ``window=``
        (configured context window); ``settings``: a whole Settings to start from.
        ``text``: the next user message, or ``size``: its size in bytes; neither: a message
        the size of the last one sent (a plan is always for a request still to be sent).
        """
        return plan_what_if(self._history, text,
                            self._spec(max_tokens, stream=stream, options=options),
                            endpoint=self._endpoint, limits=self.limits, tools=self._toolbox,
                            store=self._store, current=self.settings, settings=settings,
                            overrides=overrides, name=f"session {self.name}", size=size,
                            history_size=self.history_size(), after=self._preparer)

    def _tell_background(self, log: TurnLog) -> None:
        """The background summary's news, told in this turn (never printed from the worker,
        where it would land in the user's typing); its requests are paid for here."""
        for event in self._background.take_events():
            if isinstance(event, BackgroundSummary):
                self._count(event.prompt_tokens, event.completion_tokens,
                            event.cached_tokens, event.cache_write_tokens,
                            event.cache_write_1h_tokens)
            self.bus.emit(event, log)

    @property
    def background(self) -> str:
        """The background summary's state: idle, preparing, ready or failed."""
        return self._background.state

    def on_background(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(state)`` from the worker when a background summary is ready or
        failed (the panel re-renders between cells); returns a function that unsubscribes."""
        return self._background.listen(callback)

    def _keep_shrinks(self, shrinks: list[Shrink]) -> None:
        if not shrinks:
            return
        self._compactions += sum(1 for s in shrinks if s.kind == "compaction")
        self._undo.append(tuple(shrinks))
        del self._undo[:-_UNDO_DEPTH]

    # -- history management -----------------------------------------------------------------
    @_one_at_a_time
    def compact(self, instructions: str | None = None) -> compactor.CompactionReport:
        """Compact the working history now (the SPEC's ``/compact``)."""
        self._background.discard()
        log = TurnLog()
        before = self._history
        spec = self._spec()
        current = self._sizer.measure(before, spec)
        ratio = self.settings.manual_compact_ratio
        target = min(self._sizer.compaction_target(ratio), int(current * ratio))
        try:
            new, report = self._compactor.run(before, target, spec, log,
                                              instructions=instructions, force=True)
        finally:
            # The summary request is paid for, whether the compaction is applied or not.
            self._bill(log)
        if report.applied:
            self._keep_shrinks([Shrink("compaction", before, len(new))])
            self._history = new
        self._files.save_history(self._history, self._counters())
        self._save_learned()
        return report

    @_one_at_a_time
    def undo_compact(self) -> None:
        """Restore the history from before the last turn's shrinks (later messages are kept)."""
        self._background.discard()
        if not self._undo:
            if self._compactions_before_resume:
                raise CtxRecoveryError(
                    f"session {self.name}'s "
                    f"{plural(self._compactions_before_resume, 'compaction')} happened "
                    "before it was resumed and cannot be undone (the history from before "
                    "them is not saved); the transcript keeps every message said.")
            raise CtxRecoveryError("there is no compaction to undo in this session.")
        history = self._history
        for shrink in reversed(self._undo.pop()):
            later = history[shrink.after_len:] if len(history) >= shrink.after_len else ()
            history = shrink.before + later
        self._history = history
        self._files.save_history(self._history)

    @_one_at_a_time
    def forget_limits(self) -> tuple[int | None, int | None]:
        """Forget the payload cap learned on this session's network path (shared: every
        session on the path forgets it) and a context window learned from an overflow, e.g.
        after the proxy's limit was raised. A configured cap stays. Returns what was
        forgotten: (cap, window), None where nothing was learned."""
        forgotten = self.limits.forget_learned()
        self._save_learned(exact=True)
        return forgotten

    @_one_at_a_time
    def reset(self) -> None:
        """Start the working history afresh (the transcript keeps everything).

        What was learned about the network and the model (caps, calibration) stays; the
        payload SYSTEM NOTICE went with the old history, so it may be given again.
        """
        self._background.discard()
        self._history = (Message.system(self.system),) if self.system else ()
        self._undo.clear()
        self._compactions_before_resume = 0   # their history was reset away anyway
        self.limits.payload_notice_given = False
        self._files.mark("reset")
        self._files.save_history(self._history)

    @_one_at_a_time
    def close(self) -> None:
        """Save the history snapshot, let another process open the session, and release the
        provider's client when the session built it."""
        self._background.discard()
        self._files.checkpoint(self._history, self._counters())
        self._save_learned(exact=True)
        self._files.release()
        self._endpoint.close()

    def __enter__(self) -> ChatSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ChatSession(model={self.model!r}, name={self.name!r}, "
                f"messages={len(self._history)})")


def _auto_name() -> str:
    return f"session-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_session_counter)}"

