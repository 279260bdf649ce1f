"""Tool-result budget (SPEC §5): per-turn and per-result limits; full content persisted once.

STUB — contract for the implementer; keep these signatures (or update every caller).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .history import History

__all__ = ["BudgetReport", "ResultStore", "enforce_budget", "preview"]


class ResultStore:
    """A per-session directory (mode 0700) of full tool results, content-addressed, files 0600.

    ``persist(content)`` writes a result once at a stable path (sha256 of the content)
    and returns that path; persisting the same content again writes nothing.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def persist(self, content: str) -> Path:
        raise NotImplementedError

    def path_for(self, content: str) -> Path:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class BudgetReport:
    replaced: int
    persisted: tuple[Path, ...]
    chars_before: int
    chars_after: int


def preview(content: str, *, limit: int, head: int, tail: int, path: Path | None) -> str:
    """Head+tail preview of ``content`` no longer than ``limit`` chars, naming ``path``."""
    raise NotImplementedError


def enforce_budget(history: History, *, store: ResultStore, turn_budget_chars: int,
                   per_result_max_chars: int, head_chars: int = 4_000,
                   tail_chars: int = 1_000) -> tuple[History, BudgetReport]:
    """Replace over-limit tool results of the current turn by previews naming their file."""
    raise NotImplementedError
