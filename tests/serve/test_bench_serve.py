"""`loupe bench-serve`: against a running server (--url) and against one it starts."""

from __future__ import annotations

import json
import subprocess

from conftest import loupe_bin, model_path


def bench(*args: str) -> dict:
    cmd = [str(loupe_bin()), "bench-serve", "--model", str(model_path()), "--json", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def check(report: dict, concurrency: list[int], requests: int, output: int):
    assert [r["concurrency"] for r in report["load"]] == concurrency
    for r in report["load"]:
        assert r["errors"] == 0, r["first_error"]
        # ignore_eos: every request generates exactly --output-len tokens.
        assert r["output_tokens"] == requests * output
        assert r["output_tokens_per_s"] > 0 and r["ttft_ms"]["p50"] > 0
        assert 0 < r["tpot_ms"]["p50"] <= r["tpot_ms"]["p99"]
        assert r["itl_ms"]["p50"] > 0


def test_bench_serve_against_a_running_server(server):
    report = bench("--url", server.base, "-c", "1,4", "--requests", "6", "--input-len", "24", "--output-len", "8", "--multi-turn", "2,3")
    check(report, [1, 4], 6, 8)
    turns = report["multi_turn"]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    assert turns[0]["retention"] is None
    # Later turns find most of the conversation in the prefix cache.
    assert all(t["retention"] > 0.6 and t["cached_tokens"] > 0 for t in turns[1:])


def test_bench_serve_starts_its_own_server():
    report = bench("-c", "2", "--requests", "4", "--input-len", "16", "--output-len", "6", "--multi-turn", "0")
    check(report, [2], 4, 6)
    assert report["multi_turn"] == []
    assert report["url"].startswith("http://127.0.0.1:")
