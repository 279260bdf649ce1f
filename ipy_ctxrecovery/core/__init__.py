"""The recovery core: pure Python with no IPython, no SDK and no session state.

Histories and messages (:mod:`.history`), failure classification (:mod:`.classify`), the
model catalogue, pre-flight (:mod:`.preflight`), the tool-result budget, microcompact, the
compactor, the recovery ladder (:mod:`.ladder`), continuation past ``max_tokens``
(:mod:`.continuation`), typed events and their wording (:mod:`.events`, :mod:`.wording`),
the texts written for the model (:mod:`.prompts`). Each step maps a history to a new one;
none edits what it was given. The core imports nothing of the package but the root
modules (``errors``, ``failures``, ``settings``, ``redaction``, ``_files``).
"""
