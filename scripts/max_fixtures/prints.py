"""MAX 26.7 tensor prints: one graph of print ops over every dtype MAX prints, run once per
print style. Run with the MAX venv's python: `prints.py STYLE PRECISION OUTDIR` prints to
stdout (COMPACT / FULL) or writes files into OUTDIR (BINARY / BINARY_MAX_CHECKPOINT).
`prints.py --cases` writes the cases' inputs as JSON (what the Rust tests print)."""

import json
import math
import sys

import numpy as np

NAN, INF = float("nan"), float("inf")


def ramp(n, scale=1.0, off=0.0):
    return [round((i - n / 2) * scale + off, 6) for i in range(n)]


# label, MAX dtype name, shape, values (row-major), all exactly representable in the dtype
# after a cast from f32 (the graph casts an f32 input).
CASES = [
    ("f32_0d", "float32", [], [3.25]),
    ("f32_1d", "float32", [5], [1.0, -2.5, 0.000123, 12345.678, -0.0]),
    ("f32_2d", "float32", [2, 3], [-0.8333333, -0.5, 0.25, 1.0, 2.0, 3.1415927]),
    ("f32_special", "float32", [2, 4], [NAN, INF, -INF, 1e-40, -1e-45, 1e10, -1e-10, 0.00005]),
    ("f32_long_row", "float32", [20], [1.12345] * 20),
    ("f32_elide_rows", "float32", [9, 8], ramp(72, 0.37)),
    ("f32_3d", "float32", [2, 2, 3], ramp(12, 0.5)),
    ("f32_3d_elide", "float32", [8, 2, 2], ramp(32, 0.25)),
    ("f32_4d", "float32", [2, 1, 2, 2], ramp(8, 1.5)),
    ("f32_4d_elide", "float32", [2, 7, 1, 7], ramp(98, 0.1)),
    ("f32_empty", "float32", [0, 3], []),
    ("f32_row7", "float32", [1, 7], ramp(7, 1.0)),
    ("f32_row6", "float32", [6, 6], ramp(36, 1.0)),
    ("f32_round", "float32", [6], [0.00005, 0.00015, 1.00005, -0.00005, 123456789.0, 0.1]),
    ("f16_2d", "float16", [2, 3], [0.5, -1.25, 65504.0, 6e-08, NAN, -INF]),
    ("bf16_2d", "bfloat16", [2, 3], [0.5, -1.25, 3.0e38, 1.0e-39, NAN, INF]),
    ("bf16_long", "bfloat16", [3, 10], ramp(30, 0.125)),
    ("si8_2d", "int8", [2, 4], [-128, -1, 0, 127, 5, 6, 7, 8]),
    ("ui8_1d", "uint8", [8], [0, 1, 2, 3, 252, 253, 254, 255]),
    ("si32_2d", "int32", [2, 2], [-2147483648, 2147483520, 0, 7]),
    ("si64_1d", "int64", [3], [-9007199254740992, 0, 42]),
    ("bool_2d", "bool", [2, 3], [1, 0, 1, 0, 0, 1]),
    # float8_e4m3fn is refused on the CPU ("not supported on device cpu:0").
    ("f32_ties", "float32", [6], [1.03125, -2.71875, 0.15625, 2.5, 0.0001220703125, 1e-5]),
    ("f32_big", "float32", [5], [3.4028235e38, -3.4028235e38, 1e20, -1e30, 1.5e-39]),
    ("f64_1d", "float64", [3], [0.1, -1e300, 1e-300]),
    ("si16_1d", "int16", [2], [-32768, 32767]),
    ("ui16_1d", "uint16", [2], [0, 65535]),
    ("ui32_1d", "uint32", [2], [0, 4294967040]),
    ("ui64_1d", "uint64", [2], [0, 1099511627776]),
    ("label? with|odd<chars>:a/b", "float32", [2], [1.0, 2.0]),
    ("keep*()_,;.+=@&'[]-x", "float32", [2], [3.0, 4.0]),
    ("repeated", "float32", [2], [5.0, 6.0]),
    ("repeated", "float32", [2], [7.0, 8.0]),
]


def main():
    if sys.argv[1] == "--cases":
        out = [
            {"label": l, "dtype": d, "shape": s, "values": [v if math.isfinite(v) else repr(v) for v in vals]}
            for (l, d, s, vals) in CASES
        ]
        json.dump(out, sys.stdout, indent=0)
        return
    style, precision, outdir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    from max.driver import CPU, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops

    dev = DeviceRef.CPU()
    types = [TensorType(DType.float32, s, dev) for (_, _, s, _) in CASES]
    with Graph("loupe_prints", input_types=types) as g:
        for (label, dtype, _, _), x in zip(CASES, g.inputs):
            t = x.tensor
            if dtype != "float32":
                t = ops.cast(t, getattr(DType, dtype))
            t.print(label)
        g.output(g.inputs[0].tensor)
    session = InferenceSession(devices=[CPU()])
    session.set_debug_print_options(style, precision, outdir)
    model = session.load(g)
    args = [Buffer.from_numpy(np.array(v, dtype=np.float32).reshape(s)) for (_, _, s, v) in CASES]
    sys.stdout.flush()
    model.execute(*args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
