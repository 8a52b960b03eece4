"""What two MAX 26.7 debug options do when a graph runs, beyond what InferenceSession.debug
reports: `pre-jit` (with ir-output-dir) and `nan-check` on an op that makes a NaN, with and
without a per-key stride. Each probe runs in a fresh interpreter (MAX reads MODULAR_DEBUG
once, at import). Run with the MAX venv's python; writes JSON to stdout."""

import json
import os
import subprocess
import sys
import tempfile

GRAPH = r"""
import json, os, sys
import numpy as np
from max.driver import CPU, Buffer
from max.dtype import DType
from max.engine import InferenceSession
from max.graph import DeviceRef, Graph, TensorType, ops

dev = DeviceRef.CPU()
with Graph("loupe_probe", input_types=[TensorType(DType.float32, [4], dev)]) as g:
    x = g.inputs[0].tensor
    y = ops.sqrt(x)          # sqrt(-1) = NaN
    z = ops.exp(y * 2.0) + 1.0
    g.output(z)
out = {}
try:
    m = InferenceSession(devices=[CPU()]).load(g)
    r = m.execute(Buffer.from_numpy(np.array([1.0, -1.0, 4.0, 9.0], np.float32)))
    out["result"] = [str(v) for v in r[0].to_numpy()]
except BaseException as e:
    out["error"] = type(e).__name__ + ": " + str(e)[:600]
print("@@" + json.dumps(out))
"""


def main():
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MODULAR_DEBUG", "MODULAR_MAX_DEBUG"))}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        ir = os.path.join(tmp, "ir")
        for env in [
            {},
            {"MODULAR_DEBUG": "nan-check"},
            {"MODULAR_DEBUG": "nan-check", "MODULAR_MAX_DEBUG_NAN_CHECK_STRIDE": "1"},
            {"MODULAR_DEBUG": f"pre-jit,ir-output-dir={ir}"},
        ]:
            p = subprocess.run([sys.executable, "-c", GRAPH], env={**base, **env}, capture_output=True, text=True,
                               timeout=900)
            got = next((json.loads(l[2:]) for l in p.stdout.splitlines() if l.startswith("@@")), None)
            files = sorted(os.listdir(ir)) if os.path.isdir(ir) else []
            results.append({
                "env": {k: v.replace(tmp, "$TMP") for k, v in env.items()},
                "exit": p.returncode,
                "outcome": got,
                "stderr": [l.replace(tmp, "$TMP") for l in p.stderr.splitlines() if l.strip()][-4:],
                "ir_files": files,
            })
            print(json.dumps(results[-1])[:400], file=sys.stderr)
    json.dump(results, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
