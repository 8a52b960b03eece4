"""Command line: ``python -m loupe_reference <subcommand> ...``.

Subcommands:
  generate       greedy generation (what HF ``generate(do_sample=False)`` produces)
  teacher-force  argmax of the logits at every position of prompt + given tokens
  export-hf      write the model as a local HF checkpoint directory (for --hf-dir tests)

Exit codes follow loupe's: 0 success, 2 bad usage or bad input (one line on stderr).
New subcommands (``dump``) register themselves in ``build_parser`` beside these.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import loupe_reference  # noqa: F401  (offline environment first)
from loupe_reference import prompts

PROG = "python -m loupe_reference"


def add_model_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", metavar="PATH", help="GGUF model file")
    src.add_argument("--hf-dir", metavar="DIR", help="local Hugging Face checkpoint (config.json, safetensors, tokenizer.json)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--verbose", action="store_true", help="show transformers' logs and progress bars, and timings")


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (the user message with --chat)")
    src.add_argument("--prompt-file", metavar="PATH", help="read the prompt text from a UTF-8 file")
    p.add_argument("--chat", action="store_true", help="wrap the prompt with the model's chat template")
    p.add_argument("--system", metavar="TEXT", default=None, help="system message (needs --chat)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="PyTorch/transformers reference for loupe parity")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    g = sub.add_parser("generate", help="greedy generation", description="Greedy generation as HF generate(do_sample=False).")
    add_model_args(g)
    add_prompt_args(g)
    g.add_argument("--max-tokens", type=int, default=64, help="max new tokens (default 64)")
    g.add_argument("--json", action="store_true", help='print one JSON line {"prompt_tokens", "tokens", "text"}')
    g.set_defaults(func=cmd_generate)

    t = sub.add_parser(
        "teacher-force",
        help="argmax at every position of prompt + tokens",
        description="One forward pass over prompt + tokens; prints JSON {prompt_tokens, argmax[, top_logits]}.",
    )
    add_model_args(t)
    add_prompt_args(t)
    t.add_argument("--tokens", required=True, help='comma-separated ids appended to the prompt, e.g. "1,2,3" ("" for none)')
    t.add_argument("--top-logits", type=int, default=0, metavar="K", help="also print the top K [id, logit] pairs per position")
    t.set_defaults(func=cmd_teacher_force)

    e = sub.add_parser(
        "export-hf",
        help="write the model as a local HF checkpoint directory",
        description="Write the loaded model as an HF directory (f32 model.safetensors, config.json, tokenizer.json, "
        "chat_template.jinja). --hf-dir on that directory reproduces the GGUF's outputs.",
    )
    add_model_args(e)
    e.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory (created)")
    e.set_defaults(func=cmd_export_hf)
    return parser


def _prompt_text(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    with open(args.prompt_file, "r", encoding="utf-8") as f:
        return f.read()


def _check_model_path(args: argparse.Namespace) -> None:
    """Fail fast (exit 2) on a missing model, before torch and transformers are imported."""
    if args.gguf is not None and not os.path.isfile(args.gguf):
        raise ValueError(f"{args.gguf}: no such file")
    if args.hf_dir is not None and not os.path.isfile(os.path.join(args.hf_dir, "config.json")):
        raise ValueError(f"{args.hf_dir}: not a Hugging Face checkpoint directory (no config.json)")


def _load(args: argparse.Namespace):
    _check_model_path(args)
    from loupe_reference import model as M

    M.configure_torch(args.threads)
    t0 = time.perf_counter()
    ref = M.load(gguf=args.gguf, hf_dir=args.hf_dir, verbose=args.verbose)
    if args.verbose:
        print(f"loupe_reference: loaded {ref.path} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return ref


def cmd_generate(args: argparse.Namespace) -> int:
    if args.system is not None and not args.chat:
        raise ValueError("--system needs --chat")
    if args.max_tokens < 0:
        raise ValueError("--max-tokens must be >= 0")
    text = _prompt_text(args)
    ref = _load(args)
    from loupe_reference import model as M

    ids = prompts.build_prompt_ids(ref.tokenizer, text, args.chat, args.system)
    t0 = time.perf_counter()
    gen = M.generate(ref, ids, args.max_tokens)
    if args.verbose:
        dt = time.perf_counter() - t0
        print(f"loupe_reference: {len(ids)} prompt tokens, {len(gen.tokens)} generated in {dt:.2f}s", file=sys.stderr)
    if args.json:
        prompts.write_json_line({"prompt_tokens": ids, "tokens": gen.tokens, "text": gen.text})
    else:
        sys.stdout.write(gen.text + "\n")
        sys.stdout.flush()
    return 0


def cmd_teacher_force(args: argparse.Namespace) -> int:
    if args.system is not None and not args.chat:
        raise ValueError("--system needs --chat")
    tokens = prompts.parse_token_list(args.tokens)
    text = _prompt_text(args)
    ref = _load(args)
    from loupe_reference import model as M

    ids = prompts.build_prompt_ids(ref.tokenizer, text, args.chat, args.system)
    vocab = ref.model.config.vocab_size
    bad = [t for t in tokens if t >= vocab]
    if bad:
        raise ValueError(f"--tokens: id {bad[0]} is out of range (vocab size {vocab})")
    tf = M.teacher_force(ref, ids, tokens, top_k=args.top_logits)
    out = {"prompt_tokens": ids, "argmax": tf.argmax}
    if tf.top_logits is not None:
        out["top_logits"] = tf.top_logits
    prompts.write_json_line(out)
    return 0


def cmd_export_hf(args: argparse.Namespace) -> int:
    if os.path.exists(os.path.join(args.output, "config.json")):
        raise ValueError(f"{args.output}: already holds a checkpoint (config.json); choose an empty directory")
    ref = _load(args)
    from loupe_reference import model as M

    files = M.export_hf(ref, args.output)
    print(f"loupe_reference: wrote {', '.join(files)} to {args.output}", file=sys.stderr)
    print(os.path.abspath(args.output))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from loupe_reference import InputError

    try:
        return int(args.func(args) or 0)
    except (InputError, ValueError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
