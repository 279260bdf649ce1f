"""The notebook layer: ``%%chat``/``%chat`` magics, their workspace, the panel and display.

Only this layer imports IPython and ipywidgets; it drives :class:`~..session.ChatSession`.
"""

from __future__ import annotations

from .magics import ChatMagics, get_magics, load, unload

__all__ = ["ChatMagics", "get_magics", "load", "unload"]
