"""What a network path showed about the bodies it takes: :class:`PathEvidence`.

A limit is inferred from evidence, never from the kind of one failure. For each
:class:`~ipy_ctxrecovery.failures.Signature` the path keeps the smallest body refused with
it, beside the largest body that passed (shared by every signature):

- a 413 (``SIZE``) names a size: one refusal above what passed is a limit;
- the others (a block page, a drop, a proxy's bare 5xx, a cut body) may be about size or
  not. The first refusal above what passed is a *suspect*; a second refusal of the same
  signature above what passed confirms a limit (at most two rejections per limit), and so
  does a smaller body fitted from the same request passing (the request is fitted under
  the suspect's limit, :meth:`PathEvidence.adopt`, and it stays when the fit passes);
- a refusal of a body no bigger than one that passed is not about size (but a 413, which
  says so: the limit came down). It withdraws what that signature suggested (a content
  rule or a blip caused it), and learns nothing;
- a body that passes withdraws every limit and suspect at or below its size.

The cap in force derives from it (``preflight.Caps``): never below the largest body that
passed. One object per network path, shared by the sessions on it (``PathRegistry``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ...failures import Failure, FailureKind, Signature
from ...settings import Settings
from ..events import CapSource

__all__ = ["Caps", "Finding", "Observation", "PathEvidence", "signature_of"]


_KIND_SIGNATURES = {FailureKind.PAYLOAD_TOO_LARGE: Signature.SIZE,
                    FailureKind.WAF_REJECTION: Signature.BLOCK,
                    FailureKind.LIKELY_PAYLOAD: Signature.DROP}


def signature_of(failure: Failure) -> Signature | None:
    """How ``failure`` refused its body: the classifier's signature, else the one its kind
    implies (a failure made by hand, or by a provider that does not classify)."""
    return failure.signature or _KIND_SIGNATURES.get(failure.kind)


class Finding(StrEnum):
    """What one refusal shows about the path."""

    LIMIT = "limit"          # a size limit: learned, or lowered
    SUSPECT = "suspect"      # maybe a size limit: one more refusal of its kind confirms it
    NOT_SIZE = "not_size"    # a body as big already passed: content, or a blip
    NONE = "none"            # no signature: not evidence about the path at all


@dataclass(frozen=True, slots=True)
class Observation:
    """One refusal's finding: ``size`` bytes refused with ``signature``; ``withdrawn`` the
    limit (its smallest refused size) the finding took back, if any."""

    finding: Finding
    signature: Signature | None
    size: int
    withdrawn: int | None = None

    @property
    def about_size(self) -> bool:
        return self.finding in (Finding.LIMIT, Finding.SUSPECT)


@dataclass
class PathEvidence:
    """The evidence one network path gave (see the module docstring)."""

    largest_ok: int = 0
    refused: dict[Signature, int] = field(default_factory=dict)
    """Per signature, the smallest body refused with it once a limit is confirmed."""
    suspects: dict[Signature, int] = field(default_factory=dict)
    """Per signature, the smallest body refused once, not yet confirmed."""

    @property
    def smallest_rejected(self) -> int | None:
        """The smallest body a confirmed limit refused (None: no limit known)."""
        return min(self.refused.values(), default=None)

    @smallest_rejected.setter
    def smallest_rejected(self, value: int | None) -> None:
        # A value from a file or a test says only "this size was refused": a 413.
        self.refused.clear()
        self.suspects.clear()
        if value is not None:
            self.refused[Signature.SIZE] = value

    def suspect(self, signature: Signature) -> int | None:
        return self.suspects.get(signature)

    def passed(self, size: int) -> int | None:
        """A ``size``-byte body went through. Returns the smallest refused size of a limit
        it contradicts (withdrawn), if any."""
        self.largest_ok = max(self.largest_ok, size)
        withdrawn = None
        for table, confirmed in ((self.refused, True), (self.suspects, False)):
            for signature, refused in list(table.items()):
                if size >= refused:
                    del table[signature]
                    if confirmed:
                        withdrawn = refused if withdrawn is None else min(withdrawn, refused)
        return withdrawn

    def observe(self, signature: Signature | None, size: int | None) -> Observation:
        """Record that a ``size``-byte body was refused with ``signature``; the finding."""
        if signature is None or size is None or size <= 0:
            return Observation(Finding.NONE, signature, size or 0)
        if size <= self.largest_ok:
            if signature is Signature.SIZE:
                # A 413 names a size: the limit came down since a bigger body passed (the
                # cap it implies is just below it).
                self.refused[signature] = min(self.refused.get(signature, size), size)
                return Observation(Finding.LIMIT, signature, size)
            withdrawn = self.refused.pop(signature, None)
            self.suspects.pop(signature, None)
            return Observation(Finding.NOT_SIZE, signature, size, withdrawn=withdrawn)
        if signature is Signature.SIZE or signature in self.refused:
            self.refused[signature] = min(self.refused.get(signature, size), size)
            return Observation(Finding.LIMIT, signature, size)
        first = self.suspects.pop(signature, None)
        if first is not None:
            self.refused[signature] = min(first, size)
            return Observation(Finding.LIMIT, signature, min(first, size))
        self.suspects[signature] = size
        return Observation(Finding.SUSPECT, signature, size)

    def adopt(self, signature: Signature) -> int | None:
        """Hold the path to the limit a suspect implies while one request is fitted under
        it (so the fit aims where a confirmed limit would). Returns the suspect's size."""
        suspect = self.suspects.pop(signature, None)
        if suspect is not None:
            self.refused[signature] = min(self.refused.get(signature, suspect), suspect)
        return suspect

    def withdraw(self, signature: Signature) -> None:
        """Forget the limit and the suspect of ``signature`` (its refusals were not about
        size)."""
        self.refused.pop(signature, None)
        self.suspects.pop(signature, None)

    def unadopt(self, signature: Signature, size: int) -> None:
        """The request fitted under an adopted suspect ended with no evidence either way
        (nothing smaller could be sent): the limit is a suspect again."""
        if self.refused.get(signature) == size:
            del self.refused[signature]
            self.suspects[signature] = size

    def forget(self) -> None:
        """Forget every limit and suspect (the proxy's limit was raised); keep what passed."""
        self.refused.clear()
        self.suspects.clear()


@dataclass
class Caps:
    """The payload cap of one session: configured, learned between ok/rejected, or assumed.

    The learned cap lies between the largest body that succeeded and the smallest that
    was rejected on the session's network path (``path``, the evidence sessions on the
    same path share): ``max(largest_ok, learned_cap_fraction × smallest_rejected)``, kept
    strictly below ``smallest_rejected``. A rejection below a configured cap proves the
    configured value too high, so the learned cap then wins (source "learned").
    """

    configured: int | None = None
    assumed: int | None = None
    learned_fraction: float = 0.75
    path: PathEvidence = field(default_factory=PathEvidence)

    @classmethod
    def from_settings(cls, settings: Settings, path: PathEvidence | None = None) -> Caps:
        return cls(configured=settings.max_payload,
                   learned_fraction=settings.learned_cap_fraction,
                   path=path if path is not None else PathEvidence())

    @property
    def largest_ok(self) -> int:
        return self.path.largest_ok

    @largest_ok.setter
    def largest_ok(self, value: int) -> None:
        self.path.largest_ok = value

    @property
    def smallest_rejected(self) -> int | None:
        return self.path.smallest_rejected

    @smallest_rejected.setter
    def smallest_rejected(self, value: int | None) -> None:
        self.path.smallest_rejected = value

    @property
    def learned(self) -> int | None:
        """The cap learned from a rejection, or None when nothing was rejected."""
        rejected = self.smallest_rejected
        return None if rejected is None else self.below(rejected)

    def below(self, refused: int) -> int:
        """The cap a refusal of ``refused`` bytes implies: a ``learned_fraction`` of it, but
        never below the largest body that passed, and always below ``refused``."""
        value = max(self.largest_ok, int(refused * self.learned_fraction))
        return max(0, min(value, refused - 1))

    def _pick(self) -> tuple[int | None, CapSource | None]:
        """The cap in force and where it comes from: a learned cap below the configured
        one wins (the configured value was proved too high), then configured, then assumed."""
        learned = self.learned
        if learned is not None and (self.configured is None or learned < self.configured):
            return learned, "learned"
        if self.configured is not None:
            return self.configured, "configured"
        if self.assumed is not None:
            return self.assumed, "assumed"
        return None, None

    def effective(self) -> int | None:
        return self._pick()[0]

    @property
    def source(self) -> CapSource | None:
        return self._pick()[1]

    def record_success(self, body_bytes: int) -> int | None:
        """A body of this size went through; returns the refused size of a limit it
        contradicts (then withdrawn: it was not about size), if any."""
        return self.path.passed(body_bytes)

    def record_rejection(self, body_bytes: int | None) -> int | None:
        """A 413 of this size (a refusal that names a size); return the cap learned."""
        self.path.observe(Signature.SIZE, body_bytes)
        return self.learned

    def observe(self, signature: Signature | None, body_bytes: int | None) -> Observation:
        """A refusal with ``signature`` of a ``body_bytes`` body: what it shows (recorded)."""
        return self.path.observe(signature, body_bytes)
