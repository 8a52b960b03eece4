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


def test_multi_turn_retention_survives_a_forced_eviction_through_the_disk_tier(tmp_path):
    # A 16 MiB KV budget (44 blocks of SmolLM2) cannot hold 8 conversations between their
    # turns: without the disk tier turn 2 finds none of turn 1 cached (docs/batching.md,
    # "Disk tier"); with it, the evicted blocks come back from disk.
    tier = tmp_path / "kv"
    report = bench("-c", "2", "--requests", "8", "--input-len", "200", "--output-len", "16", "--multi-turn", "8,3",
                   "--kv-cache-mb", "16", "--prefix-cache-dir", str(tier))
    assert any(tier.glob("*.kvb")), "no block was evicted to disk: the budget did not force an eviction"
    turns = report["multi_turn"]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    assert all(t["retention"] > 0.5 for t in turns[1:]), turns
