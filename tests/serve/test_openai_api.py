"""`loupe serve` through the official `openai` client: the routes, the request rules and
the error bodies, on the real model."""

from __future__ import annotations

import json
import math
import subprocess

import httpx
import openai
import pytest

from conftest import GOLDEN_DIR, loupe_bin, model_path

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def chat(client, content, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def test_models_and_health(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    r = httpx.get(server.base + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def goldens():
    out = []
    for path in sorted(GOLDEN_DIR.glob("chat-*.json")):
        g = json.loads(path.read_text())
        out.append(pytest.param(g, id=g["name"]))
    return out


def golden_messages(g):
    messages = [{"role": "system", "content": g["system"]}] if g.get("system") else []
    return messages + [{"role": "user", "content": g["prompt"]}]


def token_strings(server, ids):
    return [httpx.post(server.base + "/detokenize", json={"tokens": [t]}).json()["prompt"] for t in ids]


@pytest.mark.parametrize("g", goldens())
def test_greedy_chat_returns_the_golden_tokens(server, g):
    """Greedy chat through the server gives the golden continuation token for token (each
    position's token string from logprobs equals the golden id's), and the same text as
    `loupe generate --chat --temperature 0`."""
    r = server.client().chat.completions.create(
        model=MODEL, messages=golden_messages(g), temperature=0, max_tokens=g["max_tokens"], logprobs=True
    )
    choice = r.choices[0]
    content_tokens = g["tokens"][:-1] if g["stopped_on_eos"] else g["tokens"]
    assert choice.message.content == g["text"]
    assert r.usage.completion_tokens == len(g["tokens"])
    assert r.usage.prompt_tokens == len(g["prompt_tokens"])
    assert choice.finish_reason == ("stop" if g["stopped_on_eos"] else "length")
    assert [e.token for e in choice.logprobs.content] == token_strings(server, content_tokens)
    cmd = [str(loupe_bin()), "generate", "--model", str(model_path()), "--chat", "--temperature", "0", "--max-tokens", str(g["max_tokens"]), "--json", g["prompt"]]
    if g.get("system"):
        cmd += ["--system", g["system"]]
    cli = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    assert cli["tokens"] == g["tokens"]
    assert cli["text"] == choice.message.content


def test_streaming_chat_with_usage_matches_the_whole_response(server):
    client = server.client()
    whole = chat(client, "Name a large animal.", max_tokens=20)
    chunks = list(chat(client, "Name a large animal.", max_tokens=20, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    # The usage chunk comes last, with no choices; every other chunk has usage null.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    usage = chunks[-1].usage
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    # The same prompt again: its full blocks come from the prefix cache, and it says so.
    assert usage.prompt_tokens_details.cached_tokens >= 16
    # Without include_usage, no usage chunk.
    plain = list(chat(client, "Name a large animal.", max_tokens=5, stream=True))
    assert all(c.usage is None for c in plain) and plain[-1].choices


def test_cached_tokens_always_reported(server):
    r = chat(server.client(), "A prompt nobody sent before: zebra quartz nimbus.", max_tokens=2)
    assert r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_completions_whole_and_streamed(server):
    client = server.client()
    whole = client.completions.create(model=MODEL, prompt="The quick brown fox", temperature=0, max_tokens=12)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    parts = list(client.completions.create(model=MODEL, prompt="The quick brown fox", temperature=0, max_tokens=12, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices) == whole.choices[0].text
    # OpenAI's default for completions is 16 tokens.
    assert client.completions.create(model=MODEL, prompt="Once", temperature=0).usage.completion_tokens == 16
    # Token-id prompts are accepted.
    ids = httpx.post(server.base + "/tokenize", json={"prompt": "The quick brown fox"}).json()["tokens"]
    by_ids = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=12)
    assert by_ids.choices[0].text == whole.choices[0].text


def test_stop_strings_cut_the_text(server):
    client = server.client()
    free = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=16).choices[0].text
    assert " 6" in free, free
    cut = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=16, stop=[" 6"])
    assert cut.choices[0].text == free[: free.index(" 6")]
    assert cut.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=16, stop=" 6", stream=True))
    assert "".join(p.choices[0].text for p in streamed) == cut.choices[0].text


def test_chat_logprobs(server):
    r = chat(server.client(), "Say hello.", max_tokens=8, logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    assert len(entries) >= 1
    assert "".join(e.token for e in entries) == r.choices[0].message.content
    for e in entries:
        assert len(e.top_logprobs) == 3
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert sum(math.exp(x) for x in lps) <= 1.0 + 1e-4
        # Greedy: the chosen token is the most likely one.
        assert e.top_logprobs[0].token == e.token
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6
        assert bytes(e.bytes).decode() == e.token
    streamed = list(chat(server.client(), "Say hello.", max_tokens=8, logprobs=True, top_logprobs=3, stream=True))
    streamed_lps = [e.logprob for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed_lps == pytest.approx([e.logprob for e in entries], abs=1e-6)


def test_completion_logprobs(server):
    r = server.client().completions.create(model=MODEL, prompt="Paris is the capital of", temperature=0, max_tokens=4, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(len(t) == 2 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_developer_role_is_system(server):
    client = server.client()
    as_system = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=16, messages=[{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello!"}])
    as_developer = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=16, messages=[{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hello!"}])
    assert as_developer.choices[0].message.content == as_system.choices[0].message.content
    assert as_developer.usage.prompt_tokens == as_system.usage.prompt_tokens


def test_explicit_nulls_are_absent(server):
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": "Hi", "name": None}], "max_tokens": 4, "temperature": 0,
        "tools": None, "tool_choice": None, "response_format": None, "stop": None, "seed": None, "logprobs": None,
        "top_logprobs": None, "stream_options": None, "user": None, "n": None,
    }
    r = httpx.post(server.base + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    # And through the client's own parameters.
    chat(server.client(), "Hi", max_tokens=4, extra_body={"tools": None, "response_format": None, "tool_choice": None})


def test_unknown_fields_are_400_naming_the_field(server):
    with pytest.raises(openai.BadRequestError) as e:
        chat(server.client(), "Hi", max_tokens=2, extra_body={"frobnicate": True})
    assert e.value.status_code == 400
    err = e.value.body
    assert err["param"] == "frobnicate" and "frobnicate" in err["message"]
    assert err["type"] == "invalid_request_error"


def test_unknown_fields_dropped_when_allowed(start_server):
    s = start_server("--allow-extra-request-fields", "--max-context", "512")
    r = chat(s.client(), "Hi", max_tokens=2, extra_body={"frobnicate": True})
    assert r.choices[0].finish_reason in ("stop", "length")
    assert any("frobnicate" in line for line in s.log)


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_too_long(start_server, stream):
    s = start_server("--max-context", "128")
    prompt = "lighthouse " * 200
    with pytest.raises(openai.BadRequestError) as e:
        r = chat(s.client(), prompt, stream=stream)
        if stream:
            list(r)
    err = e.value.body
    n = err["num_tokens"]
    assert n > 128 and err["max_length"] == 128
    assert err["message"] == f"Prompt is too long: {n} tokens exceeds the configured maximum context length of 128 tokens. Please shorten your prompt."
    with pytest.raises(openai.BadRequestError) as e:
        s.client().completions.create(model=MODEL, prompt=prompt, stream=stream)
    assert e.value.body["max_length"] == 128


def test_bad_requests_use_the_openai_error_body(server):
    cases = [
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 5}, 400, "temperature"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 3}, 400, "n"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
        ({"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ]
    for body, status, param in cases:
        r = httpx.post(server.base + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) >= {"message", "type", "param", "code"}
        assert err["param"] == param
    r = httpx.post(server.base + "/v1/chat/completions", content=b"{not json", timeout=60)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.get(server.base + "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_body_size_cap_is_413(start_server):
    s = start_server("--max-body-bytes", "2000", "--max-context", "512")
    r = httpx.post(s.base + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x" * 5000}]}, timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["message"].startswith("The request body exceeds the limit of 2000 bytes")


def test_api_key(start_server):
    s = start_server("--api-key", "sesame", "--max-context", "512")
    with pytest.raises(openai.AuthenticationError) as e:
        chat(s.client(api_key="wrong"), "Hi", max_tokens=2)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    assert httpx.get(s.base + "/v1/models").status_code == 401
    assert chat(s.client(api_key="sesame"), "Hi", max_tokens=2).usage.completion_tokens >= 1
    # Health and metrics stay open for probes and scrapers.
    assert httpx.get(s.base + "/health").status_code == 200
    assert httpx.get(s.base + "/metrics").status_code == 200


def test_health_is_503_while_loading(start_server):
    s = start_server("--load-delay-ms", "3000", "--max-context", "512", wait_ready=False)
    r = httpx.get(s.base + "/health", timeout=5)
    assert r.status_code == 503
    assert r.json()["error"]["message"] == "Loading model" and r.json()["error"]["type"] == "unavailable_error"
    # Other routes say the same, with a Retry-After.
    r = httpx.post(s.base + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, timeout=5)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    s.wait_ready()
    assert httpx.get(s.base + "/health").status_code == 200
    assert any(line.startswith("loupe serve: phase load:") for line in s.log)
    assert any(line.startswith("loupe serve: phase kv_cache:") for line in s.log)


def test_tokenize_and_detokenize(server):
    r = httpx.post(server.base + "/tokenize", json={"prompt": "Hello world"}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 2048
    assert httpx.post(server.base + "/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == "Hello world"
    # A chat tokenizes as the chat endpoint counts it.
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    t = httpx.post(server.base + "/tokenize", json={"messages": messages}).json()
    usage = server.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=1).usage
    assert t["count"] == usage.prompt_tokens
    bad = httpx.post(server.base + "/detokenize", json={"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_reset_prefix_cache_makes_the_next_request_cold(server):
    # `max benchmark` (and vLLM's clients) call this before a run so that nothing is cached.
    client = server.client()
    prompt = "Reset check: name three rivers of Europe, one word each."
    first = chat(client, prompt, max_tokens=4)
    warm = chat(client, prompt, max_tokens=4)
    assert warm.usage.prompt_tokens_details.cached_tokens >= 16
    r = httpx.post(server.base + "/reset_prefix_cache")
    assert r.status_code == 200, r.text
    assert r.json()["dropped_blocks"] >= 1
    cold = chat(client, prompt, max_tokens=4)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    # The cache changes the work, never the answer.
    assert cold.choices[0].message.content == warm.choices[0].message.content == first.choices[0].message.content
    # Nothing cached left to drop; still 200.
    httpx.post(server.base + "/reset_prefix_cache").raise_for_status()
    assert httpx.get(server.base + "/reset_prefix_cache").status_code == 405
