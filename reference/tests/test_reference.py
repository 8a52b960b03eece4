"""Light tests of loupe_reference: prompt building, CLI surface, JSON and golden schema.

Run: python -m unittest discover -s reference/tests     (no torch import, about a second)
Slow, model-backed checks run only with LOUPE_REFERENCE_SLOW=1 and LOUPE_MODEL=<path to the GGUF>.
"""

import io
import json
import os
import subprocess
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFERENCE = HERE.parent
REPO = REFERENCE.parent
GOLDEN_DIR = REPO / "tests" / "golden" / "smollm2-q4_1"
sys.path.insert(0, str(REFERENCE))

from loupe_reference import cli, golden, prompts  # noqa: E402


class FakeBatchEncoding(dict):
    """What transformers 5 returns from apply_chat_template(tokenize=True)."""


class FakeTokenizer:
    def __init__(self, chat_returns_dict=True):
        self.chat_returns_dict = chat_returns_dict
        self.calls = []

    def __call__(self, text):
        self.calls.append(("raw", text))
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        self.calls.append(("chat", messages, add_generation_prompt, tokenize))
        ids = [1] + [len(m["content"]) for m in messages] + [2]
        if not tokenize:
            return "|".join(f"{m['role']}:{m['content']}" for m in messages)
        return FakeBatchEncoding(input_ids=ids, attention_mask=[1] * len(ids)) if self.chat_returns_dict else ids


class PromptTests(unittest.TestCase):
    def test_messages_without_system_only_user(self):
        self.assertEqual(prompts.build_messages("hi"), [{"role": "user", "content": "hi"}])

    def test_messages_with_system_first(self):
        self.assertEqual(
            prompts.build_messages("hi", "be terse"),
            [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"}],
        )

    def test_empty_system_is_still_a_system_message(self):
        self.assertEqual(prompts.build_messages("hi", "")[0], {"role": "system", "content": ""})

    def test_raw_uses_tokenizer_call(self):
        tok = FakeTokenizer()
        self.assertEqual(prompts.build_prompt_ids(tok, "ab", chat=False), [97, 98])
        self.assertEqual(tok.calls, [("raw", "ab")])

    def test_chat_uses_template_with_generation_prompt(self):
        for as_dict in (True, False):
            tok = FakeTokenizer(chat_returns_dict=as_dict)
            ids = prompts.build_prompt_ids(tok, "abc", chat=True, system="xy")
            self.assertEqual(ids, [1, 2, 3, 2])
            kind, messages, add_gen, tokenize = tok.calls[0]
            self.assertEqual(kind, "chat")
            self.assertTrue(add_gen)
            self.assertTrue(tokenize)
            self.assertEqual([m["role"] for m in messages], ["system", "user"])

    def test_system_needs_chat(self):
        with self.assertRaises(ValueError):
            prompts.build_prompt_ids(FakeTokenizer(), "a", chat=False, system="s")

    def test_batched_ids_are_flattened(self):
        self.assertEqual(prompts._as_id_list({"input_ids": [[5, 6]]}), [5, 6])
        with self.assertRaises(ValueError):
            prompts._as_id_list([[1], [2]])

    def test_parse_token_list(self):
        self.assertEqual(prompts.parse_token_list("1,2, 3"), [1, 2, 3])
        self.assertEqual(prompts.parse_token_list(""), [])
        self.assertEqual(prompts.parse_token_list("7,"), [7])
        for bad in ("a,b", "1;2", "-1"):
            with self.assertRaises(ValueError):
                prompts.parse_token_list(bad)

    def test_json_line_is_one_utf8_line(self):
        obj = {"prompt_tokens": [1, 2], "tokens": [3], "text": "caf\u00e9\nline two \u2014 \U0001F30A"}
        line = prompts.dumps_line(obj)
        self.assertNotIn("\n", line)
        self.assertEqual(json.loads(line), obj)
        raw = io.BytesIO()
        stream = io.TextIOWrapper(raw, encoding="ascii")
        prompts.write_json_line(obj, stream)
        self.assertEqual(json.loads(raw.getvalue().decode("utf-8")), obj)


class CliTests(unittest.TestCase):
    def parse(self, *argv):
        return cli.build_parser().parse_args(list(argv))

    def test_generate_args(self):
        a = self.parse("generate", "--gguf", "m.gguf", "--prompt", "p", "--chat", "--system", "s",
                       "--max-tokens", "5", "--json")
        self.assertEqual((a.command, a.gguf, a.hf_dir, a.prompt, a.chat, a.system, a.max_tokens, a.json),
                         ("generate", "m.gguf", None, "p", True, "s", 5, True))
        self.assertEqual(a.threads, 2)

    def test_generate_defaults(self):
        a = self.parse("generate", "--hf-dir", "d", "--prompt", "p")
        self.assertEqual((a.max_tokens, a.json, a.chat, a.system), (64, False, False, None))

    def test_teacher_force_args(self):
        a = self.parse("teacher-force", "--gguf", "m", "--prompt", "p", "--tokens", "1,2", "--top-logits", "3")
        self.assertEqual((a.tokens, a.top_logits), ("1,2", 3))

    def test_usage_errors_exit_2(self):
        bad = [
            ["generate", "--prompt", "p"],                                   # no model
            ["generate", "--gguf", "a", "--hf-dir", "b", "--prompt", "p"],   # two models
            ["teacher-force", "--gguf", "a", "--prompt", "p"],               # no --tokens
            ["frobnicate"],
        ]
        for argv in bad:
            with self.subTest(argv=argv), self.assertRaises(SystemExit) as cm:
                with open(os.devnull, "w") as devnull:
                    old, sys.stderr = sys.stderr, devnull
                    try:
                        self.parse(*argv)
                    finally:
                        sys.stderr = old
            self.assertEqual(cm.exception.code, 2)

    def test_bad_input_is_exit_2_with_one_line(self):
        cases = [
            ["generate", "--gguf", "/nonexistent/model.gguf", "--prompt", "p"],
            ["generate", "--gguf", "/nonexistent/model.gguf", "--prompt", "p", "--system", "s"],  # no --chat
            ["teacher-force", "--hf-dir", "/nonexistent", "--prompt", "p", "--tokens", "1,x"],
        ]
        for argv in cases:
            with self.subTest(argv=argv):
                proc = subprocess.run([sys.executable, "-m", "loupe_reference", *argv],
                                      cwd=str(REFERENCE), capture_output=True, text=True, timeout=60)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertEqual(proc.stdout, "")
                self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
                self.assertIn("error", proc.stderr)

    def test_offline_environment(self):
        import loupe_reference  # noqa: F401
        self.assertEqual(os.environ.get("HF_HUB_OFFLINE"), "1")
        self.assertEqual(os.environ.get("TRANSFORMERS_OFFLINE"), "1")


def load_goldens():
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(GOLDEN_DIR.glob("*.json"))}


@unittest.skipUnless(GOLDEN_DIR.is_dir(), "no goldens")
class GoldenTests(unittest.TestCase):
    def test_every_spec_has_a_file_and_back(self):
        names = {s.name for s in golden.GOLDEN_SPECS}
        self.assertEqual(set(load_goldens()), names)
        self.assertGreaterEqual(len(names), 6)

    def test_schema_and_consistency(self):
        specs = {s.name: s for s in golden.GOLDEN_SPECS}
        for name, rec in load_goldens().items():
            with self.subTest(golden=name):
                self.assertEqual(golden.validate_record(rec), [])
                self.assertEqual(rec["name"], name)
                spec = specs[name]
                self.assertEqual((rec["prompt"], rec["chat"], rec["system"], rec["max_tokens"]),
                                 (spec.prompt, spec.chat, spec.system, spec.max_tokens))
                p = len(rec["prompt_tokens"])
                # teacher-forced argmax at the positions that predict generated tokens equals them
                self.assertEqual(rec["argmax"][p - 1 : p - 1 + len(rec["tokens"])], rec["tokens"])
                eos = rec["eos_token_ids"]
                stopped = bool(rec["tokens"]) and rec["tokens"][-1] in eos
                self.assertEqual(rec["stopped_on_eos"], stopped)
                self.assertTrue(stopped or len(rec["tokens"]) == rec["max_tokens"])
                self.assertNotIn(True, [t in eos for t in rec["tokens"][:-1]])
                self.assertEqual(len(rec["argmax_margins"]), len(rec["argmax"]))
                self.assertEqual(len(rec["runner_up"]), len(rec["tokens"]))
                if rec["chat"]:
                    self.assertEqual(rec["prompt_tokens"][0], 1)  # <|im_start|>

    def test_all_goldens_share_model_and_stack(self):
        recs = list(load_goldens().values())
        self.assertEqual(len({r["model_sha256"] for r in recs}), 1)
        self.assertEqual(len({json.dumps(r["generator"], sort_keys=True) for r in recs}), 1)

    def test_no_fragile_near_ties(self):
        for name, rec in load_goldens().items():
            with self.subTest(golden=name):
                self.assertGreaterEqual(min(rec["margins"] + rec["argmax_margins"]), 1e-4)

    def test_a_long_prompt_exists(self):
        self.assertTrue(any(len(r["prompt_tokens"]) >= 250 for r in load_goldens().values()))

    def test_dumps_golden_roundtrip(self):
        rec = next(iter(load_goldens().values()))
        self.assertEqual(json.loads(golden.dumps_golden(rec)), rec)
        self.assertEqual(golden.diff_records(rec, rec), [])
        changed = dict(rec, tokens=rec["tokens"][:-1])
        self.assertIn("tokens: differs", golden.diff_records(rec, changed))


SLOW = os.environ.get("LOUPE_REFERENCE_SLOW") == "1" and os.path.isfile(os.environ.get("LOUPE_MODEL", ""))


@unittest.skipUnless(SLOW, "set LOUPE_REFERENCE_SLOW=1 and LOUPE_MODEL to run the model-backed tests")
class ModelBackedTests(unittest.TestCase):
    def run_cli(self, *argv):
        proc = subprocess.run([sys.executable, "-m", "loupe_reference", *argv], cwd=str(REFERENCE),
                              capture_output=True, timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stderr.decode("utf-8", "replace"))
        lines = proc.stdout.decode("utf-8").splitlines()
        self.assertEqual(len(lines), 1)
        return json.loads(lines[0])

    def test_generate_matches_golden_prefix(self):
        rec = load_goldens()["raw-quick-brown-fox"]
        out = self.run_cli("generate", "--gguf", os.environ["LOUPE_MODEL"], "--prompt", rec["prompt"],
                           "--max-tokens", "8", "--json")
        self.assertEqual(set(out), {"prompt_tokens", "tokens", "text"})
        self.assertEqual(out["prompt_tokens"], rec["prompt_tokens"])
        self.assertEqual(out["tokens"], rec["tokens"][:8])

    def test_teacher_force_matches_golden(self):
        rec = load_goldens()["chat-capital-france"]
        out = self.run_cli("teacher-force", "--gguf", os.environ["LOUPE_MODEL"], "--chat", "--prompt", rec["prompt"],
                           "--tokens", ",".join(map(str, rec["tokens"])), "--top-logits", "2")
        self.assertEqual(out["prompt_tokens"], rec["prompt_tokens"])
        self.assertEqual(out["argmax"], rec["argmax"])
        self.assertEqual(len(out["top_logits"]), len(rec["argmax"]))
        self.assertEqual([row[0][0] for row in out["top_logits"]], rec["argmax"])


if __name__ == "__main__":
    unittest.main()
