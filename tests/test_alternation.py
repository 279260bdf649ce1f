"""Strict role alternation: the emulator rejects like vLLM / llama.cpp serving a strict chat
template, and a compacted conversation on the OpenAI wire (summary, notice and request
as consecutive user messages in the history) goes out merged and is accepted."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from ipy_ctxrecovery import ChatSession, Settings
from ipy_ctxrecovery.core.history import (
    TAG_COMPACTION_NOTICE,
    TAG_PAYLOAD_NOTICE,
    TAG_SUMMARY,
    Message,
    Role,
)
from ipy_ctxrecovery.core.markers import MERGED_TEXT_JOIN
from ipy_ctxrecovery.core.prompts import PAYLOAD_NOTICE
from ipy_ctxrecovery.emulator import roles
from ipy_ctxrecovery.providers import make_provider
from ipy_ctxrecovery.providers.base import Request


def filler(i: int, chars: int) -> str:
    words = " ".join(f"item{i}-{k}" for k in range(chars // 9))
    return f"Turn {i}: please keep note of these values: {words}"[:chars]


# -- the emulator's strict mode, through the SDKs ------------------------------------------------

SYSTEM = {"role": "system", "content": "Be terse."}
USER = {"role": "user", "content": "hello"}
ASSISTANT = {"role": "assistant", "content": "hi"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "42"}

ACCEPTED = [
    [USER],
    [SYSTEM, USER],
    [SYSTEM, USER, ASSISTANT, USER],
    [USER, CALL, RESULT, ASSISTANT, USER],           # tool calls and results are left out
    [SYSTEM, USER, CALL, RESULT, CALL, RESULT],
    [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "[summary]"},
                                          {"type": "text", "text": "hello"}]}],
]
REJECTED = [
    [USER, USER],
    [SYSTEM, USER, USER],
    [ASSISTANT, USER],
    [SYSTEM, SYSTEM, USER],
    [USER, ASSISTANT, ASSISTANT, USER],
    [USER, ASSISTANT, SYSTEM],                       # a system message at a user's place
]


@pytest.mark.parametrize("messages", ACCEPTED)
def test_alternating_requests_are_accepted(emulator: Any, messages: list[dict[str, Any]]) -> None:
    emu = emulator(alternation="vllm")
    client = emu.openai_client(max_retries=0)
    got = client.chat.completions.create(model="emulator", messages=messages)
    assert got.choices[0].message.content
    assert emu.requests[-1].fault is None
    client.close()


@pytest.mark.parametrize("messages", REJECTED)
def test_vllm_style_rejection(emulator: Any, messages: list[dict[str, Any]]) -> None:
    emu = emulator(alternation="vllm")
    client = emu.openai_client(max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="emulator", messages=messages)
    assert caught.value.status_code == 400
    assert caught.value.body == {"message": roles.MESSAGE, "type": "BadRequestError",
                                 "param": None, "code": 400}
    assert emu.requests[-1].fault == "alternation"
    client.close()


def test_llama_cpp_style_rejection_is_a_500_with_the_jinja_trace(emulator: Any) -> None:
    emu = emulator(alternation="llama.cpp")
    client = emu.openai_client(max_retries=0)
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="emulator", messages=[USER, USER])
    assert caught.value.status_code == 500
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "server_error" and body["code"] == 500
    assert body["message"].endswith("Error: Jinja Exception: " + roles.MESSAGE)
    assert "raise_exception" in body["message"]
    client.close()


def test_strict_mode_is_off_by_default_and_only_on_the_openai_path(emulator: Any) -> None:
    emu = emulator()
    client = emu.openai_client(max_retries=0)
    assert client.chat.completions.create(model="emulator", messages=[USER, USER]).choices
    emu.configure(alternation="llama.cpp")
    a_client = emu.anthropic_client(max_retries=0)
    got = a_client.messages.create(model="emulator", max_tokens=50, messages=[
        {"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
    assert got.content
    with pytest.raises(Exception, match="alternation='strict' is not known"):
        emu.configure(alternation="strict")
    client.close()
    a_client.close()


# -- the OpenAI adapter merges same-role runs ----------------------------------------------------

def test_the_openai_wire_merges_summary_notice_and_request_and_keeps_the_history(emulator: Any) -> None:
    emu = emulator()
    provider = make_provider("emulator", emulator=emu)
    history = (Message.system("Be terse."),
               Message.user("[STRUCTURED SUMMARY — covering 4 earlier messages]\n- a", tag=TAG_SUMMARY),
               Message.user("[Context was automatically compacted …]", tag=TAG_COMPACTION_NOTICE),
               Message.user(PAYLOAD_NOTICE, tag=TAG_PAYLOAD_NOTICE),
               Message.user("what next?"))
    request = Request(history)
    body = json.loads(provider.encode(request))
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    # One string, as every server takes it: each text whole, a blank line and a dash
    # between them (no text starts a line, which a firewall reads as a command).
    assert body["messages"][1]["content"] == MERGED_TEXT_JOIN.join(m.text for m in history[1:])
    assert provider.measure(request) == len(provider.encode(request))
    reply = provider.send(request)
    assert reply.message.text.startswith('Emulator reply: you said "what next?"')
    # Nothing of this changes the history: four user messages, tags and all.
    assert [m.tag for m in history if m.role is Role.USER] == [
        TAG_SUMMARY, TAG_COMPACTION_NOTICE, TAG_PAYLOAD_NOTICE, None]
    provider.close()


# -- a compacted conversation against a strict template ---------------------------------------------

@pytest.mark.parametrize("style", roles.STYLES)
def test_a_compacted_conversation_is_accepted_by_a_strict_chat_template(emulator: Any,
                                                                       style: str) -> None:
    emu = emulator(context_window=2048, alternation=style)
    # No SDK retries: a llama.cpp rejection is a 500, which the SDK would otherwise retry.
    provider = make_provider("emulator", emulator=emu, max_retries=0)
    session = ChatSession(provider=provider, system="You are terse.",
                          name=f"strict-{roles.STYLES.index(style)}")
    texts = [filler(i, 700) for i in range(12)]
    for text in texts:
        reply = session.send(text)
        assert f'you said "{text[:60]}"' in reply.text
    assert session.status().compactions >= 1
    assert [r.fault for r in emu.requests if r.status != 200] == []
    # The summary and the request went out as one user message, its content one string.
    merged = [r for r in emu.requests
              if any(m["role"] == "user" and isinstance(m["content"], str)
                     and m["content"].startswith("[STRUCTURED SUMMARY")
                     and "\n\n" in m["content"] for m in r.body["messages"])]
    assert merged and all(roles.alternates(r.body["messages"]) for r in emu.requests)
    assert all(isinstance(m["content"], str) for r in emu.requests for m in r.body["messages"]
               if m["role"] != "assistant")
    # The working history still holds the summary as its own tagged message.
    assert any(m.tag == TAG_SUMMARY for m in session.history)
    session.close()


def test_a_payload_limit_notice_is_accepted_by_a_strict_chat_template(emulator: Any) -> None:
    limit = 24 * 1024
    emu = emulator(context_window=200_000, max_body=limit, alternation="vllm")
    session = ChatSession("emulator", emulator=emu, settings=Settings(), name="strict-413")
    for i in range(14):
        session.send(filler(i, 3000))
    statuses = [(r.status, r.fault) for r in emu.requests if r.status != 200]
    assert statuses == [(413, "413:nginx")]
    notice_sent = [r for r in emu.requests if r.status == 200
                   and PAYLOAD_NOTICE in json.dumps(r.body, ensure_ascii=False).replace("\\n", "\n")]
    assert notice_sent
    for record in notice_sent:
        users = [m for m in record.body["messages"] if m["role"] == "user"]
        # Notice and request, one message whose content is one string.
        assert isinstance(users[0]["content"], str) and PAYLOAD_NOTICE + "\n\n" in users[0]["content"]
    session.close()
