"""Speculative decoding (`--speculate ngram`, issue 39) never changes an answer: every chat
golden's greedy tokens come back through a speculating server, alone and under 16-way
concurrency, streamed and not, and `loupe generate --speculate ngram` gives the golden tokens
too; the counters say drafts were verified and accepted; a request can opt out. The
speculation log (`--speculation-log`) and `--profile`'s phases account for what happened.
"""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import loupe_bin, model_path
from test_openai_api import MODEL, golden_messages, goldens

COPY = ("Repeat this sentence exactly, word for word: The lighthouse keeper climbed the stairs at dusk, "
        "lit the lamp, wound the clockwork, and watched the beam sweep across the dark water until dawn.")


@pytest.fixture(scope="module")
def spec_server(request, tmp_path_factory):
    from conftest import Server

    log = tmp_path_factory.mktemp("spec") / "spec.jsonl"
    s = Server("--max-context", "2048", "--speculate", "ngram", "--draft-tokens", "5", "--speculation-log", str(log))
    s.spec_log = log
    yield s
    assert s.stop() == 0, "".join(s.log)


def counters(server) -> dict[str, float]:
    m = server.metrics()
    return {k: m[k] for k in ("loupe_spec_decode_num_drafts_total", "loupe_spec_decode_num_draft_tokens_total",
                              "loupe_spec_decode_num_accepted_tokens_total")}


def answer(server, messages, max_tokens, stream=False, **extra):
    client = server.client()
    kwargs = dict(model=MODEL, messages=messages, temperature=0, max_tokens=max_tokens)
    if extra:
        kwargs["extra_body"] = extra
    if not stream:
        r = client.chat.completions.create(**kwargs)
        return r.choices[0].message.content, r.usage.completion_tokens
    text, usage = "", None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        for c in chunk.choices:
            text += c.delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return text, usage


def test_goldens_alone_and_under_16_way_concurrency(spec_server):
    gs = [p.values[0] for p in goldens()]
    copy = {"prompt": COPY, "max_tokens": 48}
    # The copy request's answer without speculation, from the same server (opted out).
    want_copy = answer(spec_server, [{"role": "user", "content": COPY}], 48, speculate=False)
    before = counters(spec_server)
    for g in gs:
        for stream in (False, True):
            text, n = answer(spec_server, golden_messages(g), g["max_tokens"], stream=stream)
            assert (text, n) == (g["text"], len(g["tokens"])), f"{g['name']} (stream={stream})"
    jobs = [(golden_messages(g), g["max_tokens"], (g["text"], len(g["tokens"]))) for g in gs]
    jobs.append(([{"role": "user", "content": copy["prompt"]}], copy["max_tokens"], want_copy))
    sixteen = [jobs[k % len(jobs)] for k in range(16)]
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda j: answer(spec_server, j[0], j[1], stream=len(j[0][-1]["content"]) % 2 == 0), sixteen))
    for k, (job, g) in enumerate(zip(sixteen, got)):
        assert g == job[2], f"request {k} among 16"
    after = counters(spec_server)
    assert after["loupe_spec_decode_num_drafts_total"] > before["loupe_spec_decode_num_drafts_total"]
    assert after["loupe_spec_decode_num_accepted_tokens_total"] > before["loupe_spec_decode_num_accepted_tokens_total"]


def test_a_request_can_opt_out(spec_server):
    messages = [{"role": "user", "content": COPY}]
    before = counters(spec_server)
    assert answer(spec_server, messages, 32, speculate=False) == answer(spec_server, messages, 32)
    # Only the second request drafted.
    mid = counters(spec_server)
    assert mid["loupe_spec_decode_num_drafts_total"] > before["loupe_spec_decode_num_drafts_total"]
    answer(spec_server, messages, 32, speculate=False)
    assert counters(spec_server) == mid


@pytest.mark.parametrize("g", goldens()[:3])
def test_loupe_generate_speculate_gives_the_golden_tokens(g):
    cmd = [str(loupe_bin()), "generate", "--model", str(model_path()), "--chat", "--temperature", "0",
           "--max-tokens", str(g["max_tokens"]), "--json", "--speculate", "ngram", g["prompt"]]
    if g.get("system"):
        cmd += ["--system", g["system"]]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["tokens"] == g["tokens"]
    assert "loupe: speculation (ngram" in done.stderr


def read_records(path, offset=0):
    with open(path, encoding="utf-8") as f:
        f.seek(offset)
        return [json.loads(line) for line in f.read().splitlines()]


def test_the_servers_speculation_log_accounts_for_a_requests_tokens(spec_server):
    # Requests run one at a time here, so the lines written after `offset` are this one's.
    offset = spec_server.spec_log.stat().st_size
    _, n = answer(spec_server, [{"role": "user", "content": COPY}], 40)
    records = read_records(spec_server.spec_log, offset)
    assert len({r["seq"] for r in records}) == 1, records
    assert sum(len(r["produced"]) for r in records) == n
    assert any(r["accepted"] > 0 for r in records), "the copy prompt has drafts accepted"
    for r in records:
        assert r["produced"][: r["accepted"]] == r["proposed"][: r["accepted"]], r


def test_loupe_generate_logs_each_step_and_profiles_draft_and_verify_time(tmp_path):
    log = tmp_path / "spec.jsonl"
    cmd = [str(loupe_bin()), "generate", "--model", str(model_path()), "--chat", "--temperature", "0",
           "--max-tokens", "40", "--json", "--speculate", "ngram", "--speculation-log", str(log), "--profile", COPY]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    tokens = json.loads(done.stdout)["tokens"]
    records = read_records(log)
    assert [t for r in records for t in r["produced"]] == tokens
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), "one record per step for one sequence"
    m = re.search(r"(\d+) of (\d+) drafts accepted", done.stderr)
    assert m, done.stderr
    assert int(m.group(1)) == sum(r["accepted"] for r in records)
    assert int(m.group(2)) == sum(len(r["proposed"]) for r in records)
    for phase in ("speculation: drafting", "speculation: steps that verify drafts", "speculation: steps with prompt rows"):
        assert re.search(rf"^  {re.escape(phase)} +\d+ +[0-9.]+ +[0-9.]+$", done.stderr, re.M), (phase, done.stderr)


def test_a_speculation_log_without_speculation_is_one_clear_error(tmp_path):
    cmd = [str(loupe_bin()), "generate", "--model", str(model_path()), "--max-tokens", "2",
           "--speculation-log", str(tmp_path / "x.jsonl"), "Hello"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["loupe: error: --speculation-log needs --speculate"], done.stderr


@pytest.mark.parametrize("draft_precision, least_accepted", [("auto", 0.8), ("q8", 0.6)])
@pytest.mark.parametrize("g", goldens()[:2])
def test_a_draft_model_gives_the_golden_tokens(g, draft_precision, least_accepted):
    """`--speculate draft` with the target's own file as the draft model: the tokens are the
    golden ones whatever the draft's arithmetic, and most drafts are accepted. Not all: the
    draft's multi-token catch-up passes use prefill arithmetic, and the default q8 draft
    8-bit activations, either of which can tip a near-tie the other way (SmolLM2's haiku
    accepts 78% of the q8 drafts)."""
    cmd = [str(loupe_bin()), "generate", "--model", str(model_path()), "--chat", "--temperature", "0",
           "--max-tokens", str(g["max_tokens"]), "--json", "--speculate", "draft", "--draft-model", str(model_path()),
           "--draft-precision", draft_precision, g["prompt"]]
    if g.get("system"):
        cmd += ["--system", g["system"]]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["tokens"] == g["tokens"]
    m = re.search(r"speculation \(draft, up to 5 drafts\): \d+ verification steps, (\d+) of (\d+) drafts accepted",
                  done.stderr)
    assert m and int(m.group(2)) > 0 and int(m.group(1)) >= least_accepted * int(m.group(2)), done.stderr


def test_a_draft_model_with_the_targets_arithmetic_drafts_what_the_target_chooses():
    """The model itself as its draft at the target's precision: each draft pass computes the
    bits of the target's own decode step, so every draft is accepted (the default q8 draft
    may lose a near-tie here and there)."""
    g = goldens()[0].values[0]
    cmd = [str(loupe_bin()), "generate", "--model", str(model_path()), "--chat", "--temperature", "0",
           "--max-tokens", str(g["max_tokens"]), "--json", "--speculate", "draft", "--draft-model", str(model_path()),
           "--precision", "native", "--draft-precision", "native", g["prompt"]]
    if g.get("system"):
        cmd += ["--system", g["system"]]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["tokens"] == g["tokens"]
    m = re.search(r"(\d+) of (\d+) drafts accepted", done.stderr)
    assert m and int(m.group(2)) > 0 and m.group(1) == m.group(2), done.stderr


@pytest.mark.parametrize("flags, message", [
    (["--draft-model", "x.gguf"], "--draft-model needs --speculate draft"),
    (["--draft-precision", "native"], "--draft-precision needs --speculate draft"),
    (["--speculate", "draft"], "--speculate draft needs --draft-model PATH"),
    (["--speculate", "draft", "--draft-model", "/nonexistent/draft.gguf"],
     "--draft-model /nonexistent/draft.gguf: no such file or directory"),
])
def test_draft_model_flags_are_one_clear_error(flags, message):
    cmd = [str(loupe_bin()), "generate", "--model", str(model_path()), "--max-tokens", "2", *flags, "Hello"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [f"loupe: error: {message}"], done.stderr
