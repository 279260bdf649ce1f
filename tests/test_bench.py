"""Smoke test for bench/: each benchmark runs with tiny parameters and prints its figures.

Benchmarks print ratios, never verdicts, so nothing here looks at a timing: only that each
script completes in a fresh interpreter and prints one figure line per case.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, timeout=120, cwd=BENCH.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_recovery_vs_blind_prints_a_ratio_line_per_mode() -> None:
    out = run("recovery_vs_blind.py", "--turns", "6", "--scale", "0.2")
    for key in ("window", "413", "waf", "drop", "combo"):
        assert f"ratio {key} ours/baseline: answered " in out, out
        assert f"== {key}:" in out
    assert out.count("turns answered") == 5


def test_recovery_vs_blind_rejects_an_unknown_mode() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "recovery_vs_blind.py"), "--modes",
                           "nope"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown mode" in done.stderr


def test_overhead_prints_session_over_bare_ratios_for_both_wires() -> None:
    out = run("overhead.py", "--quick", "--repeat", "1")
    for wire in ("openai", "anthropic"):
        for case in ("100KB", "1MB", "2000msgs"):
            assert f"ratio session/bare {wire} {case}: " in out, out
        assert f"ratio session/floor {wire} 1MB: " in out
        assert f"ratio memory {wire} 1MB: session peak/bare peak " in out
    # The fast path: after the shape's probe, the SDK's request pipeline never runs.
    assert out.count("the SDK's request pipeline ran 2 times in 2 session turns") == 6, out


def test_overhead_rejects_an_unknown_case() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "overhead.py"), "--cases", "9GB"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown case" in done.stderr


def test_trim_prints_our_fit_against_trim_messages() -> None:
    pytest.importorskip("langchain_core")
    out = run("trim.py", "--quick", "--repeat", "1")
    assert out.count("ratio trim ") == 2, out
    ours = [line for line in out.splitlines() if line.strip().startswith("ours")]
    assert len(ours) == 4
    for line in ours:              # our fits are valid and under the target, always
        assert "pairs ok, starts on user yes, latest request kept" in line, line
        assert "≤ target" in line, line


def test_microcompact_savings_prints_the_ratio_and_ours_summarizes() -> None:
    out = run("microcompact_savings.py", "--turns", "8")
    assert "ratio microcompact ours/chatcli: bytes freed " in out, out
    ours = next(line for line in out.splitlines() if line.strip().startswith("ours:"))
    chatcli = next(line for line in out.splitlines() if line.strip().startswith("chatcli:"))
    # ANCHORS weakness 9: ChatCLI's one-line summary never fires; ours must.
    assert " 0 results summarized" in chatcli
    assert " 0 results summarized" not in ours


def test_redaction_prints_the_ratio_to_detect_secrets_scanner() -> None:
    out = run("redaction.py", "--lines", "2000", "--sample", "20")
    assert "ratio redaction scan_line/ours: " in out, out
    assert "2 planted secrets, 2 masked" in out


def test_persistence_prints_bytes_per_turn_before_and_after() -> None:
    out = run("persistence.py", "--turns", "12", "--turn-kb", "2")
    assert "== before: written " in out and "== journal: written " in out, out
    assert "ratio persistence before/journal: total bytes " in out


def test_what_if_prints_a_time_per_history_size() -> None:
    out = run("what_if.py", "--sizes", "20,60", "--repeat", "1", "--result-chars", "2000")
    for n in (20, 60):
        assert f"ratio what_if n={n}: warm/100ms " in out, out
    assert "summarized" in out        # the compact case really compacts


def test_middleboxes_prints_ours_against_the_bare_sdk_behind_nginx() -> None:
    from middleboxes import missing
    from needs import unavailable

    reason = missing("nginx-413")
    if reason is not None:
        unavailable(reason)
    out = run("middleboxes.py", "--kinds", "nginx-413", "--wires", "openai", "--turns", "12")
    assert "ratio nginx-413 openai ours/bare: answered " in out, out
    assert out.count("answered ") == 3, out   # ours, bare, and the ratio line


def test_middleboxes_rejects_an_unknown_kind() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "middleboxes.py"), "--kinds", "iis"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown kind" in done.stderr


def test_panel_prints_the_first_and_second_panel_in_a_fresh_kernel() -> None:
    pytest.importorskip("jupyter_client")
    pytest.importorskip("ipykernel")
    out = run("panel.py", "--repeat", "1")
    assert "first %chat panel " in out and "second %chat panel " in out, out
    assert "import openai alone (floor)" in out
    assert "ratio panel first/2s: " in out
    # The emulator speaks the OpenAI wire: the first panel imports that SDK, not Anthropic's.
    imported = next(line for line in out.splitlines() if "imported by the first panel" in line)
    assert "openai" in imported and "anthropic" not in imported, imported


def test_bounds_prints_a_figure_per_case() -> None:
    out = run("bounds.py", "--quick")
    assert out.count("figure 8 MB answer") == 2, out
    assert "secret-like answer, turn_timeout=3: " in out
    assert out.count("timed-out turns, trickle-") == 2
    assert "figure read_file 3 lines of a 1 GB file: " in out


def test_fidelity_prints_each_compaction_on_both_wires() -> None:
    out = run("fidelity.py", "--turns", "12", "--compactions", "1")
    for wire in ("openai", "anthropic"):
        assert f"## {wire} wire: " in out, out
    assert out.count("compaction 1 (after turn ") == 2, out
    assert out.count("  end (turn 11, ") == 2, out
    for figure in ("read by a summarizer ", "rules kept verbatim ", "facts in history ",
                   "facts recallable ", "summary requests "):
        assert out.count(figure) == 4, out         # compaction 1 and the end, both wires


def test_cost_prints_the_three_clients_and_the_goal_ratios_for_both_wires() -> None:
    out = run("cost.py", "--turns", "4", "--window", "50000")
    for wire in ("openai", "anthropic"):
        for kind in ("tools", "plain"):
            assert f"== {wire} {kind}: 4 turns" in out, out
            assert f"ratio {wire} {kind} batched/today: " in out
            assert f"ratio {wire} {kind} batched/append-only: " in out
    assert out.count("weighted input tokens of") == 12
    assert "ratio openai tools cached share batched/append-only: " in out
    assert "ratio anthropic tools input read from cache: " in out


def test_latency_prints_both_clients_and_their_ratio() -> None:
    out = run("latency.py", "--turns", "24", "--latency", "0.05", "--think", "0.3")
    for name in ("today", "background"):
        assert f"== {name}: compacting " in out, out
        assert f"ratio {name} slowest compacting / median plain: " in out, out
    assert "swapped in" in out, out


def test_user_words_prints_the_rules_kept_with_and_without_pins() -> None:
    out = run("user_words.py", "--turns", "12", "--cap", "16384")
    for label in ("pinned", "unpinned"):
        assert re.search(rf"^{label}: \d+/12 turns answered, \d+ compactions?, rules verbatim "
                         r"in the last request \d/4$", out, re.M), out


def test_joins_prints_the_fidelity_of_each_join_before_and_after() -> None:
    out = run("joins.py", "--quick")
    assert out.count("    before (rules 1–4): recovered ") == 6, out
    after = [line for line in out.splitlines() if line.startswith("    after  (rules 1–7)")]
    assert len(after) == 6
    for line in after:     # the emulator's small-model continuations all join exactly
        assert "extra 0, meta/prompt text 0, exact yes" in line, line


def test_server_compaction_prints_on_and_off_for_both_wires() -> None:
    out = run("server_compaction.py", "--quick")
    blocks = re.findall(r"^== (\w+) server_compaction=(on|off)\n((?:  .*\n)+)", out, re.M)
    found = {(wire, setting): body for wire, setting, body in blocks}
    assert set(found) == {(w, s) for w in ("anthropic", "responses") for s in ("on", "off")}, out

    def figure(body: str, name: str) -> int:
        match = re.search(rf"^  {name} +([\d,]+)", body, re.M)
        assert match, (name, body)
        return int(match.group(1).replace(",", ""))

    for (_wire, setting), body in found.items():
        assert re.search(r"^  turns answered +20/20 ", body, re.M), body
        assert figure(body, "rejections \\(non-200\\)") <= 1, body
        assert figure(body, "bytes uploaded") > 0
        summaries = figure(body, "client summaries")
        if setting == "on":
            # The server compacted behind the cap, and the package summarized nothing.
            assert figure(body, "server compactions") > 0, body
            assert summaries == 0, body
        else:
            assert figure(body, "server compactions") == 0, body
            trims = re.search(r"client summaries +\d+ \(\d+ summary requests, (\d+) trims\)",
                              body)
            assert trims and summaries + int(trims.group(1)) >= 1, body
    for wire in ("anthropic", "responses"):
        assert re.search(rf"^ratio bytes on/off {wire}: \d+\.\d\d$", out, re.M), out
        assert f"ratio requests on/off {wire}: " in out


def test_server_compaction_rejects_an_unknown_wire() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "server_compaction.py"), "--wires",
                           "chat"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown wire" in done.stderr


def test_retention_prints_each_setting_and_long_pays_for_a_notebooks_pauses() -> None:
    out = run("retention.py", "--turns", "14")
    for wire in ("anthropic", "openai"):
        choices = ("today", "short", "long", "auto")
        assert f"== {wire} (input priced as " in out, out
        for choice in choices:
            assert re.search(rf"^  {choice} +[\d,]+ weighted input tokens of", out, re.M), out
        # The pauses past five minutes lose the short cache and not the long one.
        ratio = re.search(rf"^ratio {wire} long/short: (\d+\.\d\d)$", out, re.M)
        assert ratio and float(ratio.group(1)) < 1.0, out
    assert re.search(r"^ratio anthropic auto/short: \d+\.\d\d$", out, re.M), out
    # Before issue 28 the Anthropic wire set no breakpoint: any setting reads from cache.
    today = re.search(r"^ratio anthropic auto/today: (\d+\.\d\d)$", out, re.M)
    assert today and float(today.group(1)) < 1.0, out


def test_retention_rejects_an_unknown_wire() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "retention.py"), "--wires", "chat"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown wire" in done.stderr
