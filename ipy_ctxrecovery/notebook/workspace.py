"""Workspace: what one kernel's ``%%chat`` cells share — sessions by name, the embedded
emulator, the panels, and what each network path taught.

The magics hold configuration (traitlets) and parse flags; the workspace holds state and
does the work, so it can be driven (and tested) without IPython's parser. Sessions on one
network path share what it taught about payload caps (:class:`~..session.learned.PathRegistry`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from IPython.core.error import UsageError

from ..config import Settings
from ..emulator import Emulator
from ..errors import CtxRecoveryError
from ..providers import is_emulator_model
from ..session import ChatSession
from ..session.learned import PathRegistry
from ..tools import Tool
from ..transcript import Transcript
from .panel import ContextPanel

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
        self.cells: dict[str, int] = {}
        """Cells answered per session name (``%chat usage``)."""
        self.emulator: Emulator | None = None
        self.emulator_limits: dict[str, Any] = {}
        self.paths = PathRegistry()

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
        emulator is forgotten (the new one may have other limits): ``(session, sentence)``
        pairs saying so are appended to ``notes``.
        """
        new = Emulator(**limits)
        new.start()
        old, self.emulator, self.emulator_limits = self.emulator, new, dict(limits)
        for name, session in list(self.sessions.items()):
            if is_emulator_model(session.model):
                with as_usage_error():
                    forgotten = session.update(emulator=new)
                if notes is not None:
                    notes.extend((name, note) for note in forgotten)
                self.tell(name, ())  # the notes are printed after the restart line
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
            model = model or str(Transcript(stored_name).load_meta().get("model") or "")
            return ChatSession.resume(stored_name, model=model,
                                      **self._session_kwargs(model, tools))

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
        self.cells.pop(name, None)
        if close_old and old is not None and old is not session:
            old.close()
        panel = self.panels.get(name)
        if panel is not None:
            panel.attach(session)

    def answered(self, name: str) -> None:
        """A cell of session ``name`` was answered."""
        self.cells[name] = self.cells.get(name, 0) + 1

    # -- panels --------------------------------------------------------------------------------
    def panel(self, name: str) -> ContextPanel:
        """The live panel of session ``name`` (made on first use)."""
        panel = self.panels.get(name)
        if panel is None:
            panel = ContextPanel(title=name, settings=self.defaults.settings())
            panel.attach(self.session(name))
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
