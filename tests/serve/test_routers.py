"""`loupe serve` replicas behind the cache-aware routers users deploy (issue 38).

Three replicas with default flags behind each router installed from PyPI into the test venv
(`scripts/test` pins them): sglang-router's `smg` (cache_aware) and vllm-router (cache_aware,
and consistent_hash keyed by an `x-session-id` header). Driven by the official `openai`
client: 5 prefix groups x 4 requests, streamed and not, every answer token-identical to one
server alone and each group's follow-ups served from the prefix cache of the replica that
served the group. Then replicas stop under the router: one with SIGTERM while it streams (the
stream ends with an error event, not a silent cut), one with SIGKILL (non-streaming requests
still succeed on the replica left). Bounded: a fixed number of requests, every process stopped.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from conftest import Server, _missing

VENV_BIN = Path(sys.executable).parent
REPLICAS = 3
GROUPS = 5
QUESTIONS = ["What is 2+2?", "Name a primary color.", "Say hello in French.", "What is the capital of Italy?"]
MAX_TOKENS = 12
# What docs/deploy.md recommends in front of loupe replicas: a worker's circuit opens after
# 2 failures, fewer than a request's 5 retries, so a request that meets a dead replica is
# retried on another (both routers' default threshold, 10, fails the request first), and
# health is checked every 2 s instead of every 60.
ROUTER_RESILIENCE = ["--cb-failure-threshold", "2", "--health-check-interval-secs", "2", "--health-failure-threshold", "1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def system_prompt(salt: str, group: int) -> str:
    # About 300 tokens, so a prefix match is many blocks and the cache-aware policies
    # (smg's character match, vllm-router's token match) see the groups apart.
    facts = " ".join(f"Fact {i} of group {group}: the {salt} archive lists item {group * 100 + i} as shelved." for i in range(16))
    return f"You are the {salt} assistant for group {group}. Answer briefly. {facts}"


class Router:
    """A router process in front of `workers`, ready when it reports each one healthy."""

    def __init__(self, kind: str, policy: str, workers: list[str], log: Path):
        exe = VENV_BIN / ("smg" if kind == "smg" else "vllm-router")
        if not exe.exists():
            _missing(f"needs {exe.name} in {VENV_BIN} (scripts/test installs sglang-router and vllm-router)")
        port = free_port()
        args = [str(exe), *(["launch"] if kind == "smg" else []), "--host", "127.0.0.1", "--port", str(port)]
        args += ["--worker-urls", *workers, "--policy", policy, "--prometheus-port", str(free_port())]
        args += ROUTER_RESILIENCE
        self.base = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{exe.name} exited with {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                listed = httpx.get(self.base + "/workers", timeout=5).json().get("workers", [])
                if len(listed) == len(workers) and all(w.get("is_healthy") for w in listed):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{exe.name} did not report {len(workers)} healthy workers in 60 s:\n{log.read_text()[-3000:]}")

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0, timeout=120)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def successes(s: Server) -> float:
    return s.metrics()['loupe_requests_total{outcome=success}']


def ask(client: openai.OpenAI, messages, stream: bool, session: str):
    """One greedy chat request: the answer text and its cached prompt tokens."""
    kwargs = dict(model=MODEL_ID[0], messages=messages, temperature=0, max_tokens=MAX_TOKENS, extra_headers={"x-session-id": session})
    if not stream:
        r = client.chat.completions.create(**kwargs)
        return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens
    text, cached = "", None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        for c in chunk.choices:
            text += c.delta.content or ""
        if chunk.usage is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens
    return text, cached


# The served model id, read from the reference server (module fixture).
MODEL_ID: list[str] = []


@pytest.fixture(scope="module")
def reference():
    """One server alone: the answers every routed request must equal."""
    s = Server("--max-context", "2048", "--threads", "1")
    MODEL_ID[:] = [httpx.get(s.base + "/v1/models", timeout=10).json()["data"][0]["id"]]
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.mark.parametrize(
    "kind,policy",
    [("smg", "cache_aware"), ("vllm-router", "cache_aware"), ("vllm-router", "consistent_hash")],
    ids=["smg-cache_aware", "vllm_router-cache_aware", "vllm_router-consistent_hash"],
)
def test_replicas_behind_a_router(kind, policy, reference, tmp_path):
    replicas = [Server("--max-context", "2048", "--threads", "1", "--shutdown-timeout", "0.5") for _ in range(REPLICAS)]
    router = None
    try:
        router = Router(kind, policy, [r.base for r in replicas], tmp_path / "router.log")
        client, alone = router.client(), reference.client()
        salt = f"{kind}-{policy}"
        served_by: dict[int, set[int]] = {}
        conversations = []
        for g in range(GROUPS):
            for i, q in enumerate(QUESTIONS):
                messages = [{"role": "system", "content": system_prompt(salt, g)}, {"role": "user", "content": q}]
                before = [successes(r) for r in replicas]
                text, cached = ask(client, messages, stream=i % 2 == 1, session=f"group-{g}")
                after = [successes(r) for r in replicas]
                which = [k for k in range(REPLICAS) if after[k] > before[k]]
                assert len(which) == 1, f"group {g} request {i}: replicas' success counters moved {before} -> {after}"
                served_by.setdefault(g, set()).add(which[0])
                expected, _ = ask(alone, messages, stream=False, session="alone")
                assert text == expected, f"group {g} request {i} through {kind}: {text!r} != alone {expected!r}"
                if i > 0:
                    assert cached and cached > 0, f"group {g} follow-up {i} was not served from the prefix cache ({cached})"
                conversations.append(messages)
        for g, where in served_by.items():
            assert len(where) == 1, f"{kind} {policy} spread group {g} over replicas {sorted(where)}"

        # A replica stopped with SIGTERM while it streams: the stream ends with an error
        # event (the openai client raises), after the tokens already sent.
        victim = next(iter(served_by[0]))
        messages = conversations[0]
        stream = client.chat.completions.create(
            model=MODEL_ID[0],
            messages=messages,
            temperature=0,
            max_tokens=1500,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"x-session-id": "group-0"},
        )
        received = 0
        with pytest.raises(openai.APIError) as err:
            for chunk in stream:
                received += 1
                if received == 3:
                    replicas[victim].proc.send_signal(signal.SIGTERM)
        assert received >= 3, f"the stream ended after {received} chunks"
        assert "shutting down" in str(err.value).lower(), str(err.value)
        assert replicas[victim].proc.wait(30) == 0, "".join(replicas[victim].log)

        # A replica killed with SIGKILL: non-streaming requests still succeed, routed to the
        # replica left, with the same answers.
        live = [k for k in range(REPLICAS) if k != victim]
        replicas[live[0]].kill()
        for g, messages in enumerate(conversations[3::4]):
            text, _ = ask(client, messages, stream=False, session=f"group-{g}")
            expected, _ = ask(alone, messages, stream=False, session="alone")
            assert text == expected, f"after the kills, group {g}: {text!r} != alone {expected!r}"
    finally:
        if router is not None:
            router.stop()
        for r in replicas:
            r.kill()
