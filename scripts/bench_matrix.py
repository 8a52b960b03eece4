"""`scripts/bench-vs-llama-cpp --matrix`: every model of the performance matrix in one table.

The matrix: the three real models the project fetches (SmolLM2-135M-Instruct Q4_1, Gemma 3
270M Q4_K_M, Qwen2.5-Coder-0.5B-Instruct) and the Llama-3.2-1B-, Llama-3.2-3B- and
Llama-3.1-8B-shaped Q4_K_M files `scripts/write-shaped-gguf` writes (real shapes and
per-tensor types, seeded random values: speed does not depend on them).

Per model, in this order:
  1. the pp/tg comparison: this script itself run on the model (`--model M -p P -n N -k K
     --json-out F`), the same loupe and llama-bench binaries for every model, its own noise
     flags and same-alternation ratios;
  2. load time, K alternations: `loupe bench -p 0 -n 1 --warmup 0` (its `load_s`, and where
     `--weights auto` put the weights: mapped in place or copied, shown beside it) against the
     wall time of `llama-bench -p 0 -n 1 --no-warmup` minus its one token (llama-bench does not
     report its load; the token's time is its tg figure from step 1). With `--cold`, the page
     cache is dropped before each load run (needs root: /proc/sys/vm/drop_caches).

The table: prefill and decode as ratios to llama.cpp's default configuration (median of the
same-alternation ratios), decode's share of the read bandwidth `loupe bench` measures, peak
RSS against (file + the KV cache of the run) and against llama-bench's, and load time as a
ratio. A row whose runs were noisy is flagged. This module is imported by
`scripts/bench-vs-llama-cpp`; it is not a script of its own.
"""

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (label, how to obtain the file, prompt tokens, decode steps). Smaller tests for the
# larger models keep the whole matrix within about half an hour on 2 cores.
MATRIX = [
    ("SmolLM2-135M Q4_1", ("fetch", "smollm2"), 512, 128),
    ("Gemma 3 270M Q4_K_M", ("fetch", "gemma3-270m"), 256, 64),
    ("Qwen2.5-Coder-0.5B", ("fetch", "qwen2.5-coder-0.5b"), 256, 64),
    ("Llama-3.2-1B-shaped Q4_K_M", ("shaped", "llama-3.2-1b"), 256, 64),
    ("Llama-3.2-3B-shaped Q4_K_M", ("shaped", "llama-3.2-3b"), 128, 32),
    ("Llama-3.1-8B-shaped Q4_K_M", ("shaped", "llama-3.1-8b"), 64, 16),
]

# The goals of the performance issue.
GOAL_PP, GOAL_TG, GOAL_SHARE, GOAL_RSS = 1.5, 1.25, 0.85, 1.15
# As `scripts/bench-vs-llama-cpp`'s BUSY_LOAD: the 1-minute load average per CPU above which
# a run's figures are not results.
BUSY_LOAD = 0.25


def obtain(repo: Path, how, log, die) -> Path:
    kind, name = how
    if kind == "fetch":
        cmd = ["bash", str(repo / "scripts" / "fetch-model"), name]
    else:
        venv_python = repo / ".venv" / "bin" / "python"
        python = str(venv_python) if venv_python.exists() else sys.executable
        cmd = [python, str(repo / "scripts" / "write-shaped-gguf"), name]
    log(f"matrix: obtaining {name}: {' '.join(cmd)}")
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        die(f"could not obtain {name} ({' '.join(cmd)} exited {r.returncode})")
    return Path(r.stdout.strip().splitlines()[-1])


def drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def load_times(loupe, llama_bench, model, threads, k, cold, run_measured, log):
    """K alternations of a minimal run of each engine: (loupe load s, llama.cpp load+1 token s,
    where loupe's weights were: "mapped"/"copied" per run, `--weights auto`'s choice)."""
    ours, theirs, placed = [], [], []
    for i in range(k):
        for engine in (("loupe", "llama") if i % 2 == 0 else ("llama", "loupe")):
            if cold and not drop_page_cache():
                cold = False
                log("matrix: cannot drop the page cache (not root?): load times are warm")
            if engine == "loupe":
                cmd = [str(loupe), "bench", "-m", str(model), "-t", str(threads), "-p", "0", "-n", "1", "-r", "1",
                       "--warmup", "0", "--no-ceiling", "--json"]
                code, out, _, _ = run_measured(cmd, 1800)
                if code == 0:
                    report = json.loads(out.strip().splitlines()[-1])
                    ours.append(report["load_s"])
                    placed.append(report.get("weights") or "?")
            else:
                cmd = [str(llama_bench), "-m", str(model), "-t", str(threads), "-p", "0", "-n", "1", "-r", "1",
                       "--no-warmup", "-o", "json"]
                start = time.monotonic()
                code, out, _, _ = run_measured(cmd, 1800)
                wall = time.monotonic() - start
                if code == 0:
                    tg = json.loads(out)[0].get("avg_ts") or 0
                    theirs.append(wall - (1.0 / tg if tg else 0.0))
    return ours, theirs, placed, cold


def busy_note(doc):
    """The run's own verdict on the machine: busy when its load average per CPU was above
    the main script's limit when it started."""
    load, cpus = doc.get("load_average_before"), doc.get("logical_cpus") or 1
    return [f"busy (load {load:.2f})"] if load is not None and load > BUSY_LOAD * cpus else []


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def f2(x, suffix="x"):
    return "-" if x is None else f"{x:.2f}{suffix}"


def run(args, script: Path, repo: Path, llama_bench: Path, loupe: Path, cpu: str, log, die, run_measured):
    rows = []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    wanted = [m for m in MATRIX if not args.matrix_only or any(s in m[0].lower() for s in args.matrix_only)]
    if not wanted:
        die(f"--matrix-only {args.matrix_only}: matches no model of the matrix")
    cold = args.cold
    for label, how, p, n in wanted:
        model = obtain(repo, how, log, die)
        with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
            cmd = [sys.executable, str(script), "--model", str(model), "-t", str(args.threads), "-k",
                   str(args.alternations), "-r", str(args.reps), "-p", str(p), "-n", str(n), "--precision",
                   # Each model waits for the load average the previous one left (two busy
                   # threads raise it to ~2; it falls below the busy limit in ~1.5 min).
                   args.precision, "--wait-idle", str(max(args.wait_idle, 150)), "--loupe", str(loupe),
                   "--llama-bench", str(llama_bench),
                   "--json-out", tmp.name]
            log(f"matrix: {label}: pp{p} / tg{n}, {args.alternations} alternations")
            r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
            sys.stderr.write(r.stdout)
            if r.returncode != 0:
                die(f"matrix: {label}: the comparison failed (exit {r.returncode})")
            doc = json.loads(Path(tmp.name).read_text())
        ours, theirs, placed, cold = load_times(loupe, llama_bench, model, args.threads, args.alternations, cold,
                                        run_measured, log)
        peer = doc["summary"].get("llama-default") or {}
        lo = doc["engines"]["loupe"]
        raw = lo["raw"][-1] if lo["raw"] else {}
        kv = (raw.get("kv_bytes_per_position") or 0) * (p + n)
        size = raw.get("model_size_bytes") or model.stat().st_size
        rss = max(lo["peak_rss_bytes"]) if lo["peak_rss_bytes"] else None
        peer_rss = max(doc["engines"]["llama-default"]["peak_rss_bytes"]) if "llama-default" in doc["engines"] else None
        rows.append({
            "model": label, "file": str(model), "file_bytes": size, "pp": p, "tg": n,
            "pp_ratio": peer.get("pp_ratio_median_of_same_run"), "tg_ratio": peer.get("tg_ratio_median_of_same_run"),
            "loupe_pp": med(lo["pp"]), "loupe_tg": med(lo["tg"]),
            "llama_pp": peer.get("pp_median"), "llama_tg": peer.get("tg_median"),
            "read_share": doc.get("read_bandwidth_share"),
            "rss_over_file_kv": rss / (size + kv) if rss else None,
            "rss_vs_llama": rss / peer_rss if rss and peer_rss else None,
            "load_s": med(ours), "llama_load_s": med(theirs), "weights": placed,
            "load_ratio": med(ours) / med(theirs) if med(ours) and med(theirs) else None,
            "noisy": (doc.get("noisy") or []) + busy_note(doc),
            "isa": doc["isa"],
        })

    print(f"\nloupe vs llama.cpp, the model matrix, {args.threads} threads, {args.alternations} alternations, "
          f"loupe --precision {args.precision}, {started}")
    print(f"CPU: {cpu}; loads {'cold (page cache dropped)' if cold else 'warm'}\n")
    print("| model | pp / tg | loupe pp, tg t/s | llama.cpp pp, tg t/s | prefill | decode | decode / read bw "
          "| peak RSS / (file + KV) | RSS vs llama.cpp | load loupe (weights), llama.cpp s | load | noisy |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---|---:|---|")
    for r in rows:
        share = "-" if r["read_share"] is None else f"{100 * r['read_share']:.0f}%"
        print(f"| {r['model']} | pp{r['pp']} / tg{r['tg']} | {r['loupe_pp'] or 0:.1f}, {r['loupe_tg'] or 0:.1f} "
              f"| {r['llama_pp'] or 0:.1f}, {r['llama_tg'] or 0:.1f} | {f2(r['pp_ratio'])} | {f2(r['tg_ratio'])} "
              f"| {share} | {f2(r['rss_over_file_kv'])} "
              f"| {f2(r['rss_vs_llama'])} | {r['load_s'] or 0:.2f} ({'/'.join(sorted(set(r['weights']))) or '?'}), "
              f"{r['llama_load_s'] or 0:.2f} | {f2(r['load_ratio'])} "
              f"| {'yes: ' + '; '.join(r['noisy']) if r['noisy'] else ''} |")
    met = [r for r in rows if (r["pp_ratio"] or 0) >= GOAL_PP and (r["tg_ratio"] or 0) >= GOAL_TG
           and (r["read_share"] or 0) >= GOAL_SHARE and (r["rss_over_file_kv"] or 9) <= GOAL_RSS
           and (r["load_ratio"] or 9) <= 1.0]
    print(f"\ngoals (prefill >= {GOAL_PP}x, decode >= {GOAL_TG}x and >= {100 * GOAL_SHARE:.0f}% of the read bandwidth, "
          f"peak RSS <= {GOAL_RSS}x file + KV, load <= llama.cpp's): met on {len(met)} of {len(rows)} models"
          + (f" ({', '.join(r['model'] for r in met)})" if met else ""))
    if args.json_out:
        args.json_out.write_text(json.dumps({"started": started, "cpu": cpu, "cold": cold, "rows": rows}, indent=1) + "\n")
        log(f"matrix written to {args.json_out}")
