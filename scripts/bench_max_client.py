"""`scripts/bench-vs-llama-cpp --serve COUNTS --client max`: Modular's own serving benchmark,
`max benchmark` (PyPI `modular==26.7.0`), as the client of both servers, so that neither engine
is measured by its own tool.

`max` is installed into a venv of its own under the cache (about 2 GB and 2.5 minutes the first
time; never in CI). It needs a Hugging Face tokenizer directory for the model, which transformers
(from the repository's own venv) writes from the GGUF once per model. Each concurrency level is
one `max benchmark` run (random dataset, `--random-input-len -p`, `--random-output-len -n`,
`--num-prompts --requests`, `--max-concurrency C`, seeded by the alternation); its saved result
is read into the shape `loupe bench-serve --json` reports, so one table serves both clients:
output throughput is its total generated tokens over the benchmark's duration, TTFT / TPOT / ITL
its medians and p99s, errors its `failures`. Every request is measured (`--skip-first-n-requests`
and `--skip-last-n-requests` 0; by default it drops `max_concurrency` requests at each end, which
at 32 prompts and concurrency 32 leaves none).
`max benchmark` calls `POST /reset_prefix_cache` before it starts (loupe and llama-server both
answer it), so each level is measured with a cold prefix cache.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MAX_VERSION = "26.7.0"


def max_binary(cache, allow_install, log, die):
    """The `max` command of the cached venv, installed there first when missing."""
    venv = cache / f"max-venv-{MAX_VERSION}"
    binary = venv / "bin" / "max"
    if binary.exists():
        return binary
    if not allow_install:
        die(f"--client max needs `max` from modular=={MAX_VERSION} in {venv}; rerun without --no-install to install it")
    log(f"installing modular=={MAX_VERSION} into {venv} (about 2 GB, a few minutes; once)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # The pip a venv starts with (23.x on Python 3.11) reports modular's extras as a conflict
    # it cannot resolve; a current pip installs it.
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-U", "pip"], check=True)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"modular=={MAX_VERSION}"])
    if done.returncode != 0 or not binary.exists():
        die(f"pip install modular=={MAX_VERSION} into {venv} failed (exit {done.returncode})")
    return binary


def tokenizer_dir(cache, model, repo_root, log, die):
    """A Hugging Face tokenizer directory for `model` (a GGUF), written by transformers once."""
    out = cache / "max-tokenizers" / model.stem
    if (out / "tokenizer.json").exists():
        return out
    python = repo_root / ".venv" / "bin" / "python"
    if not python.exists():
        python = Path(sys.executable)
    log(f"writing a Hugging Face tokenizer for {model.name} into {out} (transformers, {python})")
    code = ("import sys; from transformers import AutoTokenizer; "
            "t = AutoTokenizer.from_pretrained(sys.argv[1], gguf_file=sys.argv[2]); t.save_pretrained(sys.argv[3])")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([str(python), "-c", code, str(model.parent), model.name, str(out)],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0 or not (out / "tokenizer.json").exists():
        die(f"transformers could not write a tokenizer for {model.name}:\n{done.stderr[-1500:]}")
    return out


def _number(result, *names):
    for name in names:
        value = result.get(name)
        if isinstance(value, (int, float)):
            return float(value)
    return None


def run_level(max_bin, url, model_id, tokenizer, input_len, output_len, prompts, concurrency, seed, timeout, die):
    """One `max benchmark` run at one concurrency; its result as one `load` entry of a
    `loupe bench-serve --json` report (throughput, TTFT/TPOT/ITL percentiles, errors)."""
    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "result.json"
        cmd = [str(max_bin), "benchmark", "--backend", "modular-chat", "--base-url", url,
               "--endpoint", "/v1/chat/completions", "--model", model_id, "--tokenizer", str(tokenizer),
               "--tokenizer-local-files-only", "--dataset-name", "random", "--random-input-len", str(input_len),
               "--random-output-len", str(output_len), "--num-prompts", str(prompts),
               "--max-concurrency", str(concurrency), "--no-collect-gpu-stats", "--no-collect-server-stats",
               "--seed", str(seed), "--skip-first-n-requests", "0", "--skip-last-n-requests", "0",
               "--result-filename", str(result_path), "--always-save-result"]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        # It also writes a sweep directory into its working directory: the temporary one.
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)
        # With errored requests it exits 1 and still saves the result (--always-save-result):
        # the errors are then counted, not fatal.
        if not result_path.exists():
            die(f"max benchmark at concurrency {concurrency} failed (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr)[-2500:]}")
        result = json.loads(result_path.read_text())
    completed = _number(result, "completed") or 0.0
    failed = _number(result, "failures", "failed")
    if failed is None:
        failed = max(0.0, float(prompts) - completed)
    # The whole run's output tokens per second (its "Total generated tokens" over "Benchmark
    # duration"); `mean_output_throughput` is a per-request mean, a concurrency-th of it.
    duration = _number(result, "duration")
    throughput = (_number(result, "total_output_tokens") or 0.0) / duration if duration else None
    entry = {
        "concurrency": concurrency,
        "completed": completed,
        "errors": int(failed),
        "output_tokens_per_s": throughput,
        "cached_tokens_rate": _number(result, "global_cached_token_rate"),
        "client": f"max benchmark {MAX_VERSION}",
    }
    for key, stem in (("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms"), ("itl_ms", "itl_ms")):
        entry[key] = {"p50": _number(result, f"median_{stem}", f"p50_{stem}"),
                      "p99": _number(result, f"p99_{stem}"), "mean": _number(result, f"mean_{stem}")}
    return entry


def report(max_bin, url, model_id, tokenizer, args, counts, seed, die):
    """Every concurrency level against one running server, as a bench-serve-shaped report."""
    levels = [run_level(max_bin, url, model_id, tokenizer, args.n_prompt, args.n_gen, args.requests, n, seed,
                        args.timeout, die) for n in counts]
    return {"load": levels, "multi_turn": []}
