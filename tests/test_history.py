"""history: OpenAI dict round trip, ages in round trips, problems(), latest_user_index."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from strategies import histories, valid_histories

from ipy_ctxrecovery.core import history as h
from ipy_ctxrecovery.core.history import Message, Reasoning, Role, Text, ToolCall, ToolResult

PROPS = settings(max_examples=300, deadline=None)
GENERATOR_CHECK = settings(max_examples=100, deadline=None)    # checks the strategies only


def _openai_view(m: Message) -> Message:
    """What survives the OpenAI format: no reasoning, no error flag, no tag, no meta."""
    blocks = tuple(
        ToolResult(b.call_id, b.content, False, b.name) if isinstance(b, ToolResult) else b
        for b in m.blocks if not isinstance(b, Reasoning)
    )
    return Message(m.role, blocks)


# -- OpenAI dicts ---------------------------------------------------------------------------

def test_to_openai_shapes() -> None:
    hist = (
        Message.system("sys ✓"),
        Message.user("hi 👋"),
        Message.assistant("let me look", [ToolCall("call_0", "read_file", '{"path": "a"}')],
                          reasoning="thinking"),
        Message.tool("call_0", "content", name="read_file"),
        Message.assistant(reasoning="only thoughts"),
    )
    assert h.to_openai(hist) == [
        {"role": "system", "content": "sys ✓"},
        {"role": "user", "content": "hi 👋"},
        {"role": "assistant", "content": "let me look",
         "tool_calls": [{"id": "call_0", "type": "function",
                         "function": {"name": "read_file", "arguments": '{"path": "a"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "content"},
        {"role": "assistant", "content": ""},
    ]
    json.dumps(h.to_openai(hist))


def test_assistant_with_only_tool_calls_has_null_content() -> None:
    d = h.to_openai([Message.assistant("", [ToolCall("c", "f")])])[0]
    assert d["content"] is None and d["tool_calls"][0]["function"]["arguments"] == "{}"


def test_from_openai_accepts_sdk_variants() -> None:
    hist = h.from_openai([
        {"role": "developer", "content": "dev prompt"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "reasoning_content": "hmm",
         "tool_calls": [{"id": "x1", "type": "function",
                         "function": {"name": "grep", "arguments": {"q": "é"}}}]},
        {"role": "tool", "tool_call_id": "x1", "content": "found"},
    ])
    assert hist[0] == Message.system("dev prompt")
    assert hist[1] == Message.user("ab")
    assert hist[2].blocks == (Reasoning("hmm"), ToolCall("x1", "grep", json.dumps({"q": "é"})))
    assert hist[3] == Message.tool("x1", "found", name="grep")
    assert h.problems(hist) == []


@PROPS
@given(valid_histories())
def test_openai_round_trip(hist: h.History) -> None:
    back = h.from_openai(h.to_openai(hist))
    assert back == tuple(_openai_view(m) for m in hist)
    assert h.to_openai(back) == h.to_openai(hist)
    assert h.problems(back) == []


@PROPS
@given(histories(None, user_first=None))
def test_own_dict_round_trip_keeps_everything(hist: h.History) -> None:
    back = tuple(Message.from_dict(json.loads(json.dumps(m.to_dict()))) for m in hist)
    assert back == hist
    assert [dict(m.meta) for m in back] == [dict(m.meta) for m in hist]


# -- ages -----------------------------------------------------------------------------------

def test_ages_count_round_trips_not_user_turns() -> None:
    hist = (
        Message.system("s"),                                        # 3
        Message.user("one request"),                                # 3
        Message.assistant("", [ToolCall("call_0", "f")]),           # 2 (itself not counted)
        Message.tool("call_0", "r1"),                               # 2
        Message.assistant("", [ToolCall("call_0", "f")]),           # 1
        Message.tool("call_0", "r2"),                               # 1
        Message.assistant("done"),                                  # 0
        Message.user("next"),                                       # 0
    )
    assert h.ages(hist) == [3, 3, 2, 2, 1, 1, 0, 0]
    assert h.ages(()) == []


# -- problems -------------------------------------------------------------------------------

@pytest.mark.parametrize(("hist", "expected"), [
    ((), []),
    ((Message.system("s"),), []),
    ((Message.system("s"), Message.assistant("hi")),
     ["first non-system message is assistant, not user"]),
    ((Message.user("u"), Message.tool("c", "x")),
     ["message 1: tool result without a preceding tool call"]),
    ((Message.user("u"), Message.assistant("", [ToolCall("a", "f"), ToolCall("b", "f")]),
      Message.tool("a", "x")),
     ["message 1: tool calls ['a', 'b'] answered by ['a']"]),
    ((Message.user("u"), Message.assistant("", [ToolCall("a", "f")]),
      Message.tool("a", "x"), Message.tool("a", "y")),
     ["message 1: tool calls ['a'] answered by ['a', 'a']"]),
    ((Message.user("u"), Message.assistant("", [ToolCall("a", "f")]), Message.user("oops"),
      Message.tool("a", "x")),
     ["message 1: tool calls ['a'] answered by []",
      "message 3: tool result without a preceding tool call"]),
    ((Message.user("u"), Message.assistant("", [ToolCall("a", "f"), ToolCall("b", "f")]),
      Message.tool("b", "y"), Message.tool("a", "x")), []),           # any order is fine
])
def test_problems(hist: h.History, expected: list[str]) -> None:
    assert h.problems(hist) == expected


@GENERATOR_CHECK
@given(valid_histories())
def test_generated_valid_histories_have_no_problems(hist: h.History) -> None:
    assert h.problems(hist) == []
    first = next(m for m in hist if m.role is not Role.SYSTEM)
    assert first.role is Role.USER
    assert h.latest_user_index(hist) == len(hist) - 1


@GENERATOR_CHECK
@given(histories(False))
def test_generated_broken_histories_have_pairing_problems(hist: h.History) -> None:
    assert any("first non-system" not in p for p in h.problems(hist))


# -- latest_user_index, sizes ----------------------------------------------------------------

def test_latest_user_index_skips_package_messages() -> None:
    hist = (Message.user("real"), Message.assistant("a"),
            Message.user("[SYSTEM NOTICE — PAYLOAD LIMIT HIT] …", tag=h.TAG_PAYLOAD_NOTICE),
            Message.user("[summary]", tag=h.TAG_SUMMARY))
    assert h.latest_user_index(hist) == 0
    cont = (Message.user("cut off", tag=h.TAG_CONTINUATION),)
    assert h.latest_user_index(cont) == 0                            # fallback: continuation
    assert h.latest_user_index((*hist, *cont)) == 0
    assert h.latest_user_index((Message.system("s"), Message.assistant("x"))) is None


def test_char_size_and_text_views() -> None:
    m = Message(Role.ASSISTANT, (Reasoning("abc"), Text("日本"), ToolCall("id", "fn", "{}")))
    assert m.char_size() == 3 + 2 + (2 + 2 + 2)
    assert m.text == "日本" and m.tool_calls == (ToolCall("id", "fn", "{}"),)
    t = Message.tool("id", "xyz", is_error=True)
    assert t.text == "xyz" and t.tool_result == ToolResult("id", "xyz", True)
    assert h.char_size([m, t]) == m.char_size() + 3 + 2


# -- Text keeps long non-ASCII text as UTF-8 ----------------------------------------------------

def test_a_long_text_with_one_wide_character_is_kept_at_about_its_utf8_size() -> None:
    import sys

    for wide in ("—", "😀"):                        # two and four bytes a character as a str
        text = ("a line of ordinary English text " * 200) + wide
        block = Text(text)
        assert block.packed and block.text == text and block.chars == len(text)
        kept = sys.getsizeof(block._kept)
        assert kept < 1.1 * len(text.encode()) and 2 * kept < sys.getsizeof(text) + 200


@pytest.mark.parametrize("text", ["short — text", "ascii " * 1000, "漢字" * 2000,
                                  "é" * 5000])
def test_text_that_packing_would_not_shrink_is_kept_as_it_is(text: str) -> None:
    block = Text(text)
    assert not block.packed and block.text is text


def test_packed_and_unpacked_texts_behave_alike() -> None:
    import copy
    import pickle

    long = "— a dash, then a lone surrogate \ud800 " * 200
    for text in (long, "hi"):
        block = Text(text)
        assert block == Text(text) and hash(block) == hash(Text(text))
        assert copy.deepcopy(block) == block and pickle.loads(pickle.dumps(block)) == block
        assert repr(block) == f"Text({text!r})"
        match block:
            case Text(text=found):
                assert found == text
        message = Message.user(text)
        assert Message.from_dict(message.to_dict()) == message
        assert message.text == text and message.char_size() == len(text)
    assert Text(long) != Text(long + "x")


def test_a_server_compaction_round_trips_and_may_open_the_conversation() -> None:
    from ipy_ctxrecovery.core.history import (
        TAG_SERVER_COMPACTION,
        Compaction,
        is_server_compaction,
    )

    block = Compaction("anthropic", '{"type":"compaction","content":"s","encrypted_content":"e"}',
                       "s")
    held = Message(Role.ASSISTANT, (block,), tag=TAG_SERVER_COMPACTION)
    assert Message.from_dict(held.to_dict()) == held
    assert is_server_compaction(held) and not is_server_compaction(Message.user("hi"))
    assert held.char_size() == len(block.data)
    opened = (Message.system("rules"), held, Message.assistant("answer"), Message.user("next"))
    assert h.problems(opened) == []
    assert h.problems((Message.assistant("answer"), Message.user("next"))) != []
