"""Prompt-id construction, following Hugging Face conventions exactly.

- raw prompt:  ``tokenizer(prompt)["input_ids"]`` (whatever special tokens the
  tokenizer adds by default; SmolLM2 adds none).
- chat prompt: ``tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)``
  with messages = optional system message + the user message. When no system
  text is given only the user message is passed, so a template with a default
  system prompt (SmolLM2's) inserts it.

This module does not import torch or transformers, so it is cheap to test.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Mapping, Sequence


def build_messages(prompt: str, system: str | None = None) -> list[dict[str, str]]:
    """The chat messages for one user turn, with an optional system message first."""
    messages: list[dict[str, str]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    return messages


def _as_id_list(out: Any) -> list[int]:
    """Normalize what a tokenizer call returns into a flat list of ints.

    transformers 5 returns a ``BatchEncoding`` (dict-like, ``input_ids``) from
    ``apply_chat_template(..., tokenize=True)``; 4.x returned a plain list.
    """
    if isinstance(out, Mapping) or hasattr(out, "keys"):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    out = list(out)
    if out and isinstance(out[0], (list, tuple)):
        if len(out) != 1:
            raise ValueError(f"expected one sequence of ids, got a batch of {len(out)}")
        out = list(out[0])
    return [int(i) for i in out]


def render_chat(tokenizer: Any, prompt: str, system: str | None = None) -> str:
    """The chat prompt as text (for display and debugging; ids come from build_prompt_ids)."""
    return tokenizer.apply_chat_template(
        build_messages(prompt, system), add_generation_prompt=True, tokenize=False
    )


def build_prompt_ids(tokenizer: Any, prompt: str, chat: bool, system: str | None = None) -> list[int]:
    """Prompt token ids exactly as Hugging Face conventions produce them."""
    if system is not None and not chat:
        raise ValueError("a system message needs chat mode (--chat)")
    if chat:
        out = tokenizer.apply_chat_template(
            build_messages(prompt, system), add_generation_prompt=True, tokenize=True
        )
    else:
        out = tokenizer(prompt)["input_ids"]
    return _as_id_list(out)


def parse_token_list(text: str) -> list[int]:
    """Parse "1,2,3" (spaces allowed, empty string -> []) into ids."""
    text = text.strip()
    if not text:
        return []
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part != ""]
    except ValueError as e:
        raise ValueError(f"--tokens must be comma-separated integers, got {text!r}") from e
    if any(i < 0 for i in ids):
        raise ValueError("--tokens must be non-negative")
    return ids


def dumps_line(obj: Any) -> str:
    """One-line JSON (UTF-8 text kept as is, no NaN)."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))


def write_json_line(obj: Any, stream=None) -> None:
    """Write one JSON line as UTF-8 regardless of the locale."""
    stream = stream if stream is not None else sys.stdout
    line = dumps_line(obj) + "\n"
    buf = getattr(stream, "buffer", None)
    if buf is not None:
        stream.flush()
        buf.write(line.encode("utf-8"))
        buf.flush()
    else:
        stream.write(line)
        stream.flush()


GENERATE_KEYS: Sequence[str] = ("prompt_tokens", "tokens", "text")
TEACHER_FORCE_KEYS: Sequence[str] = ("prompt_tokens", "argmax")
