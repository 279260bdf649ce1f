"""No secret on disk: planted secrets through every channel a session stores or shows.

Channels: user text, model output, tool-call arguments, tool results, the system prompt,
a 401 body that echoes the session's own (non-standard) key, and ``%chat export``. The
real SDKs talk to the emulator over HTTP; the files are read back as bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from secrets_planted import PLANTED
from test_magics import cell, chat, ip  # noqa: F401  (fixtures)

from ipy_ctxrecovery import ChatError, ChatSession, Settings
from ipy_ctxrecovery.core.events import Event
from ipy_ctxrecovery.core.history import Role
from ipy_ctxrecovery.core.wording import describe
from ipy_ctxrecovery.notebook.magics import ChatMagics
from ipy_ctxrecovery.redaction import MASK


def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: what to return.
    """
    return text


def files_text(directory: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace")
                     for p in sorted(directory.rglob("*")) if p.is_file())


def found(secrets: list[str], text: str) -> list[str]:
    return [s for s in secrets if s in text]


@pytest.mark.parametrize("wire", ["emulator", "emulator:anthropic"])
def test_planted_secrets_never_reach_the_session_files(emulator: Any, wire: str) -> None:
    emu = emulator(context_window=200_000)
    secrets = [secret for _, secret in PLANTED.values()]
    system = "Deployment notes:\n" + "\n".join(text for text, _ in PLANTED.values())
    session = ChatSession(wire, emulator=emu, settings=Settings(), system=system,
                          tools=[echo], name=f"planted-{wire.replace(':', '-')}")
    for kind, (text, _) in PLANTED.items():
        # The text first, so the emulator's reply quotes it (model output); then a tool
        # call whose arguments carry it, and whose result returns it.
        call = json.dumps({"text": f"{kind}: {text}"})
        session.send(f"{text} [[tool echo {call}]]")
    session.close()

    # What was sent, and what is kept in memory, is verbatim: every channel carried them.
    sent = "".join(r.raw.decode() for r in emu.requests if r.raw)
    assert found(secrets, sent) == secrets
    transcript = session.transcript
    by_role = {role: "".join(json.dumps(m.to_dict()) for m in transcript if m.role is role)
               for role in Role}
    assert found(secrets, by_role[Role.SYSTEM]) == secrets
    assert found(secrets, by_role[Role.USER]) == secrets
    calls = "".join(c.arguments for m in transcript for c in m.tool_calls)
    assert found(secrets, calls) == secrets
    answers = "".join(m.text for m in transcript if m.role is Role.ASSISTANT)
    assert PLANTED["sk-proj"][1] in answers  # the model quoted one back

    # Nothing of them in any file: transcript.jsonl, history.json, session.json, results/.
    on_disk = files_text(session.directory)
    assert found(secrets, on_disk) == []
    assert on_disk.count(MASK) >= 4 * len(PLANTED)
    # The files are still what resume reads: same messages, masked.
    resumed = ChatSession.resume(session.name, emulator=emu, settings=Settings())
    assert len(resumed.transcript) == len(transcript)
    assert all(json.loads(c.arguments) for m in resumed.history for c in m.tool_calls)
    resumed.close()


def test_the_opt_out_keeps_conversation_text_verbatim(emulator: Any) -> None:
    emu = emulator()
    text, secret = PLANTED["ghp"]
    session = ChatSession("emulator", emulator=emu, settings=Settings(redact_stored=False),
                          name="verbatim")
    session.send(f"keep {text}")
    session.close()
    assert secret in files_text(session.directory)


def test_a_401_echoing_the_sessions_own_key_is_masked_everywhere(emulator: Any) -> None:
    emu = emulator()
    key = "gw-team42-0f9e8d7c6b5a"                  # a gateway key: no known format
    header_key = "az-9b8a7c6d5e4f3a2b1c0d"          # an Azure-style api-key header
    emu.fail_next(401, message=f"invalid api key {key} (api-key {header_key})", times=2)
    client = emu.openai_client(api_key=key, max_retries=0,
                               default_headers={"api-key": header_key})
    events: list[Event] = []
    session = ChatSession("openai:emulator", client=client, settings=Settings(),
                          name="gateway-401")
    session.subscribe(events.append)
    with pytest.raises(ChatError) as info:
        session.send("hello")
    shown = [str(info.value), info.value.failure.reason, *(describe(e) for e in events)]
    assert any(MASK in line for line in shown)
    for line in shown:
        assert key not in line and header_key not in line
    session.close()
    on_disk = files_text(session.directory)
    assert key not in on_disk and header_key not in on_disk


def test_export_masks_the_planted_secrets(chat: ChatMagics, ip: Any,  # noqa: F811
                                          tmp_path: Path) -> None:
    secrets = [secret for _, secret in PLANTED.values()]
    cell(ip, "", "\n".join(text for text, _ in PLANTED.values()))
    for name in ("chat.json", "chat.md"):
        ip.run_line_magic("chat", f"export {tmp_path / name}")
        exported = (tmp_path / name).read_text()
        assert found(secrets, exported) == [] and MASK in exported
    json.loads((tmp_path / "chat.json").read_text())  # still valid JSON
    # Opted out: the conversation is exported verbatim.
    ip.run_line_magic("chat", "config redact_stored=False")
    ip.run_line_magic("chat", f"export {tmp_path / 'verbatim.md'}")
    assert found(secrets, (tmp_path / "verbatim.md").read_text()) == secrets


@pytest.mark.parametrize("line", ["", "--no-stream"])
def test_an_answer_that_repeats_secrets_is_shown_masked(
        chat: ChatMagics, ip: Any,  # noqa: F811
        capsys: pytest.CaptureFixture[str], line: str) -> None:
    # The emulator's answer quotes the start of the message: each secret comes back as
    # model output, printed as it streams (split across deltas) or shown at the end, and
    # returned as _.
    said: list[str] = []
    for text, secret in PLANTED.values():
        result = cell(ip, line, text)
        shown = capsys.readouterr().out
        answer = str(result.result if result.result is not None else ip.user_ns["_"])
        kept = chat.workspace.session().history[-1].text
        if secret in kept:           # what the model said is kept as it said it
            said.append(secret)
            assert secret not in shown and secret not in answer
            assert MASK in shown and MASK in answer
    assert len(said) >= len(PLANTED) // 2
