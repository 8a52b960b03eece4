"""Golden records: what the reference does on a fixed set of prompts.

``scripts/regen-goldens`` writes one JSON file per prompt into
``tests/golden/<model-id>/``; loupe's Rust tests read them. See
``tests/golden/README.md`` for the schema. Regenerate only deliberately: the
goldens pin the reference's behaviour, and changing them silently would hide a
regression on either side.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

from loupe_reference import JSON_FORMAT_VERSION, prompts

MODEL_ID = "smollm2-q4_1"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# About 240 tokens of prose written for these goldens. The wording "a thousand years until a series
# of earthquakes" (not "before") was chosen because the original had a near tie (top-1 minus top-2
# logit 5.9e-4) at a prompt position of the raw golden; keep every margin above 1e-3 when editing.
LIGHTHOUSE_TEXT = (
    "For most of recorded history, sailors approaching a dangerous coast at night had little more than "
    "luck and local knowledge to rely on. The earliest lighthouses were simply fires built on hilltops, "
    "tended by monks, soldiers or villagers who were paid in grain or exempted from taxes. The most famous "
    "ancient example, the Pharos of Alexandria, was completed around 280 BC and stood for more than a "
    "thousand years until a series of earthquakes brought it down. In the centuries that followed, coastal "
    "towns across Europe kept coal and wood fires burning in iron baskets, but the light was weak, smoky and "
    "easily hidden by rain. The great change came in the eighteenth and nineteenth centuries. Engineers such "
    "as John Smeaton learned to build stone towers that could survive the open sea by dovetailing each block "
    "into its neighbours, and in 1822 the French physicist Augustin Fresnel designed a lens made of concentric "
    "rings of glass that bent the light of a single lamp into a powerful horizontal beam visible for more than "
    "twenty miles. Oil lamps gave way to kerosene, then to electricity, and keepers and their families lived "
    "for decades in isolated stations, winding clockwork and polishing brass. Today nearly every lighthouse is "
    "automated, satellite navigation guides most ships, and many old towers survive as museums, yet their "
    "beams still sweep the dark for anyone who needs them."
)


@dataclass(frozen=True)
class GoldenSpec:
    name: str
    prompt: str
    chat: bool
    system: str | None = None
    max_tokens: int = 64


GOLDEN_SPECS: tuple[GoldenSpec, ...] = (
    # Near tie at the first step: "The" over "L" (0.08 logit apart, docs/models.md).
    GoldenSpec("chat-capital-france", "What is the capital of France?", chat=True),
    GoldenSpec("chat-system-primary-colors", "Name three primary colors.", chat=True,
               system="You are a terse assistant."),
    GoldenSpec("chat-haiku-sea", "Write a haiku about the sea.", chat=True),
    # A short chat prompt that runs the full 64 steps (the three above stop on EOS).
    GoldenSpec("chat-sky-blue", "Explain why the sky is blue.", chat=True),
    GoldenSpec("raw-quick-brown-fox", "The quick brown fox", chat=False),
    GoldenSpec("raw-columbus-2024", "In 1492, Columbus sailed across the Atlantic. The year 2024", chat=False),
    GoldenSpec("raw-code-fibonacci", "def fibonacci(n):\n", chat=False),
    GoldenSpec("chat-long-lighthouses",
               "Summarize the following text in two sentences.\n\n" + LIGHTHOUSE_TEXT, chat=True),
    GoldenSpec("raw-long-lighthouses", LIGHTHOUSE_TEXT + "\n\nIn summary,", chat=False),
)

# Qwen2.5-Coder-0.5B-Instruct (GGUF qwen2; `scripts/fetch-model qwen2.5-coder-0.5b`): the second
# architecture at parity. Prompts a coding model answers at length (so 64 steps are compared),
# plus one plain-prose prompt; each was checked for margins above 1e-3 when first generated.
QWEN_MODEL_ID = "qwen2.5-coder-0.5b"
QWEN_MODEL_FILE = "Qwen2.5-Coder-0.5B-Instruct.gguf"
QWEN_GOLDEN_SPECS: tuple[GoldenSpec, ...] = (
    GoldenSpec("chat-prime-function", "Write a Python function that checks whether a number is prime.", chat=True),
    GoldenSpec("chat-capital-france", "What is the capital of France?", chat=True),
    GoldenSpec("raw-code-fibonacci", "def fibonacci(n):\n", chat=False),
    GoldenSpec("raw-quick-brown-fox", "The quick brown fox", chat=False),
)


# Gemma 3 270M (GGUF gemma3, base model, no chat template; `scripts/fetch-model gemma3-270m`):
# raw prompts only. The long prompt (about 730 tokens) runs past the 512-token sliding window of
# five layers in six, so the goldens pin the window's mask and the local RoPE base.
GEMMA_MODEL_ID = "gemma3-270m"
GEMMA_MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_GOLDEN_SPECS: tuple[GoldenSpec, ...] = (
    GoldenSpec("raw-quick-brown-fox", "The quick brown fox", chat=False),
    GoldenSpec("raw-code-fibonacci", "def fibonacci(n):\n", chat=False),
    GoldenSpec("raw-columbus-2024", "In 1492, Columbus sailed across the Atlantic. The year 2024", chat=False),
    GoldenSpec("raw-long-lighthouses-x3",
               "\n\n".join([LIGHTHOUSE_TEXT] * 3) + "\n\nIn summary,", chat=False),
)


@dataclass(frozen=True)
class GoldenSet:
    """The goldens of one model: where they live (`tests/golden/<model_id>/`), the model file
    they were made from (its name in the cache, and its `scripts/fetch-model` name), and the prompts."""
    model_id: str
    model_file: str
    fetch_name: str
    specs: tuple[GoldenSpec, ...]


GOLDEN_SETS: dict[str, GoldenSet] = {
    MODEL_ID: GoldenSet(MODEL_ID, MODEL_FILE, "smollm2", GOLDEN_SPECS),
    QWEN_MODEL_ID: GoldenSet(QWEN_MODEL_ID, QWEN_MODEL_FILE, "qwen2.5-coder-0.5b", QWEN_GOLDEN_SPECS),
    GEMMA_MODEL_ID: GoldenSet(GEMMA_MODEL_ID, GEMMA_MODEL_FILE, "gemma3-270m", GEMMA_GOLDEN_SPECS),
}

REQUIRED_KEYS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "prompt": str,
    "chat": bool,
    "system": (str, type(None)),
    "max_tokens": int,
    "prompt_tokens": list,
    "tokens": list,
    "text": str,
    "argmax": list,
    "margins": list,
    "generator": dict,
    "model_sha256": str,
}


def build_record(ref: Any, spec: GoldenSpec, model_sha256: str, versions: dict[str, str],
                 model_file: str = MODEL_FILE) -> dict[str, Any]:
    """Run the reference on one spec: prompt ids, greedy generation, teacher-forced argmax, margins."""
    from loupe_reference import model as M

    ids = prompts.build_prompt_ids(ref.tokenizer, spec.prompt, spec.chat, spec.system)
    gen = M.generate(ref, ids, spec.max_tokens)
    tf = M.teacher_force(ref, ids, gen.tokens)
    # Positions whose teacher-forced prediction is a generated token: len(ids)-1 .. len(ids)+len(tokens)-2.
    disagree = [
        i for i, tok in enumerate(gen.tokens) if tf.argmax[len(ids) - 1 + i] != tok
    ]
    rendered = prompts.render_chat(ref.tokenizer, spec.prompt, spec.system) if spec.chat else spec.prompt
    return {
        "format_version": JSON_FORMAT_VERSION,
        "name": spec.name,
        "prompt": spec.prompt,
        "chat": spec.chat,
        "system": spec.system,
        "max_tokens": spec.max_tokens,
        "rendered_prompt": rendered,
        "prompt_tokens": ids,
        "tokens": gen.tokens,
        "text": gen.text,
        "stopped_on_eos": gen.stopped_on_eos,
        "eos_token_ids": list(ref.eos_token_ids),
        "margins": gen.margins,
        "runner_up": gen.runner_up,
        "argmax": tf.argmax,
        "argmax_margins": tf.margins,
        "teacher_forced_disagreements": disagree,
        "generator": {
            "torch": versions.get("torch"),
            "transformers": versions.get("transformers"),
            "gguf": versions.get("gguf"),
            "accelerate": versions.get("accelerate"),
            "loupe_reference": __import__("loupe_reference").__version__,
            "settings": "float32, attn_implementation=eager, greedy generate(do_sample=False), CPU",
        },
        "model_file": model_file,
        "model_sha256": model_sha256,
    }


def validate_record(rec: Any) -> list[str]:
    """Schema and internal-consistency problems of one golden record (empty list: valid)."""
    problems: list[str] = []
    if not isinstance(rec, dict):
        return ["record is not a JSON object"]
    for key, typ in REQUIRED_KEYS.items():
        if key not in rec:
            problems.append(f"missing key {key!r}")
        elif not isinstance(rec[key], typ) or (typ is int and isinstance(rec[key], bool)):
            problems.append(f"key {key!r} has type {type(rec[key]).__name__}")
    if problems:
        return problems

    def ints(xs: Iterable[Any]) -> bool:
        return all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xs)

    for key in ("prompt_tokens", "tokens", "argmax"):
        if not ints(rec[key]):
            problems.append(f"{key} must hold non-negative integers")
    if not rec["prompt_tokens"]:
        problems.append("prompt_tokens is empty")
    if len(rec["tokens"]) > rec["max_tokens"]:
        problems.append("more tokens than max_tokens")
    if len(rec["argmax"]) != len(rec["prompt_tokens"]) + len(rec["tokens"]):
        problems.append("argmax length must be len(prompt_tokens) + len(tokens)")
    if len(rec["margins"]) != len(rec["tokens"]):
        problems.append("margins length must equal len(tokens)")
    if not all(isinstance(m, (int, float)) and math.isfinite(m) and m >= 0 for m in rec["margins"]):
        problems.append("margins must be finite and >= 0")
    if rec["system"] is not None and not rec["chat"]:
        problems.append("system set on a raw (non-chat) prompt")
    if not (len(rec["model_sha256"]) == 64 and all(c in "0123456789abcdef" for c in rec["model_sha256"])):
        problems.append("model_sha256 is not a lowercase hex sha256")
    for k in ("torch", "transformers", "gguf"):
        if not isinstance(rec["generator"].get(k), str):
            problems.append(f"generator.{k} missing")
    return problems


def dumps_golden(rec: dict[str, Any]) -> str:
    """Readable, diff-friendly JSON: one top-level key per line, values compact."""
    lines = [
        f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False, allow_nan=False, separators=(', ', ': '))}"
        for k, v in rec.items()
    ]
    return "{\n" + ",\n".join(lines) + "\n}\n"


# Keys whose values must be identical on a regeneration with the same stack (floats: exactly).
COMPARED_KEYS = (
    "prompt_tokens", "tokens", "text", "argmax", "margins", "runner_up", "argmax_margins",
    "rendered_prompt", "stopped_on_eos", "eos_token_ids", "model_sha256", "prompt", "chat", "system", "max_tokens",
)


def diff_records(old: dict[str, Any], new: dict[str, Any], margin_tol: float = 1e-4) -> list[str]:
    """Differences that matter between a stored golden and a fresh regeneration.

    Ids and text must match exactly; margins within ``margin_tol`` (thread count and
    library builds may move the last bits).
    """
    out = []
    for key in COMPARED_KEYS:
        a, b = old.get(key), new.get(key)
        if key in ("margins", "argmax_margins") and isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            worst = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
            if worst > margin_tol:
                out.append(f"{key}: differs by up to {worst:.3g}")
            elif worst > 0:
                out.append(f"note: {key} within tolerance, not bit-identical (up to {worst:.3g})")
            continue
        if a != b:
            out.append(f"{key}: differs")
    return out
