"""Tool calling on Qwen2.5-Coder-0.5B-Instruct (its chat template renders tools and tool
results): `tool_choice` required and named constrain the output to tool-call sections by
grammar; the calls come back as the `openai` client's typed objects, whole and streamed,
with arguments that validate against the declared parameters; a tool result round-trips;
a template that cannot render tools refuses them.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from conftest import Server, qwen_model_path

MODEL = "Qwen2.5-Coder-0.5B-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD}},
]
PARAMS = {"get_weather": WEATHER, "add": ADD}


@pytest.fixture(scope="module")
def qwen():
    s = Server("--max-context", "4096", model=qwen_model_path())
    yield s.client()
    assert s.stop() == 0, "".join(s.log)


def ask(client, content, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], tools=TOOLS, temperature=0, max_tokens=200, **kw)


def check_calls(calls, names):
    assert calls, "no tool calls"
    for call in calls:
        assert isinstance(call, openai.types.chat.ChatCompletionMessageFunctionToolCall)
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_required_gives_calls_that_validate(qwen):
    r = ask(qwen, "What is the weather in Paris?", tool_choice="required")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    check_calls(choice.message.tool_calls, {"get_weather", "add"})
    assert choice.message.content is None


def test_named_choice_calls_that_function_once_without_parallel_calls(qwen):
    r = ask(qwen, "What is the weather in Paris?", tool_choice={"type": "function", "function": {"name": "add"}}, parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1
    check_calls(choice.message.tool_calls, {"add"})


def test_streamed_calls_arrive_whole_with_indexes(qwen):
    stream = ask(qwen, "What is the weather in Paris and in Rome?", tool_choice="required", stream=True)
    calls, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            for call in c.delta.tool_calls or []:
                assert call.index == len(calls)
                calls.append(call)
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_a_tool_result_round_trips(qwen):
    first = ask(qwen, "What is 2 + 3? Use the add tool.", tool_choice={"type": "function", "function": {"name": "add"}}, parallel_tool_calls=False).choices[0].message
    call = first.tool_calls[0]
    messages = [
        {"role": "user", "content": "What is 2 + 3? Use the add tool."},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"result": 5})},
    ]
    r = qwen.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, temperature=0, max_tokens=60)
    assert r.choices[0].finish_reason in ("stop", "tool_calls")
    answer = r.choices[0].message
    assert (answer.content or "") or answer.tool_calls


def test_a_template_without_tools_refuses_them(server):
    # SmolLM2's template never reads `tools`: the request is refused, never answered without them.
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=[{"role": "user", "content": "x"}], tools=TOOLS, max_tokens=4)
    assert e.value.body["param"] == "tools"
