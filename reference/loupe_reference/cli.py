"""Command line: ``python -m loupe_reference <subcommand> ...``.

Subcommands:
  generate       greedy generation (what HF ``generate(do_sample=False)`` produces)
  teacher-force  argmax of the logits at every position of prompt + given tokens
  export-hf      write the model as a local HF checkpoint directory (for --hf-dir tests)
  dump           named activations (forward hooks) in loupe's dump layout, or printed
  make-tiny      write a tiny random Llama checkpoint (HF directory) for fast tests
  save-pt        write torch.save / numpy.save fixtures plus expected.json for loupe's readers

Exit codes follow loupe's: 0 success, 2 bad usage or bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import loupe_reference  # noqa: F401  (offline environment first)
from loupe_reference import prompts

PROG = "python -m loupe_reference"
DUMP_DTYPES = ("f32", "native", "f64", "f16", "bf16")
# --dtype values that compute in another torch dtype (stored as float32).
COMPUTE_DTYPES = {"f64": "float64", "f16": "float16", "bf16": "bfloat16"}


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

    em = sub.add_parser(
        "embed",
        help="sentence embeddings of an encoder checkpoint (sentence-transformers' pipeline)",
        description="Embed each text as sentence-transformers does with the directory's modules.json: "
        "tokenize with truncation at max_seq_length, BertModel's last hidden state, pooling, Normalize. "
        'Prints JSON {"embeddings": [[...], ...], "tokens": [...]}.',
    )
    em.add_argument("--hf-dir", required=True, metavar="DIR", help="encoder checkpoint directory (BertModel)")
    em.add_argument("texts", nargs="+", help="texts to embed")
    em.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    em.set_defaults(func=cmd_embed)

    e = sub.add_parser(
        "export-hf",
        help="write the model as a local HF checkpoint directory",
        description="Write the loaded model as an HF directory (f32 model.safetensors, config.json, tokenizer.json, "
        "chat_template.jinja). --hf-dir on that directory reproduces the GGUF's outputs.",
    )
    add_model_args(e)
    e.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory (created)")
    e.set_defaults(func=cmd_export_hf)

    from loupe_reference.dumpfmt import STYLES

    d = sub.add_parser(
        "dump",
        help="dump named activations (loupe's dump layout)",
        description="Run the prompt (and optional decode steps) with forward hooks named by module path and "
        "write the tensors in loupe's dump layout (manifest.json + one file per tensor), or print them.",
    )
    src = d.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", metavar="PATH", help="GGUF model file")
    src.add_argument("--hf-dir", metavar="DIR", help="local Hugging Face checkpoint directory")
    src.add_argument("--config", metavar="CONFIG_JSON", help="a config.json: random weights from --seed")
    d.add_argument("--seed", type=int, default=None, help="with --config: torch.manual_seed before init (default 0)")
    d.add_argument("--tokenizer", metavar="PATH", default=None,
                   help="with --config: tokenizer from an HF directory or a GGUF file (default: one id per UTF-8 byte)")
    d.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    d.add_argument("--verbose", action="store_true", help="show transformers' logs and timings")
    add_prompt_args(d)
    d.add_argument("--layers", default="all", metavar="N|all",
                   help="keep the first N decoder layers (written into every layer-count key of the config)")
    d.add_argument("--taps", action="extend", nargs="+", metavar="REGEX", default=None,
                   help="keep tensors whose name matches any REGEX (re.search; repeatable); default all")
    d.add_argument("--steps", type=int, default=None, metavar="K",
                   help="also dump K decode steps with the KV cache (default 0, or the --teacher-force count)")
    d.add_argument("--teacher-force", metavar="IDS", default=None,
                   help="comma-separated ids fed at the decode steps instead of the greedy ones")
    d.add_argument("-o", "--output", metavar="DIR", default=None, help="output directory: new, empty, or an earlier dump (replaced)")
    d.add_argument("--style", choices=STYLES, default=None,
                   help="npy (default with -o), binary, max, compact (default without -o), full")
    d.add_argument("--precision", type=int, default=6, metavar="DIGITS", help="digits of --style full (default 6)")
    d.add_argument("--dtype", choices=DUMP_DTYPES, default="f32",
                   help="f32 (default): compute and store float32; native: the checkpoint's dtype, bf16 kept raw; "
                        "f64, f16, bf16: compute in that dtype, store float32 (the reference's own noise at another "
                        "precision, for loupe compare --calibrate)")
    d.set_defaults(func=cmd_dump)

    mt = sub.add_parser(
        "make-tiny",
        help="write a tiny random checkpoint directory of one family (--family)",
        description="A tiny random decoder of one family (--family; hidden 64, 4 heads, 2 KV heads, head_dim 16, "
        "intermediate 128, SmolLM2's vocabulary) as an HF directory: config.json, model.safetensors (f32), "
        "and the SmolLM2 tokenizer files.",
    )
    mt.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    mt.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    mt.add_argument("--tie", action="store_true", help="tie lm_head to embed_tokens")
    mt.add_argument("--rope-scaling", choices=("none", "llama3", "longrope", "dynamic"), default="none",
                    help="RoPE scaling (default none; longrope: phi3 only, original length 16; "
                         "dynamic: hunyuan_v1_moe only, NTK-alpha 1000)")
    mt.add_argument("--partial-rotary", type=float, default=None, metavar="F",
                    help="phi3: partial_rotary_factor (RoPE turns int(16 * F) of each head's 16 dims)")
    mt.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    mt.add_argument("--attention-bias", action="store_true", help="biases on q/k/v/o_proj (random)")
    mt.add_argument("--mlp-bias", action="store_true", help="biases on gate/up/down_proj (random)")
    mt.add_argument("--hidden-act", default="silu", metavar="ACT", help="MLP activation (default silu)")
    # The families make-tiny builds are fixtures.FAMILIES (one table; each family's tiny shape is in
    # fixtures.tiny_config).
    from loupe_reference.fixtures import FAMILIES
    mt.add_argument("--family", choices=FAMILIES, default="llama",
                    help="architecture (default llama, LlamaForCausalLM): the transformers class of that "
                    "model_type, in the tiny shape fixtures.tiny_config gives it")
    mt.add_argument("--sliding-window", type=int, default=None, metavar="N",
                    help="mistral: attention window in tokens (default: none); gemma3, gemma2: the even layers' "
                    "window (default 8)")
    mt.add_argument("--tokenizer-gguf", metavar="PATH", default=None,
                    help="GGUF whose tokenizer is saved (default $LOUPE_MODEL or loupe's cached SmolLM2)")
    mt.set_defaults(func=cmd_make_tiny)

    sp = sub.add_parser(
        "save-pt",
        help="write torch.save / numpy.save fixtures and expected.json",
        description="Small tensors written with torch.save (single tensor, state_dict of f32/f16/bf16/i64, "
        "non-contiguous view, shared storage, list) and numpy.save/savez, plus expected.json with their values.",
    )
    sp.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    sp.set_defaults(func=cmd_save_pt)
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


def _parse_layers(text: str) -> int | None:
    if text.strip().lower() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"--layers must be a positive integer or 'all', got {text!r}") from None
    if n < 1:
        raise ValueError(f"--layers must be >= 1 (or 'all'), got {n}")
    return n


def _validate_dump_args(args: argparse.Namespace) -> None:
    """Every usage error of ``dump`` that can be found before loading a model."""
    import re

    from loupe_reference.dumpfmt import FILE_STYLES

    if args.system is not None and not args.chat:
        raise ValueError("--system needs --chat")
    if args.config is None and (args.seed is not None or args.tokenizer is not None):
        raise ValueError("--seed and --tokenizer go with --config")
    if args.config is not None and not os.path.isfile(args.config):
        raise ValueError(f"{args.config}: no such file")
    if args.tokenizer is not None and not os.path.exists(args.tokenizer):
        raise ValueError(f"{args.tokenizer}: no such file or directory")
    args.layers_n = _parse_layers(args.layers)
    for t in args.taps or []:
        try:
            re.compile(t)
        except re.error as e:
            raise ValueError(f"--taps {t!r}: bad regular expression ({e})") from None
    args.teacher = prompts.parse_token_list(args.teacher_force) if args.teacher_force is not None else None
    if args.steps is not None and args.steps < 0:
        raise ValueError("--steps must be >= 0")
    if args.teacher is not None:
        if args.steps is None:
            args.steps = len(args.teacher)
        elif args.steps > len(args.teacher):
            raise ValueError(f"--steps {args.steps} needs as many --teacher-force ids (got {len(args.teacher)})")
    if args.steps is None:
        args.steps = 0
    if args.precision < 0 or args.precision > 17:
        raise ValueError("--precision must be 0..17")
    if args.style is None:
        args.style = "npy" if args.output else "compact"
    if args.output is None and args.style in FILE_STYLES:
        raise ValueError(f"--style {args.style} writes files: give -o DIR")
    if args.output is not None and args.style not in FILE_STYLES:
        raise ValueError(f"--style {args.style} prints to stdout: drop -o")
    if args.output is not None:
        from loupe_reference.dumpfmt import check_output_dir

        check_output_dir(args.output)


def cmd_dump(args: argparse.Namespace) -> int:
    _validate_dump_args(args)
    if args.config is None:
        _check_model_path(args)  # before torch is imported
    text = _prompt_text(args)
    t_start = time.perf_counter()
    from loupe_reference import model as M

    M.configure_torch(args.threads)
    native = args.dtype == "native"
    compute = COMPUTE_DTYPES.get(args.dtype)
    if args.config is not None:
        ref = M.load_from_config(args.config, args.seed or 0, tokenizer=args.tokenizer, verbose=args.verbose,
                                 layers=args.layers_n, native_dtype=native)
    else:
        ref = M.load(gguf=args.gguf, hf_dir=args.hf_dir, verbose=args.verbose, layers=args.layers_n,
                     native_dtype=native)
    if compute is not None:
        # Loaded in float32 (GGUF blocks dequantized exactly), then cast: the same weights
        # computed at another precision, which is what a noise floor needs.
        import torch

        ref.model.to(getattr(torch, compute))
    t_loaded = time.perf_counter()
    ids = prompts.build_prompt_ids(ref.tokenizer, text, args.chat, args.system)
    vocab = ref.model.config.get_text_config().vocab_size
    bad = [t for t in (args.teacher or []) if t >= vocab]
    if bad:
        raise ValueError(f"--teacher-force: id {bad[0]} is out of range (vocab size {vocab})")
    bad = [t for t in ids if t >= vocab]
    if bad:
        raise ValueError(f"prompt token {bad[0]} is out of range (vocab size {vocab})")

    from loupe_reference import dump as D
    from loupe_reference import dumpfmt as F

    if args.style in F.FILE_STYLES:
        writer = F.DumpWriter(args.output, args.style)  # streams files into a staging directory
        try:
            run = D.run_dump(ref.model, ids, steps=args.steps, teacher=args.teacher, taps=args.taps, native=native,
                             sink=writer.add)
            t_ran = time.perf_counter()
            _dump_warnings(run)
            writer.finish(dump_header(ref, text, args, ids, run))
        finally:
            writer.abort()  # no-op after finish
        t_done = time.perf_counter()
        if args.verbose:
            print(f"loupe_reference: load {t_loaded - t_start:.1f}s, forward + write {t_ran - t_loaded:.1f}s, "
                  f"manifest {t_done - t_ran:.1f}s", file=sys.stderr)
        print(f"loupe_reference: wrote {run.count} tensors ({args.steps + 1} step(s)) to {args.output}",
              file=sys.stderr)
        print(os.path.abspath(args.output))
    else:
        sys.stdout.write(f"# prompt_tokens: {ids}\n")
        printer = F.Printer(sys.stdout, style=args.style, precision=args.precision, steps_header=args.steps > 0)
        run = D.run_dump(ref.model, ids, steps=args.steps, teacher=args.teacher, taps=args.taps, native=native,
                         sink=printer.add)
        if run.decode_tokens:
            sys.stdout.write(f"# generated_tokens: {run.decode_tokens}\n")
        sys.stdout.flush()
        _dump_warnings(run)
    return 0


def _dump_warnings(run) -> None:
    for suffix in run.missing:
        print(f"{PROG}: warning: no '{suffix}' captured (this model's attention code was not patchable)",
              file=sys.stderr)
    if run.count == 0:
        raise ValueError("no tensor matched --taps")


def dump_header(ref, text: str, args: argparse.Namespace, ids: list[int], run) -> dict:
    """The manifest fields before ``tensors`` (see dumpfmt's docstring)."""
    import torch
    import transformers

    from loupe_reference import model as M

    sha = M.file_sha256(ref.path) if os.path.isfile(ref.path) else None
    params = next(ref.model.parameters(), None)
    precision = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64"}.get(
        params.dtype if params is not None else torch.float32, str(getattr(params, "dtype", "")))
    header = {
        "producer": {"engine": "transformers", "version": transformers.__version__},
        "model": {"path": ref.path, "sha256": sha},
        "prompt": text,
        "chat": bool(args.chat),
        "prompt_tokens": list(ids),
        "precision": precision,
        # Extra fields (readers may ignore them):
        "system": args.system,
        "generated_tokens": run.decode_tokens,  # the ids fed at decode steps 1..K (as loupe dump)
        "layers": ref.model.config.get_text_config().num_hidden_layers,
        "source": ref.kind,
        "taps": list(args.taps) if args.taps else None,
        "steps": args.steps,
        "teacher_forced": args.teacher is not None,
        "next_token": run.next_token,
        "dtype": args.dtype,
        "style": args.style,
    }
    if ref.kind == "config":
        header["seed"] = args.seed or 0
    return header


def cmd_embed(args: argparse.Namespace) -> int:
    from loupe_reference import model as M

    M.configure_torch(args.threads)
    out = M.embed(args.hf_dir, args.texts)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


def cmd_make_tiny(args: argparse.Namespace) -> int:
    from loupe_reference import fixtures

    t0 = time.perf_counter()
    files = fixtures.make_tiny(args.out, seed=args.seed, tie=args.tie, rope_scaling=args.rope_scaling,
                               layers=args.layers, tokenizer_gguf=args.tokenizer_gguf,
                               attention_bias=args.attention_bias, mlp_bias=args.mlp_bias, hidden_act=args.hidden_act,
                               family=args.family, sliding_window=args.sliding_window,
                               partial_rotary=args.partial_rotary)
    print(f"loupe_reference: wrote {', '.join(files)} to {args.out} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0


def cmd_save_pt(args: argparse.Namespace) -> int:
    from loupe_reference import fixtures

    expected = fixtures.save_pt(args.out)
    print(f"loupe_reference: wrote {len(expected['files'])} fixture files and expected.json to {args.out}",
          file=sys.stderr)
    print(os.path.abspath(args.out))
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
