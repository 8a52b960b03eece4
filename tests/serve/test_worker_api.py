"""What routers ask a `loupe serve` worker, and the engine extension fields they and vLLM/SGLang
clients send (issue 38): the shapes sglang-router's `smg` and vllm-router parse (measured
against their 0.3.2 / 0.1.17 binaries), with default server flags.
"""

from __future__ import annotations

import httpx
import pytest

from test_reasoning import MESSAGES as THINKING

MODEL = "SmolLM2-135M-Instruct.Q4_1"
HELLO = [{"role": "user", "content": "hello there"}]
# The body smg 0.3.2 forwards for a plain chat request (captured).
SMG_CHAT = {"messages": HELLO, "model": MODEL, "logprobs": False, "max_completion_tokens": 4, "stream": False,
            "no_stop_trim": False, "ignore_eos": False, "continue_final_message": False, "skip_special_tokens": True,
            "separate_reasoning": True, "stream_reasoning": True, "return_hidden_states": False}
# ... and vllm-router 0.1.17's (to /v1/chat/completions and to its /render).
VLLM_CHAT = {"model": MODEL, "messages": HELLO, "stream": False, "max_tokens": 4, "logprobs": False, "no_stop_trim": False,
             "ignore_eos": False, "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
             "stream_reasoning": True, "return_hidden_states": False, "include_reasoning": True}
SMG_COMPLETION = {"model": MODEL, "prompt": "hello there", "max_tokens": 4, "stream": False, "echo": False,
                  "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True, "return_hidden_states": False}


def post(server, path, body):
    return httpx.post(server.base + path, json=body, timeout=120)


def test_server_and_model_info_in_sglangs_shape(server):
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(server.base + path, timeout=10).json()
        # smg's /v1/models lists `served_model_name`; no `model_path`, which smg would try
        # to load a tokenizer from (and download, as a Hugging Face id).
        assert info["served_model_name"] == MODEL and "model_path" not in info
        assert info["max_running_requests"] == 32 and info["dp_size"] == 1 and info["context_length"] == 2048
        assert info["max_total_tokens"] > 0 and info["page_size"] == 16
    for path in ("/model_info", "/get_model_info"):
        info = httpx.get(server.base + path, timeout=10).json()
        assert (info["model_type"], info["architectures"], info["is_generation"]) == ("llama", ["LlamaForCausalLM"], True)


def test_get_load_in_each_routers_shape(server, start_server):
    # smg sums the integer num_tokens of a list of ranks.
    ranks = httpx.get(server.base + "/get_load", timeout=10).json()
    assert isinstance(ranks, list) and len(ranks) == 1
    assert {type(ranks[0][k]) for k in ("num_reqs", "num_waiting_reqs", "num_tokens")} == {int}
    vllm = start_server("--load-format", "vllm")
    assert httpx.get(vllm.base + "/get_load", timeout=10).json() == {"load": 0}


def test_render_is_the_prompt_the_completion_runs(server):
    rendered = post(server, "/v1/chat/completions/render", VLLM_CHAT)
    assert rendered.status_code == 200, rendered.text
    tokenized = post(server, "/tokenize", {"model": MODEL, "continue_final_message": False, "messages": HELLO}).json()
    assert rendered.json()["token_ids"] == tokenized["tokens"] and tokenized["count"] == len(tokenized["tokens"])
    answer = post(server, "/v1/chat/completions", VLLM_CHAT).json()
    assert answer["usage"]["prompt_tokens"] == len(tokenized["tokens"])
    completion = post(server, "/v1/completions/render", SMG_COMPLETION).json()
    assert completion["token_ids"] == post(server, "/tokenize", {"model": MODEL, "prompt": "hello there"}).json()["tokens"]
    # An invalid request is refused here as the completion would be.
    bad = post(server, "/v1/chat/completions/render", {**VLLM_CHAT, "no_stop_trim": True})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "no_stop_trim")


def test_router_bodies_are_answered_and_utility_routes_are_not_counted(server):
    before = server.metrics()
    for path, body in [("/v1/chat/completions", SMG_CHAT), ("/v1/chat/completions", VLLM_CHAT), ("/v1/completions", SMG_COMPLETION)]:
        r = post(server, path, body)
        assert r.status_code == 200, f"{path}: {r.text}"
    for _ in range(3):
        assert post(server, "/tokenize", {"model": MODEL, "prompt": "x"}).status_code == 200
        assert post(server, "/v1/chat/completions/render", VLLM_CHAT).status_code == 200
    assert post(server, "/flush_cache", {}).json()["status"] == "ok"
    after = server.metrics()
    key = "loupe_requests_total{outcome=success}"
    assert after[key] - before[key] == 3


@pytest.mark.parametrize(
    "field,value",
    [("return_hidden_states", True), ("no_stop_trim", True), ("include_stop_str_in_output", True), ("min_tokens", 2)],
)
def test_values_that_would_change_the_answer_are_refused_by_name(server, field, value):
    r = post(server, "/v1/chat/completions", {**VLLM_CHAT, field: value})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field and field in r.json()["error"]["message"]


def test_continue_final_message_continues_the_assistants_text(server):
    messages = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "The capital of France is"}]
    body = {"model": MODEL, "messages": messages, "continue_final_message": True, "temperature": 0, "max_tokens": 6}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    # The prompt ends with the assistant's words, not an end of turn and a new turn.
    ids = post(server, "/tokenize", {"model": MODEL, "messages": messages, "continue_final_message": True}).json()["tokens"]
    text = post(server, "/detokenize", {"model": MODEL, "tokens": ids}).json()["prompt"]
    assert text.endswith("The capital of France is"), text
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    assert "Paris" in r.json()["choices"][0]["message"]["content"]
    both = post(server, "/v1/chat/completions", {**body, "add_generation_prompt": True})
    assert (both.status_code, both.json()["error"]["param"]) == (400, "add_generation_prompt")


def test_skip_special_tokens_false_keeps_them(server):
    # Past the end of its answer (ignore_eos), SmolLM2 writes its end-of-turn token and more.
    question = [{"role": "user", "content": "What is 2+2? Answer with a number."}]
    body = {"model": MODEL, "messages": question, "temperature": 0, "max_tokens": 12, "ignore_eos": True}
    skipped = post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    kept = post(server, "/v1/chat/completions", {**body, "skip_special_tokens": False}).json()["choices"][0]["message"]["content"]
    assert "<|im_end|>" in kept and "<|im_end|>" not in skipped
    assert kept.startswith("The answer is 4.<|im_end|>"), kept
    assert kept.replace("<|im_end|>", "").replace("<|im_start|>", "") == skipped
    # Without ignore_eos the end-of-turn token ends the answer and is not part of it.
    ended = post(server, "/v1/chat/completions", {**body, "ignore_eos": False, "skip_special_tokens": False}).json()
    assert ended["choices"][0]["message"]["content"] == "The answer is 4."


def test_reasoning_fields(start_server):
    server = start_server("--reasoning-parser", "qwen3")
    body = {"model": MODEL, "messages": THINKING, "temperature": 0, "max_tokens": 40}
    split = post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]
    assert split["reasoning"] and split["content"] == "Bye!"
    dropped = post(server, "/v1/chat/completions", {**body, "include_reasoning": False}).json()["choices"][0]["message"]
    assert "reasoning" not in dropped and dropped["content"] == "Bye!"
    kept = post(server, "/v1/chat/completions", {**body, "separate_reasoning": False}).json()["choices"][0]["message"]
    assert kept["content"] == f"<think>{split['reasoning']}</think>Bye!" and "reasoning" not in kept
    refused = post(server, "/v1/chat/completions", {**body, "stream": True, "stream_reasoning": False})
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "stream_reasoning")
