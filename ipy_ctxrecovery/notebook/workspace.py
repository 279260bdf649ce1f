"""Workspace: what one kernel's ``%%chat`` cells share — sessions by name, the embedded
emulator, the panels, and what each network path taught.

The magics hold configuration (traitlets) and parse flags; the workspace holds state and
does the work, so it can be driven (and tested) without IPython's parser. Sessions on one
network path share what it taught about payload caps (:class:`~..session.learned.PathRegistry`).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from typing import Any, Protocol

from IPython.core.error import UsageError

from ..core.wording import messages_held
from ..emulator import Emulator
from ..errors import CtxRecoveryError
from ..providers import is_emulator_model
from ..session import ChatSession
from ..session.learned import PathRegistry
from ..session.store import (
    Transcript,
    archive,
    is_generated_name,
    saved_sessions,
    validate_name,
)
from ..session.tools import Tool
from ..settings import Settings
from .panel import ContextPanel
from .turn_card import TurnRecord

__all__ = ["DEFAULT_SESSION", "Defaults", "Workspace", "as_usage_error"]

DEFAULT_SESSION = "default"


class Defaults(Protocol):
    """What a new session is configured with (the magics' traits and environment)."""

    max_tokens: int | None
    system: str | None

    def settings(self) -> Settings: ...

    def model(self) -> str: ...


@contextlib.contextmanager
def as_usage_error() -> Iterator[None]:
    """A bad model string, session name or setting becomes a one-sentence UsageError."""
    try:
        yield
    except (CtxRecoveryError, ValueError) as e:
        raise UsageError(str(e)) from e
    except OSError as e:  # the session's data directory
        raise UsageError(f"cannot use the session directory {e.filename or ''} "
                         f"({e.strerror or e}); set IPY_CTXRECOVERY_DIR to a writable "
                         "directory.") from e


class Workspace:
    """Sessions by name, the embedded emulator and the panels of one kernel."""

    def __init__(self, defaults: Defaults) -> None:
        self.defaults = defaults
        self.sessions: dict[str, ChatSession] = {}
        self.panels: dict[str, ContextPanel] = {}
        self.last_turns: dict[str, TurnRecord] = {}
        """Each session's last ``%%chat`` turn, for a panel shown after it."""
        self.emulator: Emulator | None = None
        self.emulator_limits: dict[str, Any] = {}
        self.paths = PathRegistry()
        self.current = DEFAULT_SESSION
        """The session the ``%chat`` subcommands and the panel use without ``-S``: the
        one the last ``%%chat`` cell talked to."""

    def tell(self, name: str, notes: tuple[str, ...] | list[str]) -> None:
        """After session ``name`` changed: print what it forgot (one ℹ line each) and bring
        its panel up to date (the cap and window may have changed)."""
        for note in notes:
            print(f"ℹ session {name}: {note}")
        panel, session = self.panels.get(name), self.sessions.get(name)
        if panel is not None and session is not None:
            panel.attach(session)

    # -- the embedded emulator ---------------------------------------------------------------
    def ensure_emulator(self) -> Emulator:
        """The embedded emulator, started on first use with the current limits."""
        if self.emulator is None:
            emulator = Emulator(**self.emulator_limits)
            emulator.start()
            self.emulator = emulator
        return self.emulator

    def restart_emulator(self, limits: dict[str, Any],
                         notes: list[tuple[str, str]] | None = None) -> Emulator:
        """Replace the embedded emulator with one using ``limits``; sessions on it move over.

        Each session keeps its history and counters; a cap it learned from the old
        emulator is forgotten (the new one may have other limits): ``(who, sentence)``
        pairs saying so are appended to ``notes``, one per network path — the sessions
        that shared the old path shared its cap, so they share the line (``who`` names
        them: ``session a`` or ``sessions a, b``).
        """
        new = Emulator(**limits)
        new.start()
        old, self.emulator, self.emulator_limits = self.emulator, new, dict(limits)
        told: dict[tuple[str, str], list[str]] = {}
        for name, session in list(self.sessions.items()):
            if is_emulator_model(session.model):
                path = session.endpoint.path_key() or f"session {name}"   # None: not shared
                with as_usage_error():
                    forgotten = session.update(emulator=new)
                for note in forgotten:
                    told.setdefault((path, note), []).append(name)
                self.tell(name, ())  # the notes are printed after the restart line
        if notes is not None:
            notes.extend((("session " if len(names) == 1 else "sessions ") + ", ".join(names),
                          note) for (_, note), names in told.items())
        if old is not None:
            old.close()
        return new

    # -- sessions ------------------------------------------------------------------------------
    def session(self, name: str = DEFAULT_SESSION) -> ChatSession:
        """The session called ``name``, created with the current configuration when new."""
        if name not in self.sessions:
            self.replace_session(name, self.new_session(name, self.defaults.model()))
        return self.sessions[name]

    def _session_kwargs(self, model: str, tools: tuple[Tool, ...]) -> dict[str, Any]:
        return {"settings": self.defaults.settings(), "tools": tools,
                "max_tokens": self.defaults.max_tokens, "paths": self.paths,
                "emulator": self.ensure_emulator() if is_emulator_model(model) else None}

    def new_session(self, name: str, model: str, *, system: str | None = None,
                    tools: tuple[Tool, ...] = ()) -> ChatSession:
        """A new ChatSession; ``name`` is kept on disk unless it is the kernel's default."""
        with as_usage_error():
            return ChatSession(model, system=system or self.defaults.system,
                               name=None if name == DEFAULT_SESSION else name,
                               **self._session_kwargs(model, tools))

    def resume_session(self, stored_name: str, *, model: str | None = None,
                       tools: tuple[Tool, ...] = ()) -> ChatSession:
        """Reopen a session from disk (history, transcript) with the current configuration."""
        with as_usage_error():
            if not Transcript.exists(stored_name):
                raise UsageError(f"there is no saved session named {stored_name!r}; "
                                 "%chat sessions lists the saved ones.")
            if not model:
                files = Transcript(stored_name)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")     # resume names a damaged file
                    model = str(files.load_meta().get("model") or files.learned_model() or "")
            return ChatSession.resume(stored_name, model=model,
                                      **self._session_kwargs(model, tools))

    def open_session(self, name: str, model: str | None, *, system: str | None = None,
                     tools: tuple[Tool, ...] = (), new: bool = False) -> ChatSession:
        """The session a ``%%chat -S name`` cell talks to; it becomes the current one.

        One conversation, one transcript: a name saved on disk (by an earlier kernel)
        continues that conversation, said in one line; ``new`` starts a clean one and
        keeps the earlier conversation under its own name (said too). The kernel's
        default session is new in every kernel (``-c`` continues the latest saved one).
        """
        with as_usage_error():
            validate_name(name)
        existing = self.sessions.get(name)
        if existing is not None and not new:
            if system is not None and system != existing.system:
                raise UsageError(f"--system applies when a session starts; add --new to "
                                 f"restart session {name!r} with it.")
            session = self.update_session(name, model=model, tools=tools)
        elif name != DEFAULT_SESSION and not new and Transcript.exists(name):
            session = self.resume_session(name, model=model, tools=tools)
            if system is not None and system != session.system:
                session.close()
                raise UsageError(f"--system applies when a session starts; {name!r} is a "
                                 f"saved conversation — add --new to start it afresh.")
            self.replace_session(name, session)
            print(f"ℹ continuing saved session {name}: {_told(session)} "
                  f"(--new starts a new conversation)")
        else:
            if existing is not None:
                self.sessions.pop(name).close()     # lets its files be set aside
            kept = None
            if name != DEFAULT_SESSION:
                with as_usage_error():
                    kept = archive(name)
            session = self.new_session(name, model or self.defaults.model(), system=system,
                                       tools=tools)
            self.replace_session(name, session)
            if kept is not None:
                print(f"ℹ new conversation in session {name}; the earlier one is kept as "
                      f"{kept} (%chat resume {kept})")
        self.current = name
        return session

    def continue_latest(self, model: str | None = None,
                        tools: tuple[Tool, ...] = ()) -> tuple[str, ChatSession]:
        """``%%chat -c``: the most recently used saved session, reopened under its name.

        An earlier kernel's default session (kept on disk under a generated name) comes
        back as this kernel's ``default``, as the notebook's earlier cells called it, unless
        this kernel's default already holds a conversation of its own.
        """
        live = {s.name for s in self.sessions.values()}
        held = []
        for saved in saved_sessions():
            if saved.name in live:
                name = next(k for k, s in self.sessions.items() if s.name == saved.name)
                return name, self.open_session(name, model, tools=tools)
            if saved.open_elsewhere is None:
                name = DEFAULT_SESSION if self._default_is_free(saved.name) else saved.name
                session = self.resume_session(saved.name, model=model, tools=tools)
                self.replace_session(name, session)
                self.current = name
                shown = name if name == saved.name else f"{name} ({saved.name})"
                print(f"ℹ continuing saved session {shown}: {_told(session)}")
                return name, session
            held.append(saved.name)
        if held:
            raise UsageError(f"every saved session is open in another process "
                             f"({', '.join(held)}): close one there to continue it here, "
                             "or start a new one with %%chat -S NAME.")
        raise UsageError("there is no saved session to continue yet; %%chat -S NAME starts "
                         "one that is saved under NAME.")

    def _default_is_free(self, stored_name: str) -> bool:
        """Whether saved session ``stored_name`` was a default one and can be this
        kernel's default: nothing has been said in the default session here yet."""
        if not is_generated_name(stored_name):
            return False
        here = self.sessions.get(DEFAULT_SESSION)
        return here is None or here.last_used() is None

    def reopen(self, names: list[tuple[str, str]], current: str) -> None:
        """After ``%reload_ext``: open again the sessions the previous load had open
        (``(key, saved name)`` pairs), from their files."""
        reopened = []
        for key, saved in names:
            if not Transcript.exists(saved):
                continue
            try:
                session = self.resume_session(saved)
            except UsageError as e:
                print(f"⚠ session {key} was not reopened: {e}")
                continue
            self.replace_session(key, session)
            reopened.append(key)
        if current in self.sessions:
            self.current = current
        if reopened:
            print(f"ℹ reopened after the reload: {', '.join(reopened)}")

    def update_session(self, name: str, *, model: str | None = None,
                       tools: tuple[Tool, ...] = ()) -> ChatSession:
        """Move session ``name`` to another model and/or offer it more tools, in place.

        The same session object carries on (``ChatSession.update``): history, usage
        counters and what it learned stay; a learned cap is forgotten only when the new
        model is reached another way (said in one ℹ line). On the same model the
        provider is kept, and with it any SDK client the user built.
        """
        session = self.sessions[name]
        offered = {t.name: t for t in session.tools}
        changes: dict[str, Any] = {}
        if any(offered.get(t.name) is not t for t in tools):  # new, or redefined
            changes["tools"] = tuple({**offered, **{t.name: t for t in tools}}.values())
        if model is not None and model != session.model:
            changes["model"] = model
            if is_emulator_model(model):
                changes["emulator"] = self.ensure_emulator()
        if changes:
            with as_usage_error():
                self.tell(name, session.update(**changes))
        return session

    def replace_session(self, name: str, session: ChatSession, *,
                        close_old: bool = True) -> None:
        """Make ``session`` the one ``%%chat -S name`` talks to.

        Also the way to use a ChatSession built in Python, e.g. with your own SDK client:
        ``get_magics().workspace.replace_session("work", ChatSession(model, client=mine))``.
        """
        old = self.sessions.get(name)
        self.sessions[name] = session
        if old is not session:
            self.last_turns.pop(name, None)     # another conversation's turn
        if close_old and old is not None and old is not session:
            old.close()
        panel = self.panels.get(name)
        if panel is not None:
            panel.attach(session)

    # -- panels --------------------------------------------------------------------------------
    def panel(self, name: str) -> ContextPanel:
        """The live panel of session ``name`` (made on first use)."""
        panel = self.panels.get(name)
        if panel is None:
            panel = ContextPanel(title=name, settings=self.defaults.settings())
            panel.attach(self.session(name))
            last = self.last_turns.get(name)
            if last is not None:
                panel.recall(last)
            self.panels[name] = panel
        return panel

    @contextlib.contextmanager
    def panel_turn(self, name: str) -> Iterator[None]:
        """Within the block, session ``name``'s panel (if shown) tracks a running turn —
        a manual compaction, say — and ends it however the block ends."""
        panel = self.panels.get(name)
        if panel is None:
            yield
            return
        panel.begin_turn()
        interrupted = False
        try:
            yield
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            panel.end_turn(interrupted=interrupted)

    def close(self) -> None:
        """Close panels, sessions and the emulator (``%unload_ext``)."""
        for panel in self.panels.values():
            panel.close()
        for session in self.sessions.values():
            session.close()
        self.panels.clear()
        self.sessions.clear()
        if self.emulator is not None:
            self.emulator.close()
            self.emulator = None


def _told(session: ChatSession) -> str:
    """``7 messages in the working history (16 in the transcript), last used 2026-11-30
    14:02``: what the model will see, and what was said when that is more."""
    when = session.last_used()
    used = time.strftime("%Y-%m-%d %H:%M", time.localtime(when)) if when else "never"
    return (f"{messages_held(len(session.history), len(session.transcript))}, "
            f"last used {used}")
