"""Reference outputs of Hugging Face transformers for loupe-text's parity tests.

Usage: python3 hf_reference.py REQUEST.json OUTPUT.json

The request (written by tests/hf_parity/common.rs) names the SmolLM2 GGUF, a work directory, the
strings and chats to encode and the chat templates to render. This script
- dumps each GGUF's tokenizer metadata to JSON keyed by GGUF key names (what
  `TokenizerSpec::from_json` reads);
- writes synthetic GGUFs (variants of SmolLM2's vocabulary and a small SentencePiece vocabulary)
  to cover the other builders;
- records what transformers produces for each: ids, decodes, chat renders;
- saves the GGUF tokenizer as a tokenizer.json checkpoint and records its outputs too.
Nothing large is committed: all of it is generated under the work directory at test time.
"""

import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
from gguf import GGUFReader, GGUFWriter  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


def plain(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8")
    raise TypeError(type(value))


def dump_spec(gguf_path, out_path):
    reader = GGUFReader(gguf_path)
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.") or key == "general.architecture":
            meta[key] = field.contents()
    with open(out_path, "w") as f:
        json.dump(meta, f, default=plain)
    return meta


def write_gguf(path, arch, meta):
    """A GGUF with just enough model metadata for AutoTokenizer, and the given tokenizer keys."""
    w = GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_rope_dimension_count(8)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(meta["model"])
    if meta.get("pre"):
        w.add_tokenizer_pre(meta["pre"])
    w.add_token_list(meta["tokens"])
    if meta.get("scores") is not None:
        w.add_token_scores(meta["scores"])
    if meta.get("types") is not None:
        w.add_token_types(meta["types"])
    if meta.get("merges"):
        w.add_token_merges(meta["merges"])
    for key, add in [("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("unk", w.add_unk_token_id),
                     ("pad", w.add_pad_token_id)]:
        if meta.get(key) is not None:
            add(meta[key])
    for key, add in [("add_bos", w.add_add_bos_token), ("add_eos", w.add_add_eos_token),
                     ("add_space_prefix", w.add_add_space_prefix)]:
        if meta.get(key) is not None:
            add(meta[key])
    if meta.get("chat_template"):
        w.add_chat_template(meta["chat_template"])
    w.add_tensor("token_embd.weight", np.zeros((1, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def small_sentencepiece():
    """A SentencePiece-style vocabulary: <unk> <s> </s>, 256 byte tokens, pieces with scores."""
    corpus = ("the quick brown fox jumps over the lazy dog. hello world, this is a test of the tokenizer "
              "in 1492 there were 12345 ships. code: def f(x): return x")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = ["\u2581"] + sorted(set(corpus) - {" "})
    for word in sorted(set(corpus.replace(",", " ").replace(".", " ").split())):
        for i in range(2, len(word) + 1):
            pieces += ["\u2581" + word[:i], word[:i]]
        if len(word) > 2:
            pieces.append(word[1:])
    pieces += ["\u2581\u2581", "\u2581\u2581\u2581"]
    seen = set(tokens)
    for piece in pieces:
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(1)
    tokens += ["<|im_start|>", "<|im_end|>", "<think>"]
    types += [3, 3, 4]
    scores = [0.0] * len(tokens)
    for i, t in enumerate(tokens):
        if types[i] == 1:
            scores[i] = -float(len(tokens) - i) + 0.5 * len(t)
    return {"model": "llama", "tokens": tokens, "types": types, "scores": scores, "bos": 1, "eos": 2, "unk": 0}


def gemma_sentencepiece():
    """A Gemma-style vocabulary: Gemma's specials first, whitespace runs stored with real spaces
    (user-defined, as in Gemma 3's GGUF), newline and tab runs, then bytes and pieces. The
    scores rise with the index, the opposite of the merge order that the file position gives,
    so a builder that ranked merges by score would tokenize differently."""
    spm = small_sentencepiece()
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]", "<start_of_turn>", "<end_of_turn>",
              "\n", "\n\n", "\t", "  ", "   ", "    ", " \n"]
    types = [3, 3, 3, 3, 3, 4, 3, 3, 4, 4, 4, 4, 4, 4, 4]
    for token, kind in zip(spm["tokens"], spm["types"]):
        if kind in (1, 6) and token not in tokens:
            tokens.append(token)
            types.append(kind)
    scores = [float(i) for i in range(len(tokens))]
    return {"model": "llama", "tokens": tokens, "types": types, "scores": scores, "bos": 2, "eos": 1, "unk": 3,
            "pad": 0, "add_bos": True, "add_eos": False, "add_space_prefix": False}


def synthetic_models(smol_meta, workdir):
    """(name, arch, tokenizer metadata) of every synthetic GGUF."""
    base = {
        "model": "gpt2",
        "tokens": list(smol_meta["tokenizer.ggml.tokens"]),
        "types": [int(t) for t in smol_meta["tokenizer.ggml.token_type"]],
        "merges": list(smol_meta["tokenizer.ggml.merges"]),
        "bos": 1, "eos": 2, "unk": 0, "pad": 2, "add_bos": False,
        "chat_template": smol_meta.get("tokenizer.chat_template"),
    }
    odd = dict(base, tokens=list(base["tokens"]), types=list(base["types"]))
    odd["tokens"][0] = "<|eot|>"             # GPT2Tokenizer's default <|endoftext|> is now missing
    odd["tokens"][16] = "<empty output>"     # a control token outside the byte alphabet
    odd["tokens"][15] = odd["tokens"][14]    # a duplicate token
    odd["types"][5] = 4                      # a user-defined token
    odd.update(bos=100, add_bos=True, add_eos=True, pre="default")
    spm = small_sentencepiece()
    models = [
        ("gpt2_llama_bpe", "llama", dict(base, pre="llama-bpe")),
        ("gpt2_qwen2", "llama", dict(base, pre="qwen2")),
        ("gpt2_odd", "llama", odd),
        ("spm", "llama", spm),
        # transformers ignores add_space_prefix for GGUF files; so must we.
        ("spm_flags", "llama", dict(spm, add_bos=False, add_eos=True, add_space_prefix=False)),
        ("phi3", "phi3", spm),
        ("gemma3", "gemma3", gemma_sentencepiece()),
    ]
    out = []
    for name, arch, meta in models:
        path = os.path.join(workdir, f"{name}.gguf")
        write_gguf(path, arch, meta)
        out.append((name, path))
    return out


def load(path):
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def describe(tok, strings, chats):
    result = {
        "len": len(tok),
        "bos_token": tok.bos_token, "eos_token": tok.eos_token,
        "bos_id": tok.bos_token_id, "eos_id": tok.eos_token_id,
        "add_bos": bool(getattr(tok, "add_bos_token", False)),
        "add_eos": bool(getattr(tok, "add_eos_token", False)),
        "strings": [],
        "chats": [],
    }
    for text in strings:
        with_special = tok(text)["input_ids"]
        result["strings"].append({
            "with": with_special,
            "without": tok(text, add_special_tokens=False)["input_ids"],
            "tokens": tok.convert_ids_to_tokens(with_special),
            "decode": tok.decode(with_special),
            "decode_skip": tok.decode(with_special, skip_special_tokens=True),
        })
    if tok.chat_template:
        for messages in chats:
            for gen in (False, True):
                text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
                ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen)
                if not isinstance(ids, list):
                    ids = ids["input_ids"]
                result["chats"].append({"gen": gen, "text": text, "ids": ids})
    return result


def render_templates(tok, templates):
    out = []
    for t in templates:
        kwargs = dict(t.get("vars") or {})
        try:
            text = tok.apply_chat_template(t["messages"], chat_template=t["source"], tools=t.get("tools"),
                                           tokenize=False, add_generation_prompt=t["add_generation_prompt"], **kwargs)
            out.append({"name": t["name"], "text": text, "error": None})
        except Exception as e:  # raise_exception surfaces as jinja2's TemplateError
            out.append({"name": t["name"], "text": None, "error": str(e)})
    return out


def main():
    request = json.load(open(sys.argv[1]))
    workdir = request["workdir"]
    strings, chats = request["strings"], request["chats"]
    out = {"models": {}}

    smol_path = request["smollm2"]
    smol_meta = dump_spec(smol_path, os.path.join(workdir, "smollm2.json"))
    tok = load(smol_path)
    out["models"]["smollm2"] = dict(describe(tok, strings, chats), spec=os.path.join(workdir, "smollm2.json"))
    out["templates"] = render_templates(tok, request["templates"])

    # The same tokenizer as a transformers checkpoint (tokenizer.json + tokenizer_config.json).
    ckpt = os.path.join(workdir, "checkpoint")
    tok.save_pretrained(ckpt)
    out["checkpoint"] = dict(describe(AutoTokenizer.from_pretrained(ckpt), strings, chats), dir=ckpt)

    for name, path in synthetic_models(smol_meta, workdir):
        spec_path = os.path.join(workdir, f"{name}.json")
        dump_spec(path, spec_path)
        out["models"][name] = dict(describe(load(path), strings, chats), spec=spec_path)

    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
