"""Microcompact (SPEC §6): old tool results become previews, older ones one-line summaries.

Pure, no LLM, no network. STUB — contract for the implementer.
"""

from __future__ import annotations

from dataclasses import dataclass

from .budget import ResultStore
from .config import Settings
from .history import History

__all__ = ["MicrocompactReport", "microcompact"]


@dataclass(frozen=True, slots=True)
class MicrocompactReport:
    truncated: int
    summarized: int
    bytes_freed: int

    @property
    def message(self) -> str:
        """``🗜 microcompact: 3 truncated, 2 summarized, 1.7 MB freed``"""
        raise NotImplementedError


def microcompact(history: History, *, settings: Settings,
                 store: ResultStore) -> tuple[History, MicrocompactReport]:
    raise NotImplementedError
