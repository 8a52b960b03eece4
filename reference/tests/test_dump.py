"""Tests of the dumper (``python -m loupe_reference dump``), the dump layout and the fixtures.

Run: python -m unittest discover -s reference/tests
- dumpfmt tests need numpy only (instant);
- hook tests build tiny random models in-process (torch + transformers import, a few seconds);
- tests on the real model (GGUF) run only with LOUPE_REFERENCE_SLOW=1 and LOUPE_MODEL set.
"""

import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REFERENCE = HERE.parent
sys.path.insert(0, str(REFERENCE))

from loupe_reference import cli, dumpfmt as F  # noqa: E402

import importlib.util  # noqa: E402

HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))

SLOW = os.environ.get("LOUPE_REFERENCE_SLOW") == "1" and os.path.isfile(os.environ.get("LOUPE_MODEL", ""))
ENV = dict(os.environ, PYTHONPATH=str(REFERENCE) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def entry(name, arr, step=0, order=0, dtype=None):
    arr = np.asarray(arr)
    return F.Entry(name, step, order, arr, dtype or F.dtype_name(arr), ["token", "hidden"][: arr.ndim])


class FormatTests(unittest.TestCase):
    def test_sanitize_label(self):
        self.assertEqual(F.sanitize_label('a/b\\c:d?e"f<g>h|i j'), "a_b_c_d_e_f_g_h_i_j")
        self.assertEqual(F.sanitize_label("model.layers.0.mlp(1)"), "model.layers.0.mlp(1)")

    def test_stats_float64_and_nonfinite(self):
        s = F.tensor_stats(np.array([1.0, 2.0, np.nan, np.inf, -np.inf, 3.0], dtype=np.float32))
        self.assertEqual((s["min"], s["max"], s["mean"], s["nan"], s["inf"]), (1.0, 3.0, 2.0, 1, 2))
        self.assertAlmostEqual(s["std"], np.std([1.0, 2.0, 3.0]))
        s = F.tensor_stats(np.array([np.nan], dtype=np.float32))
        self.assertEqual((s["min"], s["std"], s["nan"]), (None, None, 1))
        big = np.full(1000, 1e30, dtype=np.float32)  # f32 accumulation would overflow the square sum
        self.assertEqual(F.tensor_stats(big)["std"], 0.0)

    def test_max_file_bytes_exact(self):
        data = np.array([[1.0, -2.0, 0.5]], dtype=np.float32)
        blob = F.max_file_bytes("a b", data, "f32")
        key = b"a_b"
        meta = 4 + len(key) + 2 + 4 * 2 + 8
        expected = (bytes([0x93, 0xF0, 0x9F, 0x94, 0xA5, 0x2B, 0x2B, 0x93]) + struct.pack("<IIQ", 0, 1, meta)
                    + struct.pack("<I", 3) + key + bytes([81, 2]) + struct.pack("<II", 1, 3)
                    + struct.pack("<Q", 24 + meta) + data.tobytes())
        self.assertEqual(blob, expected)
        k, code, shape, raw = F.read_max_file(blob)
        self.assertEqual((k, code, shape), ("a_b", 81, [1, 3]))
        np.testing.assert_array_equal(np.frombuffer(raw, dtype="<f4").reshape(shape), data)

    def test_max_dtype_codes(self):
        bits = np.array([0x3F80, 0xC000], dtype=np.uint16)  # bf16 1.0, -2.0
        k, code, shape, raw = F.read_max_file(F.max_file_bytes("x", bits, "bf16"))
        self.assertEqual((code, shape, raw), (80, [2], bits.tobytes()))
        self.assertEqual(F.read_max_file(F.max_file_bytes("x", np.zeros(1, np.int64), "i64"))[1], 141)
        self.assertEqual(F.read_max_file(F.max_file_bytes("x", np.zeros((), np.float16), "f16"))[1:3], (79, []))

    def test_bf16_bits(self):
        np.testing.assert_array_equal(F.bf16_bits_to_f32(np.array([0x3F80, 0xC000, 0x7FC0], np.uint16))[:2], [1.0, -2.0])

    def test_compact_matches_max_example(self):
        line = F.format_tensor("label", np.full(20, 1.12345, dtype=np.float32), "f32")
        self.assertEqual(line, "label = tensor([[1.1235, 1.1235, 1.1235, ..., 1.1235, 1.1235, 1.1235]], dtype=f32, shape=[20])")

    def test_compact_short_and_2d(self):
        self.assertEqual(F.serialize(np.array([1.0, -2.0])), "[[1.0000, -2.0000]]")
        a = np.arange(8 * 2, dtype=np.float32).reshape(8, 2)
        self.assertEqual(
            F.serialize(a),
            "[[0.0000, 1.0000],\n[2.0000, 3.0000],\n[4.0000, 5.0000],\n ..., \n\n[10.0000, 11.0000],\n[12.0000, 13.0000],\n[14.0000, 15.0000]]")
        self.assertEqual(F.serialize(np.zeros((6, 1))).count("\n"), 5)  # 6 rows: no elision

    def test_compact_3d(self):
        a = np.arange(2 * 2 * 2, dtype=np.float32).reshape(2, 2, 2)
        self.assertEqual(F.serialize(a), "[[[0.0000, 1.0000],\n[2.0000, 3.0000]],\n\n[[4.0000, 5.0000],\n[6.0000, 7.0000]]]")
        b = np.zeros((9, 1, 1), dtype=np.float32)
        self.assertEqual(F.serialize(b).count("[0.0000]"), 6)

    def test_full_style(self):
        a = np.arange(4, dtype=np.float32) / 3
        s = F.format_tensor("x", a.reshape(2, 2), "f32", compact=False, precision=3)
        self.assertEqual(s, "x = tensor<2x2xf32> [0.000e+00, 3.333e-01, 6.667e-01, 1.000e+00]")

    def test_prints_match_max_26_7_fixtures(self):
        """Byte for byte MAX's own stdout (tests/fixtures/max-26.7, made by scripts/max-fixtures)."""
        root = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "max-26.7" / "prints"
        cases = json.loads((root / "cases.json").read_text())
        names = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int8": "si8",
                 "uint8": "ui8", "int16": "si16", "uint16": "ui16", "int32": "si32", "uint32": "ui32",
                 "int64": "si64", "uint64": "ui64", "bool": "bool"}
        np_of = {80: None, 79: np.float16, 82: np.float64, 135: np.int8, 134: np.uint8, 137: np.int16,
                 136: np.uint16, 139: np.int32, 138: np.uint32, 141: np.int64, 140: np.uint64, 1: np.bool_}
        for style, fixture in [(None, "compact.txt"), (6, "full-6.txt"), (3, "full-3.txt")]:
            out = []
            for i, c in enumerate(cases):
                with np.errstate(over="ignore"):  # f64_1d's -1e300 is -inf in the f32 input, as in MAX's run
                    vals = np.array([float(v) for v in c["values"]], dtype=np.float32).reshape(c["shape"])
                later = any(d["label"] == c["label"] for d in cases[i + 1:])
                if c["dtype"] != "float32" and not later:
                    key = F.sanitize_label(c["label"])
                    _, code, shape, raw = F.read_max_file((root / "max" / f"{key}.max").read_bytes())
                    if code == 80:
                        vals = F.bf16_bits_to_f32(np.frombuffer(raw, np.uint16)).reshape(shape)
                    else:
                        vals = np.frombuffer(raw, np_of[code]).reshape(shape)
                dtype = names[c["dtype"]]
                if style is None:
                    out.append(F.format_tensor(c["label"], vals, dtype) + "\n")
                else:
                    out.append(F.format_tensor(c["label"], vals, dtype, compact=False, precision=style) + "\n")
            ours, theirs = "".join(out), (root / fixture).read_text()
            for n, (x, y) in enumerate(zip(ours.splitlines(), theirs.splitlines())):
                self.assertEqual(x, y, f"{fixture} line {n + 1}")
            self.assertEqual(ours, theirs)

    def test_print_entries_in_order_with_steps(self):
        out = io.StringIO()
        F.print_entries([entry("b", np.float32([2.0]), 1, 1), entry("a", np.float32([1.0]), 0, 0)], out, steps_header=True)
        self.assertEqual(out.getvalue(), "# step 0\na = tensor([[1.0000]], dtype=f32, shape=[1])\n"
                                         "# step 1\nb = tensor([[2.0000]], dtype=f32, shape=[1])\n")

    def test_write_dump_npy_binary_max(self):
        es = [entry("model.embed_tokens", np.arange(6, dtype=np.float32).reshape(2, 3), 0, 0),
              entry("x/y(1)", np.ones((1, 2), np.float32), 1, 1),
              entry("bf", np.array([0x3F80], np.uint16), 1, 2, dtype="bf16")]
        header = {"producer": {"engine": "t", "version": "0"}, "prompt_tokens": [5]}
        for style in ("npy", "binary", "max"):
            with self.subTest(style=style), tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "dump")
                F.write_dump(out, header, es, style)
                m = read_json(os.path.join(out, "manifest.json"))
                self.assertEqual((m["format"], m["version"], m["prompt_tokens"]), ("loupe-dump", 1, [5]))
                self.assertEqual(list(m)[-1], "tensors")
                self.assertEqual([t["order"] for t in m["tensors"]], [0, 1, 2])
                ext = F.FILE_EXT[style]
                self.assertEqual([t["file"] for t in m["tensors"]],
                                 [f"step0/model.embed_tokens{ext}", f"step1/x_y(1){ext}", f"step1/bf{ext}"])
                self.assertEqual(m["tensors"][0]["shape"], [2, 3])
                self.assertEqual(m["tensors"][2]["dtype"], "bf16")
                self.assertEqual(m["tensors"][2]["stats"]["max"], 1.0)
                p = os.path.join(out, m["tensors"][0]["file"])
                if style == "npy":
                    np.testing.assert_array_equal(np.load(p), es[0].data)
                elif style == "binary":
                    self.assertEqual(read_bytes(p), es[0].data.astype("<f4").tobytes())
                else:
                    self.assertEqual(F.read_max_file(read_bytes(p))[0], "model.embed_tokens")
                self.assertEqual(sorted(os.listdir(tmp)), ["dump"])  # no temp dir left

    def test_write_dump_is_atomic(self):
        bad = entry("bad", np.zeros(2, np.float32))
        bad.dtype = "no-such-dtype"  # the .max writer fails on it, after the first file was written
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "dump")
            with self.assertRaises(KeyError):
                F.write_dump(out, {}, [entry("ok", np.zeros(2, np.float32)), bad], "max")
            self.assertEqual(os.listdir(tmp), [])
            os.makedirs(out)
            open(os.path.join(out, "x"), "w").close()
            with self.assertRaises(ValueError):
                F.write_dump(out, {}, [entry("ok", np.zeros(2, np.float32))], "npy")

    def test_an_earlier_dump_is_replaced(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "dump")
            F.write_dump(out, {}, [entry("a", np.zeros(2, np.float32))])
            F.write_dump(out, {}, [entry("b", np.ones(2, np.float32))])
            self.assertEqual([t["name"] for t in read_json(os.path.join(out, "manifest.json"))["tensors"]], ["b"])
            self.assertEqual(sorted(os.listdir(out)), ["manifest.json", "step0"])
            self.assertEqual(os.listdir(os.path.join(out, "step0")), ["b.npy"])
            self.assertEqual(os.listdir(tmp), ["dump"])

    def test_file_name_collision_is_an_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaises(ValueError):
                F.write_dump(os.path.join(tmp, "d"), {}, [entry("a b", np.zeros(1, np.float32)), entry("a_b", np.zeros(1, np.float32))])


class DumpCliTests(unittest.TestCase):
    def parse(self, *argv):
        return cli.build_parser().parse_args(list(argv))

    def test_dump_args(self):
        a = self.parse("dump", "--gguf", "m", "--prompt", "p", "--layers", "2", "--taps", "a", "b", "--taps", "c",
                       "--steps", "3", "-o", "d", "--style", "max", "--dtype", "native")
        self.assertEqual((a.layers, a.taps, a.steps, a.output, a.style, a.dtype), ("2", ["a", "b", "c"], 3, "d", "max", "native"))

    def validate(self, *argv):
        a = self.parse("dump", *argv)
        cli._validate_dump_args(a)
        return a

    def test_defaults(self):
        a = self.validate("--gguf", "m", "--prompt", "p")
        self.assertEqual((a.style, a.steps, a.layers_n, a.teacher), ("compact", 0, None, None))
        with tempfile.TemporaryDirectory() as tmp:
            a = self.validate("--gguf", "m", "--prompt", "p", "-o", os.path.join(tmp, "d"), "--teacher-force", "5,6")
            self.assertEqual((a.style, a.steps, a.teacher), ("npy", 2, [5, 6]))

    def test_usage_errors(self):
        with tempfile.TemporaryDirectory() as tmp:
            full = os.path.join(tmp, "full")
            os.makedirs(full)
            open(os.path.join(full, "f"), "w").close()
            bad = [
                ["--gguf", "m", "--prompt", "p", "--style", "npy"],               # file style without -o
                ["--gguf", "m", "--prompt", "p", "--style", "full", "-o", "x"],   # print style with -o
                ["--gguf", "m", "--prompt", "p", "--taps", "("],                  # bad regex
                ["--gguf", "m", "--prompt", "p", "--steps", "3", "--teacher-force", "1,2"],
                ["--gguf", "m", "--prompt", "p", "--layers", "0"],
                ["--gguf", "m", "--prompt", "p", "--layers", "x"],
                ["--gguf", "m", "--prompt", "p", "--seed", "1"],                  # --seed needs --config
                ["--gguf", "m", "--prompt", "p", "--system", "s"],                # --system needs --chat
                ["--gguf", "m", "--prompt", "p", "-o", full],                     # non-empty output dir
                ["--config", os.path.join(tmp, "nope.json"), "--prompt", "p"],
            ]
            for argv in bad:
                with self.subTest(argv=argv), self.assertRaises(ValueError):
                    self.validate(*argv)

    def test_bad_input_exit_2_one_line(self):
        proc = subprocess.run([sys.executable, "-m", "loupe_reference", "dump", "--gguf", "/nonexistent.gguf",
                               "--prompt", "p"], cwd=str(REFERENCE), env=ENV, capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)


@unittest.skipUnless(HAVE_TORCH, "torch/transformers not installed")
class TruncateLayersTests(unittest.TestCase):
    def test_every_key_and_nested(self):
        from loupe_reference.model import truncate_layers

        cfg = {"num_hidden_layers": 4, "n_layer": 4, "text_config": {"num_layers": 6, "layer_types": ["a"] * 6},
               "vision_config": {"depth": 3}}
        self.assertEqual(truncate_layers(cfg, 2), ["num_hidden_layers", "n_layer", "text_config.num_layers"])
        self.assertEqual(cfg["text_config"], {"num_layers": 2, "layer_types": ["a", "a"]})
        self.assertEqual(cfg["vision_config"], {"depth": 3})

    def test_errors(self):
        from loupe_reference import InputError
        from loupe_reference.model import truncate_layers

        with self.assertRaises(InputError):
            truncate_layers({"depth": 3}, 1)
        with self.assertRaises(InputError):
            truncate_layers({"num_hidden_layers": 3}, 4)

    def test_transformers_config(self):
        from transformers import LlamaConfig

        from loupe_reference.model import truncate_layers

        c = LlamaConfig(num_hidden_layers=5)
        self.assertEqual(truncate_layers(c, 3), ["num_hidden_layers"])
        self.assertEqual(c.num_hidden_layers, 3)


def tiny_llama(layers=2, vocab=300, seed=0, **kw):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from loupe_reference.model import quiet_transformers

    quiet_transformers(False)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                      rope_theta=10000.0, max_position_embeddings=256, **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)
    return m


@unittest.skipUnless(HAVE_TORCH, "torch/transformers not installed")
class HookTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from loupe_reference import dump as D

        cls.D = D
        cls.model = tiny_llama()
        cls.prompt = [5, 17, 42, 7, 99]
        cls.dumped = D.run_dump(cls.model, cls.prompt, steps=2)
        cls.by = {(e.step, e.name): e.data for e in cls.dumped.entries}

    def test_module_called_twice_gets_suffixes(self):
        import torch
        from torch import nn

        class Twice(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(3, 3)
                self.norm = nn.LayerNorm(3)

            def forward(self, x):
                return self.lin(self.norm(self.lin(x)))

        m = Twice()
        x = torch.randn(1, 2, 3)
        with self.D.Recorder(m) as rec:
            for step in (0, 1):
                rec.begin_step(step)
                m(x)
        names = [(e.step, e.name) for e in rec.entries]
        self.assertEqual(names, [(0, "lin"), (0, "norm"), (0, "lin(1)"), (1, "lin"), (1, "norm"), (1, "lin(1)")])
        self.assertEqual([e.order for e in rec.entries], list(range(6)))
        with torch.no_grad():
            first = m.lin(x)[0].numpy()
        np.testing.assert_allclose(rec.entries[0].data, first)
        self.assertFalse(np.allclose(rec.entries[2].data, first))  # not overwritten
        with self.D.Recorder(m, taps=[r"^lin$"]) as rec:  # taps match the name without (k)
            m(x)
        self.assertEqual([e.name for e in rec.entries], ["lin", "lin(1)"])

    def test_hooks_removed_and_functions_restored(self):
        import transformers.models.llama.modeling_llama as ML

        rope, eager = ML.apply_rotary_pos_emb, ML.eager_attention_forward
        self.D.run_dump(self.model, [1, 2], steps=0, taps=["nothing-matches"])
        self.assertIs(ML.apply_rotary_pos_emb, rope)
        self.assertIs(ML.eager_attention_forward, eager)
        self.assertEqual(sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in self.model.modules()), 0)

    def test_names_and_shapes(self):
        T = len(self.prompt)
        expect = {
            "model.embed_tokens": [T, 32], "model.layers.0.input_layernorm": [T, 32],
            "model.layers.0.self_attn.q_proj": [T, 32], "model.layers.0.self_attn.k_proj": [T, 16],
            "model.layers.0.self_attn.q_rope": [T, 32], "model.layers.0.self_attn.k_rope": [T, 16],
            "model.layers.0.self_attn.attn_probs": [4, T, T], "model.layers.0.self_attn.attn_output": [T, 32],
            "model.layers.0.self_attn.o_proj": [T, 32], "model.layers.0.self_attn": [T, 32],
            "model.layers.0.attn_residual": [T, 32], "model.layers.0.mlp.act_fn": [T, 48],
            "model.layers.0.mlp.act_mul": [T, 48], "model.layers.0.mlp": [T, 32], "model.layers.1": [T, 32],
            "model.norm": [T, 32], "lm_head": [T, 300],
        }
        for name, shape in expect.items():
            with self.subTest(name=name):
                self.assertEqual(list(self.by[(0, name)].shape), shape)
        for k in (1, 2):
            self.assertEqual(list(self.by[(k, "model.layers.1.self_attn.attn_probs")].shape), [4, 1, T + k])
            self.assertEqual(list(self.by[(k, "lm_head")].shape), [1, 300])
        self.assertFalse(any("(" in e.name for e in self.dumped.entries))
        self.assertEqual(self.dumped.missing, [])

    def test_execution_order(self):
        names = [e.name for e in self.dumped.entries if e.step == 0]
        idx = names.index
        self.assertLess(idx("model.embed_tokens"), idx("model.layers.0.input_layernorm"))
        for a, b in [("q_proj", "q_rope"), ("k_rope", "attn_probs"), ("attn_probs", "attn_output"),
                     ("attn_output", "o_proj")]:
            self.assertLess(idx(f"model.layers.0.self_attn.{a}"), idx(f"model.layers.0.self_attn.{b}"))
        self.assertLess(idx("model.layers.0.self_attn"), idx("model.layers.0.attn_residual"))
        self.assertLess(idx("model.layers.1"), idx("model.norm"))
        self.assertEqual(names[-1], "lm_head")
        orders = [e.order for e in self.dumped.entries]
        self.assertEqual(orders, list(range(len(orders))))

    def test_sub_op_values(self):
        by, L = self.by, "model.layers.1"
        s = lambda n: by[(0, f"{L}.{n}")].astype(np.float64)  # noqa: E731
        np.testing.assert_array_equal(s("self_attn"), s("self_attn.o_proj"))
        np.testing.assert_allclose(s("attn_residual"), by[(0, "model.layers.0")] + s("self_attn"), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(s("mlp.act_mul"), s("mlp.act_fn") * s("mlp.up_proj"), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s("self_attn.attn_probs").sum(-1), 1.0, rtol=1e-5)
        # attn_output[t, h*hd:(h+1)*hd] = probs[h, t] @ v[:, kv(h)]
        probs, v = s("self_attn.attn_probs"), s("self_attn.v_proj").reshape(-1, 2, 8)
        ref = np.stack([probs[h] @ v[:, h // 2] for h in range(4)], axis=1).reshape(len(self.prompt), 32)
        np.testing.assert_allclose(s("self_attn.attn_output"), ref, rtol=1e-4, atol=1e-5)
        # q_rope: split-half RoPE of q_proj at positions 0..T-1, theta 1e4, head_dim 8
        q = s("self_attn.q_proj").reshape(-1, 4, 8)
        inv = 1.0 / (10000.0 ** (np.arange(0, 8, 2) / 8))
        ang = np.arange(q.shape[0])[:, None] * inv[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]
        rot = np.concatenate([-q[..., 4:], q[..., :4]], -1)
        np.testing.assert_allclose(s("self_attn.q_rope"), (q * cos + rot * sin).reshape(q.shape[0], 32), rtol=1e-4, atol=1e-5)
        # token-0 invariant: token 0 attends to itself only
        self.assertAlmostEqual(float(probs[:, 0, 0].min()), 1.0, places=6)

    def test_decode_steps_match_a_full_forward(self):
        """Step k (KV cache, mask extended) equals the last row of one forward over prompt + fed tokens."""
        import torch

        seq = self.prompt + self.dumped.decode_tokens
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([seq])).logits[0]
        self.assertEqual(self.dumped.decode_tokens[0], int(torch.argmax(logits[len(self.prompt) - 1])))
        for k in (1, 2):
            np.testing.assert_allclose(self.by[(k, "lm_head")][0], logits[len(self.prompt) - 1 + k].numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(self.by[(0, "lm_head")], logits[: len(self.prompt)].numpy(), rtol=1e-5, atol=1e-5)

    def test_teacher_force_and_taps(self):
        run = self.D.run_dump(self.model, self.prompt, steps=2, teacher=[3, 4], taps=[r"^lm_head$", r"layers\.0\.self_attn\.q_rope"])
        self.assertEqual(run.decode_tokens, [3, 4])
        self.assertEqual([(e.step, e.name) for e in run.entries],
                         [(s, n) for s in (0, 1, 2) for n in ("model.layers.0.self_attn.q_rope", "lm_head")])
        with self.assertRaises(ValueError):
            self.D.run_dump(self.model, self.prompt, steps=3, teacher=[1])

    def test_native_bf16_kept_raw(self):
        import torch

        m = tiny_llama(layers=1).to(torch.bfloat16)
        run = self.D.run_dump(m, [1, 2, 3], taps=[r"^model\.norm$"], native=True)
        (e,) = run.entries
        self.assertEqual((e.dtype, e.data.dtype, list(e.data.shape)), ("bf16", np.uint16, [3, 32]))
        run32 = self.D.run_dump(m, [1, 2, 3], taps=[r"^model\.norm$"], native=False)
        np.testing.assert_array_equal(F.bf16_bits_to_f32(e.data), run32.entries[0].data)


@unittest.skipUnless(HAVE_TORCH, "torch/transformers not installed")
class SoftCapHookTests(unittest.TestCase):
    """Gemma 2: ``lm_head`` is its module's (uncapped) output; ``logits``, recorded from the root's
    output after it, is the model output soft-capped by ``final_logit_softcapping``."""

    def test_gemma2_logits_are_lm_head_soft_capped(self):
        import torch
        from transformers import Gemma2Config, Gemma2ForCausalLM

        from loupe_reference import dump as D

        torch.manual_seed(0)
        cfg = Gemma2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                           query_pre_attn_scalar=8, attn_logit_softcapping=3.0, final_logit_softcapping=0.2)
        m = Gemma2ForCausalLM(cfg).to(torch.float32).eval()
        m.config._attn_implementation = "eager"
        run = D.run_dump(m, [5, 17, 42, 7, 99, 3], steps=1)
        by = {(e.step, e.name): e for e in run.entries}
        for step in (0, 1):
            head, logits = by[(step, "lm_head")], by[(step, "logits")]
            self.assertLess(head.order, logits.order)
            self.assertEqual(logits.axes, ["token", "vocab"])
            np.testing.assert_allclose(logits.data, 0.2 * np.tanh(head.data / 0.2), rtol=1e-5, atol=1e-6)
            self.assertGreater(np.abs(head.data).max(), 0.2, "the cap does not bite")
        # Without final soft-capping there is nothing to record beside lm_head.
        cfg.final_logit_softcapping = None
        names = {e.name for e in D.run_dump(m, [5, 17], steps=0).entries}
        self.assertIn("lm_head", names)
        self.assertNotIn("logits", names)


@unittest.skipUnless(HAVE_TORCH, "torch/transformers not installed")
class MoeRouterDumpTests(unittest.TestCase):
    """MoE routers return ``(logits, weights, indices)``: ``mlp.gate`` records the logits (the
    hook's element 0), ``mlp.gate.top_k_index`` / ``.top_k_weights`` the chosen experts sorted by
    id as float32 and their weights in the same order; the shared experts' ``act_mul`` is the
    input of their ``down_proj``."""

    def _check(self, m, n_experts, top_k, layer, shared):
        import torch

        from loupe_reference import dump as D

        m.config._attn_implementation = "eager"
        ids = [5, 17, 42, 7, 99, 3, 11, 60]
        run = D.run_dump(m, ids, steps=1)
        by = {(e.step, e.name): e for e in run.entries}
        p = f"model.layers.{layer}.mlp"
        gate = m.model.layers[layer].mlp.gate
        with torch.no_grad():
            x = by[(0, f"model.layers.{layer}.post_attention_layernorm")].data
            logits, weights, indices = gate(torch.from_numpy(x))
        np.testing.assert_allclose(by[(0, p + ".gate")].data, logits.numpy(), rtol=1e-6, atol=1e-6)
        idx, w = by[(0, p + ".gate.top_k_index")], by[(0, p + ".gate.top_k_weights")]
        self.assertEqual((idx.data.shape, idx.data.dtype, idx.axes), ((len(ids), top_k), np.float32, ["token", "expert"]))
        self.assertTrue((np.diff(idx.data, axis=-1) > 0).all(), "ids ascending per token")
        for t in range(len(ids)):
            want = sorted(zip(indices[t].tolist(), weights[t].tolist()))
            self.assertEqual(idx.data[t].tolist(), [float(i) for i, _ in want])
            np.testing.assert_allclose(w.data[t], [v for _, v in want], rtol=1e-6)
        self.assertIn((1, p + ".gate.top_k_index"), by)
        self.assertEqual((p + ".shared_experts.act_mul" in {e.name for e in run.entries}), shared)

    def test_qwen3_moe_router(self):
        import torch
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        torch.manual_seed(0)
        cfg = Qwen3MoeConfig(vocab_size=300, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1])
        self._check(Qwen3MoeForCausalLM(cfg).to(torch.float32).eval(), 4, 2, 0, shared=False)

    def test_glm4_moe_router(self):
        import torch
        from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

        torch.manual_seed(0)
        cfg = Glm4MoeConfig(vocab_size=300, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1)
        self._check(Glm4MoeForCausalLM(cfg).to(torch.float32).eval(), 8, 3, 1, shared=True)


@unittest.skipUnless(HAVE_TORCH, "torch/transformers not installed")
class MoeTinyConfigTests(unittest.TestCase):
    """make-tiny --family qwen3_moe / glm4_moe: the configs the Rust end-to-end tests rely on."""

    def test_tiny_moe_configs(self):
        import torch

        from loupe_reference import fixtures as X

        q = X.tiny_config(300, False, "none", 2, 1, 2, family="qwen3_moe")
        self.assertEqual((q.num_experts, q.num_experts_per_tok, q.mlp_only_layers, q.norm_topk_prob), (8, 2, [1], True))
        g = X.tiny_config(300, False, "none", 2, 1, 2, family="glm4_moe")
        self.assertEqual((g.n_routed_experts, g.n_group, g.topk_group, g.n_shared_experts, g.first_k_dense_replace,
                          g.routed_scaling_factor, g.use_qk_norm, g.attention_bias),
                         (8, 4, 2, 1, 1, 2.5, True, True))
        self.assertEqual(g.rope_parameters["partial_rotary_factor"], 1.0)
        for cfg, sparse, dense in ((q, 0, 1), (g, 1, 0)):
            _, model_cls = X._family_classes(cfg.model_type)
            with torch.device("meta"):
                names = set(model_cls(cfg).state_dict())
            self.assertIn(f"model.layers.{sparse}.mlp.gate.weight", names)
            self.assertIn(f"model.layers.{dense}.mlp.gate_proj.weight", names)
        with self.assertRaises(X.InputError):
            X.tiny_config(300, False, "llama3", 2, 1, 2, family="glm4_moe")


@unittest.skipUnless(HAVE_TORCH, "torch/transformers not installed")
class ConfigDumpCliTests(unittest.TestCase):
    """``dump --config`` end to end (random weights, byte tokenizer): files, manifest, styles."""

    def run_cli(self, *argv):
        """cli.main in this process (torch is imported once): (returncode, stdout, stderr)."""
        import contextlib
        import types

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["dump", *argv])
        return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())

    def test_config_dump(self):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = {"model_type": "llama", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 48,
                   "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            out = os.path.join(tmp, "d")
            p = self.run_cli("--config", path, "--seed", "3", "--prompt", "hi!", "--layers", "2", "--steps", "1",
                             "--taps", r"^model\.layers\.1$", "lm_head", "-o", out, "--style", "max")
            self.assertEqual(p.returncode, 0, p.stderr)
            m = read_json(os.path.join(out, "manifest.json"))
            self.assertEqual(m["prompt_tokens"], [104, 105, 33])  # one id per UTF-8 byte
            self.assertEqual((m["layers"], m["seed"], m["source"], m["precision"]), (2, 3, "config", "f32"))
            self.assertEqual([(t["step"], t["name"]) for t in m["tensors"]],
                             [(0, "model.layers.1"), (0, "lm_head"), (1, "model.layers.1"), (1, "lm_head")])
            for t in m["tensors"]:
                key, code, shape, _ = F.read_max_file(read_bytes(os.path.join(out, t["file"])))
                self.assertEqual((key, code, shape), (t["name"], 81, t["shape"]))
            # same seed -> same numbers; layer 2 does not exist
            p = self.run_cli("--config", path, "--seed", "3", "--prompt", "hi!", "--taps", "model.layers.2$", "--style", "full")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("model.layers.2 = tensor<", p.stdout)
            p = self.run_cli("--config", path, "--prompt", "hi!", "--layers", "4")
            self.assertEqual(p.returncode, 2)
            self.assertIn("only 3 layers", p.stderr)
            p = self.run_cli("--config", path, "--prompt", "hi!", "--chat")
            self.assertEqual(p.returncode, 2)

    def test_calibration_dtypes(self):
        """--dtype f64/f16/bf16: the same weights computed at that precision, stored as float32, the
        manifest naming the precision; the disagreement with f32 is ordered by the precisions."""
        with tempfile.TemporaryDirectory() as tmp:
            cfg = {"model_type": "llama", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 48,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            runs = {}
            for d in ("f32", "f64", "f16", "bf16"):
                out = os.path.join(tmp, d)
                p = self.run_cli("--config", path, "--seed", "3", "--prompt", "hello there", "--dtype", d,
                                 "--taps", r"^model\.layers\.1$", "-o", out)
                self.assertEqual(p.returncode, 0, p.stderr)
                m = read_json(os.path.join(out, "manifest.json"))
                self.assertEqual((m["precision"], m["dtype"]), (d, d))
                t = m["tensors"][0]
                self.assertEqual(t["dtype"], "f32")
                runs[d] = np.load(os.path.join(out, t["file"])).astype(np.float64)

            def rel(d):
                a = runs[d] - runs["f32"]
                return float(np.sqrt((a * a).sum() / (runs["f32"] ** 2).sum()))

            self.assertLess(rel("f64"), 1e-5)
            self.assertGreater(rel("f64"), 0.0)
            self.assertLess(rel("f64"), rel("f16"))
            self.assertLess(rel("f16"), rel("bf16"))
            self.assertLess(rel("bf16"), 0.1)


@unittest.skipUnless(HAVE_TORCH, "torch/transformers not installed")
class SavePtTests(unittest.TestCase):
    def test_fixtures_roundtrip(self):
        import torch

        from loupe_reference import fixtures

        with tempfile.TemporaryDirectory() as tmp:
            exp = fixtures.save_pt(tmp)
            self.assertEqual(read_json(os.path.join(tmp, "expected.json")), exp)
            for name, spec in exp["files"].items():
                path = os.path.join(tmp, name)
                if name.endswith(".pt"):
                    obj = torch.load(path, weights_only=True)
                    if spec["kind"] == "tensor":
                        obj = {"": obj}
                    elif spec["kind"] == "list":
                        obj = {str(i): t for i, t in enumerate(obj)}
                    for key, rec in spec["tensors"].items():
                        t = obj[key]
                        self.assertEqual(list(t.shape), rec["shape"])
                        vals = t.contiguous().reshape(-1).to(torch.float64 if t.is_floating_point() else torch.int64).tolist()
                        self.assertEqual(vals, rec["values"])
                elif name.endswith(".npy"):
                    a = np.load(path)
                    self.assertEqual(list(a.shape), spec["tensors"][""]["shape"])
                    self.assertEqual(a.reshape(-1).astype(np.float64).tolist(), [float(v) for v in spec["tensors"][""]["values"]])
            self.assertEqual(exp["files"]["noncontig.pt"]["tensors"][""]["stride"], [2, 6])
            self.assertTrue(exp["files"]["fortran.npy"]["tensors"][""]["fortran_order"])
            self.assertEqual(exp["files"]["state_dict.pt"]["tensors"]["ids_i64"]["values"][3], 2**62 + 3)


@unittest.skipUnless(SLOW, "set LOUPE_REFERENCE_SLOW=1 and LOUPE_MODEL to run the model-backed tests")
class SlowModelTests(unittest.TestCase):
    def test_gguf_dump_two_layers(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "d")
            p = subprocess.run([sys.executable, "-m", "loupe_reference", "dump", "--gguf", os.environ["LOUPE_MODEL"],
                                "--chat", "--prompt", "What is the capital of France?", "--layers", "2", "-o", out],
                               cwd=str(REFERENCE), env=ENV, capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stderr)
            m = read_json(os.path.join(out, "manifest.json"))
            names = {t["name"] for t in m["tensors"]}
            self.assertIn("model.layers.1", names)
            self.assertNotIn("model.layers.2", names)
            self.assertEqual(m["prompt_tokens"][0], 1)
            lm = [t for t in m["tensors"] if t["name"] == "lm_head"][0]
            self.assertEqual(lm["shape"], [len(m["prompt_tokens"]), 49152])
            self.assertEqual(len(m["model"]["sha256"]), 64)

    def test_make_tiny_loads_and_generates(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "tiny")
            p = subprocess.run([sys.executable, "-m", "loupe_reference", "make-tiny", "--out", out, "--tie",
                                "--tokenizer-gguf", os.environ["LOUPE_MODEL"]], cwd=str(REFERENCE), env=ENV,
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
                self.assertTrue(os.path.isfile(os.path.join(out, f)), f)
            cfg = read_json(os.path.join(out, "config.json"))
            self.assertEqual((cfg["hidden_size"], cfg["num_key_value_heads"], cfg["vocab_size"], cfg["tie_word_embeddings"]),
                             (64, 2, 49152, True))
            p = subprocess.run([sys.executable, "-m", "loupe_reference", "generate", "--hf-dir", out, "--prompt",
                                "The quick brown fox", "--max-tokens", "8", "--json"], cwd=str(REFERENCE), env=ENV,
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            toks = json.loads(p.stdout.splitlines()[-1])["tokens"]
            self.assertEqual(len(toks), 8)
            self.assertGreater(len(set(toks)), 4)  # not degenerate


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(HAVE_TORCH, "torch/transformers not installed")
class Phi3HookTests(unittest.TestCase):
    """Phi-3: the fused projections and ``mlp.activation_fn`` are recorded under their module
    paths; ``q_rope`` turns only the first ``rotary_dim`` dims of each head (partial rotary) and
    passes the rest of ``qkv_proj``'s q columns through; LongRoPE picks the short or long factors
    per forward call by its last position (``longrope_frequency_update``), with cos and sin
    scaled by the attention factor — what loupe's RoPE table mirrors."""

    def test_fused_projections_partial_rotary_and_longrope_switch(self):
        import math

        import torch
        from transformers import Phi3Config, Phi3ForCausalLM

        from loupe_reference import dump as D

        heads, kv, hd, inter, orig, theta = 4, 2, 8, 24, 4, 10000.0
        short, long = [1.0, 1.5], [3.0, 20.0]
        cfg = Phi3Config(vocab_size=300, hidden_size=heads * hd, intermediate_size=inter, num_hidden_layers=1,
                         num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=64,
                         original_max_position_embeddings=orig, pad_token_id=None,
                         rope_parameters={"rope_type": "longrope", "rope_theta": theta, "partial_rotary_factor": 0.5,
                                          "short_factor": short, "long_factor": long})
        torch.manual_seed(0)
        m = Phi3ForCausalLM(cfg).to(torch.float32).eval()
        m.config._attn_implementation = "eager"
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0, 0.3)
        run = D.run_dump(m, [5, 17, 42], steps=2)  # positions 0-2, then 3, then 4 (past orig)
        by = {(e.step, e.name): e.data for e in run.entries}
        af = math.sqrt(1 + math.log(64 / orig) / math.log(orig))
        rot = hd // 2
        for step, first, factors in ((0, 0, short), (1, 3, short), (2, 4, long)):
            qkv = by[(step, "model.layers.0.self_attn.qkv_proj")]
            self.assertEqual(qkv.shape[1], (heads + 2 * kv) * hd)
            q_rope = by[(step, "model.layers.0.self_attn.q_rope")]
            inv = [1.0 / (f * theta ** (2 * i / rot)) for i, f in enumerate(factors)]
            for t in range(q_rope.shape[0]):
                pos = first + t
                for h in range(heads):
                    q = qkv[t, h * hd:(h + 1) * hd].astype(np.float64)
                    want = q.copy()
                    for i in range(rot // 2):
                        c, s = math.cos(pos * inv[i]) * af, math.sin(pos * inv[i]) * af
                        a, b = q[i], q[i + rot // 2]
                        want[i], want[i + rot // 2] = a * c - b * s, b * c + a * s
                    np.testing.assert_allclose(q_rope[t, h * hd:(h + 1) * hd], want, rtol=1e-4, atol=1e-5,
                                               err_msg=f"step {step} token {t} head {h}")
                    np.testing.assert_array_equal(q_rope[t, h * hd + rot:(h + 1) * hd], qkv[t, h * hd + rot:(h + 1) * hd])
            # The parts of the fused projections, recorded as Phi3Attention / Phi3MLP slice them.
            for part, cols in (("q", slice(0, heads * hd)), ("k", slice(heads * hd, (heads + kv) * hd)), ("v", slice((heads + kv) * hd, None))):
                np.testing.assert_array_equal(by[(step, f"model.layers.0.self_attn.qkv_proj.{part}")], qkv[:, cols])
            gate_up = by[(step, "model.layers.0.mlp.gate_up_proj")]
            np.testing.assert_array_equal(by[(step, "model.layers.0.mlp.gate_up_proj.gate")], gate_up[:, :inter])
            np.testing.assert_array_equal(by[(step, "model.layers.0.mlp.gate_up_proj.up")], gate_up[:, inter:])
            act = by[(step, "model.layers.0.mlp.activation_fn")]
            self.assertEqual(gate_up.shape[1], 2 * inter)
            np.testing.assert_allclose(act, gate_up[:, :inter] / (1 + np.exp(-gate_up[:, :inter])), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(by[(step, "model.layers.0.mlp.act_mul")], gate_up[:, inter:] * act, rtol=1e-5, atol=1e-6)
