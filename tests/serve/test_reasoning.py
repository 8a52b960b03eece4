"""`--reasoning-parser`: the model's thinking moves to the message's `reasoning` field
(never `reasoning_content`), whole and streamed, and stays in `content` without a parser.

SmolLM2 does not think by itself; two earlier turns whose answers think inside
<think></think> make it (greedy, checked) think the same way in its third answer.
"""

from __future__ import annotations

MODEL = "SmolLM2-135M-Instruct.Q4_1"
MESSAGES = [
    {"role": "system", "content": "Always think inside <think></think> before answering."},
    {"role": "user", "content": "Say hi"},
    {"role": "assistant", "content": "<think>The user greets me. I greet back.</think>Hi!"},
    {"role": "user", "content": "Say hello"},
    {"role": "assistant", "content": "<think>The user wants hello. I say hello.</think>Hello!"},
    {"role": "user", "content": "Say bye"},
]


def ask(server, stream: bool):
    return server.client().chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=40, stream=stream)


def test_thinking_moves_to_reasoning_whole_and_streamed(start_server):
    server = start_server("--reasoning-parser", "qwen3")
    whole = ask(server, stream=False).choices[0].message
    assert whole.reasoning == "The user wants bye. I say goodbye."
    assert whole.content == "Bye!"
    assert "reasoning_content" not in whole.model_dump()
    reasoning, content = "", ""
    for chunk in ask(server, stream=True):
        for choice in chunk.choices:
            delta = choice.delta.model_dump(exclude_none=True)
            assert "reasoning_content" not in delta
            reasoning += delta.get("reasoning", "")
            content += delta.get("content", "")
            assert "<think>" not in content + reasoning and "</think>" not in content + reasoning
    assert (reasoning, content) == (whole.reasoning, whole.content)


def test_without_a_parser_the_text_is_untouched(start_server):
    # SmolLM2 is a Llama: its default parser is none.
    server = start_server()
    message = ask(server, stream=False).choices[0].message
    assert message.content == "<think>The user wants bye. I say goodbye.</think>Bye!"
    assert getattr(message, "reasoning", None) is None
