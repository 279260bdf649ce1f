"""What a session learns the hard way, in one object: :class:`LearnedLimits`; and what a
network path teaches, shared by the sessions on it: :class:`PathRegistry`.

A session holds the evidence of its network path about body sizes (recorded by the
recovery flow, ``core.recovery``), and learns the real context window, the output limit,
the token calibration, and two one-shot flags. :class:`LearnedLimits` holds them, forgets
what a new provider makes stale, and round-trips through ``learned.json`` under these
rules (the same for a live ``update`` and for ``resume``):

- payload caps (largest ok, smallest rejected) belong to the **network path** (the
  client's base URL and the emulator behind it): sessions of one
  :class:`PathRegistry` (one per kernel) on the same path share them live, and a saved
  cap is restored only on the same path; an assumed cap belongs to the session;
- the learned window and output limit: same path **and** same model string (and the
  window only when the configured ``context_window`` is the one it was learned under);
- the token calibration belongs to the model's tokenizer: same model string, any path;
- the one-shot no-cap warning and the payload-notice flag belong to the session and its
  history snapshot, which ``resume`` always restores: restored always.

Configured values (``max_payload``, ``context_window``, ``chars_per_token``...) always come
from the current settings, never from disk. A corrupt or unknown-version file is ignored
with one warning.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.events import CapChanged, Event, WindowLearned
from ..core.preflight import MAX_BYTES_PER_TOKEN, MIN_BYTES_PER_TOKEN, TokenEstimator
from ..core.recovery.evidence import Caps, PathEvidence
from ..failures import Failure, FailureKind
from ..settings import MAX_CAP, MAX_WINDOW, MIN_CAP, MIN_WINDOW, Settings, format_size

__all__ = ["CALIBRATION_DRIFT", "LARGEST_OK_GROWTH", "VERSION", "LearnedLimits", "PathRegistry"]

VERSION = 1
"""Format version of ``learned.json``; another version is ignored (with a warning)."""

CALIBRATION_DRIFT = 0.02
"""The token calibration is rewritten only when it moved more than this (relative) from
what was saved: it changes a little with every answer's usage, and an estimate 2 % off
changes no decision that matters (pre-flight keeps a 10 % exact-fit margin)."""

LARGEST_OK_GROWTH = 0.5
"""With no rejection known, the largest body that passed grows with every turn; it is
rewritten only when it grew past this (relative). A value saved a little low only makes
a cap learned after ``resume`` a little lower: the safe side."""


def _same(state: dict[str, Any], saved: dict[str, Any] | None) -> bool:
    """Whether ``state`` is what was saved, up to the drifts allowed above."""
    if saved is None:
        return False
    drifting = ("calibration", "caps")
    if {k: v for k, v in state.items() if k not in drifting} \
            != {k: v for k, v in saved.items() if k not in drifting}:
        return False
    caps, saved_caps = state["caps"], saved["caps"]
    if {k: v for k, v in caps.items() if k != "largest_ok"} \
            != {k: v for k, v in saved_caps.items() if k != "largest_ok"}:
        return False
    largest, saved_largest = caps["largest_ok"], saved_caps["largest_ok"]
    drifted = caps["smallest_rejected"] is None \
        and saved_largest <= largest <= saved_largest * (1 + LARGEST_OK_GROWTH)
    if largest != saved_largest and not drifted:
        return False
    new, old = state["calibration"], saved["calibration"]
    if (new["samples"] > 0) != (old["samples"] > 0):
        return False
    before = old["bytes_per_token"]
    return bool(abs(new["bytes_per_token"] - before) <= CALIBRATION_DRIFT * before)


class PathRegistry:
    """The payload limits learned per network path, for the sessions that share it.

    One registry per kernel (the notebook's workspace holds it), handed to each session;
    a session made without one gets its own. A path the provider cannot name (None) is
    never shared.
    """

    def __init__(self) -> None:
        self._paths: dict[str, PathEvidence] = {}

    def limits(self, key: str | None) -> PathEvidence:
        if key is None:
            return PathEvidence()
        return self._paths.setdefault(key, PathEvidence())

    def __contains__(self, key: object) -> bool:
        return key in self._paths


@dataclass
class LearnedLimits:
    """Everything a session learned about its limits (see the module docstring)."""

    caps: Caps
    tokens: TokenEstimator
    window: int | None = None
    """A context window an overflow reported below the configured/catalogue one."""
    output_limit: int | None = None
    """A max_tokens ceiling learned from an output-limit rejection."""
    seen_tokens: int = 0
    """The most tokens (prompt + answer) a reply reported: the window holds at least that."""
    server_window: int | None = None
    """The window the server advertised for the model (asked once, for a guessed window)."""
    asked_server: bool = False
    warned_no_cap: bool = False
    payload_notice_given: bool = False
    cap_note: str | None = None
    """Why a learned cap is gone (until a new one is learned), for ``status()``."""
    server_did_not_compact: bool = False
    """A reply to a request past the server-compaction trigger came back without a
    compaction: this server does not compact, and the package compacts itself from then on
    (``server_side.py``)."""
    _saved: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def fresh(cls, settings: Settings, path: PathEvidence | None = None) -> LearnedLimits:
        return cls(caps=Caps.from_settings(settings, path),
                   tokens=TokenEstimator.from_settings(settings))

    # -- what is in force -------------------------------------------------------------------
    def window_for(self, base: int) -> int:
        """The window in force: ``base`` (configured or the model's), or a smaller learned one."""
        return min(base, self.window) if self.window else base

    def output_cap_for(self, base: int) -> int:
        """The most max_tokens may be: ``base`` (the model's), or a lower learned limit."""
        return min(base, self.output_limit) if self.output_limit else base

    @property
    def visible_cap_note(self) -> str | None:
        return self.cap_note if self.caps.learned is None and self.caps.assumed is None \
            else None

    # -- learning ---------------------------------------------------------------------------
    def learn_window(self, failure: Failure, window: int,
                     rejected_tokens: int | None = None) -> list[Event]:
        """A context window an overflow reported below ``window`` (the one in force).

        An overflow that names no window (the Responses API's) still shows one bound: the
        window is below ``rejected_tokens``, the rejected request's tokens (its prompt's
        estimate and the answer it reserved). Below ``window``, that bound is used as the
        window — else each such overflow would be rejected again on the same window, a
        blind ladder step finding nothing to cut under it."""
        if failure.kind is not FailureKind.CONTEXT_OVERFLOW:
            return []
        limit = failure.limit_tokens
        if limit is not None:
            if 0 < limit < window:
                # A wrong CHATCLI_CONTEXT_WINDOW (or catalogue entry) would otherwise let
                # the history grow past the real window again every few turns.
                self.window = limit
                return [WindowLearned(window=limit, previous=window)]
            return []
        if failure.prompt_tokens is None and rejected_tokens is not None \
                and 0 < rejected_tokens < window:
            self.window = rejected_tokens
            return [WindowLearned(window=rejected_tokens, previous=window, bound=True)]
        return []

    def assume_cap(self, cap: int) -> CapChanged | None:
        """Adopt the SPEC auto-cap if none was assumed; the event when it is the cap in force."""
        if self.caps.assumed is not None:
            return None
        self.caps.assumed = cap
        return CapChanged(cap=cap, source="assumed") if self.caps.source == "assumed" else None

    def on_success(self, body_bytes: int, prompt_tokens: int | None,
                   completion_tokens: int | None = None, *, calibrate: bool = True) -> None:
        """A ``body_bytes`` request was answered with this usage: the token calibration and
        the most tokens seen (what it shows about the path: ``core.recovery.flow.passed``).

        ``calibrate=False``: the usage is not the body's. A server that compacted the
        request or cleared tool uses in it reports the tokens of what the model read after
        that, fewer than the body held; as a bytes/token sample it would inflate the
        calibration by half and shift the next compaction trigger with it."""
        if prompt_tokens:
            if calibrate:
                self.tokens.calibrate(body_bytes, prompt_tokens)
            self.seen_tokens = max(self.seen_tokens, prompt_tokens + (completion_tokens or 0))

    # -- a new configuration or provider -------------------------------------------------------
    def configure(self, old: Settings, new: Settings) -> None:
        """New settings on a live session: configured values change, learned ones stay."""
        if new.context_window is not None and new.context_window != old.context_window:
            self.window = None          # the user chose a window: it replaces the learned one
        if new.max_payload != self.caps.configured:
            self.cap_note = None        # the user chose a cap: the old note is moot
        self.caps.configured = new.max_payload
        self.caps.learned_fraction = new.learned_cap_fraction
        if self.tokens.samples == 0:
            self.tokens.bytes_per_token = new.chars_per_token

    def forget_learned(self) -> tuple[int | None, int | None]:
        """Forget the payload cap learned (or assumed) on this network path and a window an
        overflow taught — for every session sharing the path — when the proxy's or the
        model's limit was raised. Returns (the cap, the window) that were in force."""
        cap = self.caps.learned if self.caps.learned is not None else self.caps.assumed
        window = self.window
        self.caps.smallest_rejected = None
        self.caps.assumed = None
        self.window = None
        self.cap_note = None
        return cap, window

    def forget(self, settings: Settings, *, model_changed: bool, path_changed: str | None,
               new_path: PathEvidence) -> str | None:
        """A new provider: drop what belongs to the old model or path (module docstring).

        Returns a sentence for a learned or assumed payload cap that was dropped.
        """
        note = None
        if model_changed or path_changed is not None:
            self.server_window, self.asked_server = None, False
        if model_changed:
            self.tokens = TokenEstimator.from_settings(settings)
            self.output_limit = None
            self.window = None
        if path_changed is not None:
            learned, assumed = self.caps.learned, self.caps.assumed
            if learned is not None or assumed is not None:
                kind = "learned" if learned is not None else "assumed"
                shown = format_size(learned if learned is not None else assumed or 0)
                note = f"{kind} payload cap {shown} forgotten: {path_changed} may have other limits"
            # The note is about this change: an earlier path's forgotten cap is old news.
            self.cap_note = note
            self.caps = Caps.from_settings(settings, new_path)
            self.output_limit = None
            self.window = None
        return note

    # -- learned.json --------------------------------------------------------------------------
    def to_json(self, *, model: str, path: str | None, settings: Settings) -> dict[str, Any]:
        """The learned state as a JSON-able dict (no configured values, no secrets)."""
        caps, tokens = self.caps, self.tokens
        return {
            "version": VERSION,
            "model": model,
            "path": path,
            "context_window": settings.context_window,
            "caps": {"largest_ok": caps.largest_ok, "smallest_rejected": caps.smallest_rejected,
                     "assumed": caps.assumed},
            "learned_window": self.window,
            "output_limit": self.output_limit,
            "calibration": {"bytes_per_token": tokens.bytes_per_token,
                            "samples": tokens.samples},
            "warned": self.warned_no_cap,
            "payload_notice_sent": self.payload_notice_given,
        }

    def changed_since_saved(self, state: dict[str, Any], *, exact: bool = False) -> bool:
        """True when ``state`` really changed since it was last saved (then it counts as
        saved): any cap, window, limit or flag; the calibration only past
        :data:`CALIBRATION_DRIFT`, the largest body that passed (no rejection known) only
        past :data:`LARGEST_OK_GROWTH`. ``exact`` (on close): any difference at all."""
        if (state == self._saved) if exact else _same(state, self._saved):
            return False
        self._saved = state
        return True

    def restore(self, data: Any, *, model: str, path: str | None, settings: Settings,
                source: str) -> None:
        """Apply saved state ``data`` (from ``source``, a file name for the warning) where it
        still applies; sets :attr:`cap_note` when a saved cap is not restored."""
        if not isinstance(data, dict) or data.get("version") != VERSION or not _valid(data):
            version = data.get("version") if isinstance(data, dict) else None
            why = (f"it has unknown format version {version!r}"
                   if isinstance(data, dict) and version != VERSION else "it is not valid")
            warnings.warn(f"ignoring {source}: {why}; this session will learn its limits "
                          "again.", RuntimeWarning, stacklevel=3)
            return
        senseless = _senseless(data)
        if senseless is not None:
            warnings.warn(f"ignoring {source}: {senseless}, which no network path or model "
                          "could mean; this session will learn its limits again.",
                          RuntimeWarning, stacklevel=3)
            return
        same_model = data["model"] == model
        same_path = path is not None and data["path"] == path
        caps, cal = data["caps"], data["calibration"]
        if same_path:
            # A path this kernel already knows keeps what it learned since (the live
            # values are newer than the file); an unknown one starts from the file.
            if self.caps.smallest_rejected is None and self.caps.largest_ok == 0:
                self.caps.largest_ok = caps["largest_ok"]
                self.caps.smallest_rejected = caps["smallest_rejected"]
            self.caps.assumed = caps["assumed"]
        elif caps["smallest_rejected"] is not None or caps["assumed"] is not None:
            kind = "learned" if caps["smallest_rejected"] is not None else "assumed"
            size = caps["smallest_rejected"] if kind == "learned" else caps["assumed"]
            self.cap_note = (f"{kind} payload cap (below {format_size(size)}) not restored: "
                             "this endpoint or emulator is not the one it was learned on")
        if same_path and same_model:
            self.output_limit = data["output_limit"]
            if data["context_window"] == settings.context_window:
                self.window = data["learned_window"]
        if same_model and cal["samples"] > 0:
            self.tokens.bytes_per_token = float(cal["bytes_per_token"])
            self.tokens.samples = cal["samples"]
        self.warned_no_cap = self.warned_no_cap or data["warned"]
        self.payload_notice_given = data["payload_notice_sent"]
        self._saved = (self.to_json(model=model, path=path, settings=settings)
                       if same_path and same_model else None)


def _int(value: Any, *, optional: bool = True) -> bool:
    if value is None:
        return optional
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


MAX_BODY = 64 * MAX_CAP
"""The largest request body that can have passed: far above any proxy's limit (1 GB)."""
MAX_SAMPLES = 10**12


def _senseless(data: Mapping[str, Any]) -> str | None:
    """What in a well-formed ``learned.json`` no network or model could mean (a hand edit,
    damage), in words, or None: bodies and caps between the sizes a proxy's limit can be
    (``settings.MIN_CAP``..``MAX_CAP``; a body that passed up to :data:`MAX_BODY`),
    windows and limits the sizes models have, a calibration the estimator can hold."""
    caps, cal = data["caps"], data["calibration"]
    sizes = (("caps.largest_ok", caps["largest_ok"], 0, MAX_BODY),
             ("caps.smallest_rejected", caps["smallest_rejected"], MIN_CAP, MAX_BODY),
             ("caps.assumed", caps["assumed"], MIN_CAP, MAX_CAP))
    for key, value, low, high in sizes:
        if value is not None and not low <= value <= high:
            shown = format_size(value) if value <= 1024 * MAX_BODY else "far more than 64 GB"
            return f"its {key} is {shown}"
    tokens = (("learned_window", data["learned_window"], 1), ("output_limit",
              data["output_limit"], 1), ("context_window", data["context_window"], MIN_WINDOW))
    for key, value, low in tokens:
        if value is not None and not low <= value <= MAX_WINDOW:
            shown = f"{value:,}" if value <= 1000 * MAX_WINDOW else "far more than 10 billion"
            return f"its {key} is {shown} tokens"
    bpt, samples = cal["bytes_per_token"], cal["samples"]
    if not (math.isfinite(bpt) and MIN_BYTES_PER_TOKEN <= bpt <= MAX_BYTES_PER_TOKEN):
        return f"its calibration.bytes_per_token is {bpt!r}"
    if samples > MAX_SAMPLES:
        return f"its calibration.samples is {samples:,}"
    return None


def _valid(data: Mapping[str, Any]) -> bool:
    """The shape ``to_json`` writes (a hand-edited or torn file fails here, not later)."""
    if not isinstance(data.get("model"), str):
        return False
    caps, cal = data.get("caps"), data.get("calibration")
    if not isinstance(caps, dict) or not isinstance(cal, dict):
        return False
    bpt = cal.get("bytes_per_token")
    return (_int(caps.get("largest_ok"), optional=False) and _int(caps.get("smallest_rejected"))
            and _int(caps.get("assumed")) and _int(data.get("learned_window"))
            and _int(data.get("output_limit")) and _int(data.get("context_window"))
            and _int(cal.get("samples"), optional=False)
            and isinstance(bpt, int | float) and not isinstance(bpt, bool) and bpt > 0
            and isinstance(data.get("path"), str | None)
            and isinstance(data.get("warned"), bool)
            and isinstance(data.get("payload_notice_sent"), bool))
