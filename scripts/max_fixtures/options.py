"""MAX 26.7's answers to `MODULAR_DEBUG` strings and `MODULAR_MAX_DEBUG_<KEY>` variables:
for each environment, a fresh interpreter imports max.engine and reports what
`InferenceSession.debug` holds and what MAX wrote to stderr. Run with the MAX venv's python;
writes JSON to stdout."""

import json
import os
import subprocess
import sys

ENVS = [
    {},
    {"MODULAR_DEBUG": "nan-check"},
    {"MODULAR_DEBUG": "nan-check=1"},
    {"MODULAR_DEBUG": "nan-check=true"},
    {"MODULAR_DEBUG": "nan-check=0"},
    {"MODULAR_DEBUG": "nan-check=yes"},
    {"MODULAR_DEBUG": "NAN-CHECK"},
    {"MODULAR_DEBUG": "nan_check"},
    {"MODULAR_DEBUG": " nan-check , ,assert-level=all "},
    {"MODULAR_DEBUG": "sensible"},
    {"MODULAR_DEBUG": "sensible,assert-level=warn"},
    {"MODULAR_DEBUG": "assert-level=all"},
    {"MODULAR_DEBUG": "assert-level=ALL"},
    {"MODULAR_DEBUG": "assert-level=bogus"},
    {"MODULAR_DEBUG": "assert-level"},
    {"MODULAR_DEBUG": "op-log-level=info"},
    {"MODULAR_DEBUG": "op-log-level=bogus"},
    {"MODULAR_DEBUG": "print-style=full"},
    {"MODULAR_DEBUG": "print-style=FULL"},
    {"MODULAR_DEBUG": "print-style=binary_max_checkpoint"},
    {"MODULAR_DEBUG": "print-style=bogus"},
    {"MODULAR_DEBUG": "nan-check-stride=5"},
    {"MODULAR_DEBUG": "nan-check-stride=abc"},
    {"MODULAR_DEBUG": "nan-check-stride=0"},
    {"MODULAR_DEBUG": "uninitialized-read-check"},
    {"MODULAR_DEBUG": "uninitialized-read-mode=report"},
    {"MODULAR_DEBUG": "uninitialized-read-mode=bogus"},
    {"MODULAR_DEBUG": "ir-output-dir=/tmp/loupe-max-ir"},
    {"MODULAR_DEBUG": "ir-output-dir"},
    {"MODULAR_DEBUG": "pre-jit"},
    {"MODULAR_DEBUG": "device-sync-mode,stack-trace-on-error,stack-trace-on-crash,source-tracebacks"},
    {"MODULAR_DEBUG": "frobnicate"},
    {"MODULAR_DEBUG": "stop-after=fuse"},
    {"MODULAR_DEBUG": "verify-ir"},
    {"MODULAR_MAX_DEBUG_NAN_CHECK": "yes"},
    {"MODULAR_MAX_DEBUG_NAN_CHECK": "1"},
    {"MODULAR_MAX_DEBUG_NAN_CHECK": "true"},
    {"MODULAR_MAX_DEBUG_NAN_CHECK": "on"},
    {"MODULAR_MAX_DEBUG_NAN_CHECK": "bogus"},
    {"MODULAR_MAX_DEBUG_NAN_CHECK": "0"},
    {"MODULAR_MAX_DEBUG_NAN_CHECK": "0", "MODULAR_DEBUG": "nan-check"},
    {"MODULAR_MAX_DEBUG_NAN_CHECK": "1", "MODULAR_DEBUG": "nan-check=0"},
    {"MODULAR_MAX_DEBUG_ASSERT_LEVEL": "all"},
    {"MODULAR_MAX_DEBUG_ASSERT_LEVEL": "safe", "MODULAR_DEBUG": "assert-level=warn"},
    {"MODULAR_MAX_DEBUG_PRINT_STYLE": "full"},
    {"MODULAR_MAX_DEBUG_OP_LOG_LEVEL": "info"},
    {"MODULAR_MAX_DEBUG_SENSIBLE": "1"},
    {"MODULAR_MAX_DEBUG_SENSIBLE_MODE": "1"},
]

PROBE = r"""
import json
from max.engine import InferenceSession
d = InferenceSession.debug
out = {}
for k in ["nan_check", "uninitialized_read_check", "uninitialized_read_mode", "device_sync_mode",
          "stack_trace_on_error", "stack_trace_on_crash", "source_tracebacks", "pre_jit",
          "op_log_level", "assert_level", "print_style", "ir_output_dir", "sensible_mode"]:
    try:
        v = getattr(d, k)
        out[k] = v if isinstance(v, (bool, int, str)) or v is None else str(v)
    except Exception as e:
        out[k] = "error: " + repr(e)
print("@@" + json.dumps(out))
"""


def main():
    base = {k: v for k, v in os.environ.items() if not k.startswith("MODULAR_DEBUG") and not k.startswith("MODULAR_MAX_DEBUG")}
    results = []
    for env in ENVS:
        p = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True, timeout=300)
        values = None
        for line in p.stdout.splitlines():
            if line.startswith("@@"):
                values = json.loads(line[2:])
        stderr = [l for l in p.stderr.splitlines() if l.strip()][-6:]
        results.append({"env": env, "exit": p.returncode, "stderr": stderr, "debug": values})
        print(json.dumps(results[-1]), file=sys.stderr)
    json.dump(results, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
