"""Loading the reference model and running it: greedy generation and teacher forcing.

The reference is transformers in float32 with the eager attention path on CPU.
The ``dump`` subcommand (dump.py) attaches forward hooks to ``Reference.model`` by
module path (``model.named_modules()``); nothing here hides the module tree.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import loupe_reference  # noqa: F401  (sets HF_HUB_OFFLINE before transformers is imported)
from loupe_reference import InputError

import torch

DEFAULT_THREADS = 2


def configure_torch(threads: int = DEFAULT_THREADS) -> None:
    torch.set_num_threads(max(1, int(threads)))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set, or parallel work already started


def quiet_transformers(verbose: bool = False) -> None:
    """Silence transformers' progress bars and warnings unless verbose."""
    import transformers

    if verbose:
        transformers.utils.logging.set_verbosity_info()
        return
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:  # the GGUF loader uses a plain tqdm bar ("Converting and de-quantizing GGUF tensors...")
        import functools

        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        if hasattr(gguf_utils, "tqdm"):
            gguf_utils.tqdm = functools.partial(gguf_utils.tqdm, disable=True)
    except Exception:  # pragma: no cover - module layout differs between versions
        pass
    try:
        import huggingface_hub.utils as hub_utils

        hub_utils.disable_progress_bars()
    except Exception:  # pragma: no cover - depends on the hub version
        pass
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


@dataclass
class Reference:
    model: Any
    tokenizer: Any
    kind: str  # "gguf" or "hf-dir"
    path: str
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return []
    if isinstance(eos, int):
        return [eos]
    return [int(e) for e in eos]


def load(
    gguf: str | None = None,
    hf_dir: str | None = None,
    verbose: bool = False,
    layers: int | None = None,
    native_dtype: bool = False,
) -> Reference:
    """Load tokenizer and model from a GGUF file or a local HF checkpoint directory (f32, eager).

    ``layers``: keep only the first N decoder layers (``truncate_layers`` on the config; the
    weights of the dropped layers are ignored). ``native_dtype``: load an HF checkpoint in its
    stored dtype (``dtype="auto"``) instead of float32 (a GGUF is float32 either way)."""
    if (gguf is None) == (hf_dir is None):
        raise InputError("give exactly one of --gguf or --hf-dir")
    quiet_transformers(verbose)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_kwargs = dict(dtype=torch.float32, attn_implementation="eager", local_files_only=True)
    if gguf is not None:
        path = os.path.abspath(gguf)
        if not os.path.isfile(path):
            raise InputError(f"{gguf}: no such file")
        directory, name = os.path.split(path)
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
        # Always the plain dense f32 model: every GGML block dequantized once at load (for Llama,
        # transformers 5.23 does so anyway, through gguf-py: Q4_1 = (d * q) + m, Q8_0 = q * d, in f32,
        # no FMA). Asking explicitly keeps an installed `kernels` package from switching to packed
        # GGUF matmuls, which would round differently.
        try:
            from transformers import GgufConfig

            model_kwargs["quantization_config"] = GgufConfig(dequantize=True)
        except ImportError:  # transformers < 5
            pass
        if layers is not None:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(directory, gguf_file=name, local_files_only=True)
            truncate_layers(config, layers)
            model_kwargs["config"] = config
        model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, **model_kwargs)
        kind = "gguf"
    else:
        path = os.path.abspath(hf_dir)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise InputError(f"{hf_dir}: not a Hugging Face checkpoint directory (no config.json)")
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if native_dtype:
            model_kwargs["dtype"] = "auto"
        if layers is not None:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(path, local_files_only=True)
            truncate_layers(config, layers)
            model_kwargs["config"] = config
        model_cls = AutoModelForCausalLM
        if is_encoder_dir(path):
            # A bare encoder (BertModel): transformers' AutoModel builds exactly the checkpoint's
            # class, with the state dict's own names (`embeddings.*`, `encoder.layer.*`).
            from transformers import AutoModel

            model_cls = AutoModel
        model = model_cls.from_pretrained(path, **model_kwargs)
        kind = "hf-dir"
    model.eval()
    pad = tokenizer.pad_token_id
    eos = _eos_ids(model, tokenizer)
    if pad is None and eos:
        pad = eos[0]
    return Reference(model=model, tokenizer=tokenizer, kind=kind, path=path, eos_token_ids=eos, pad_token_id=pad)


#: config.json ``architectures`` loupe runs as encoders (sentence embeddings, no logits).
ENCODER_ARCHITECTURES = ("BertModel",)


def is_encoder_dir(path: str) -> bool:
    """Whether the HF checkpoint directory ``path`` holds an encoder (``BertModel``)."""
    import json

    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return any(a in ENCODER_ARCHITECTURES for a in config.get("architectures") or [])


def is_encoder(model: Any) -> bool:
    """Whether a loaded model is an encoder without a language-model head."""
    return type(model).__name__ in ENCODER_ARCHITECTURES


#: Config keys that hold a layer count (MAX's debug_model --num-hidden-layers writes them all).
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def truncate_layers(config: Any, n: int) -> list[str]:
    """Write ``n`` into every layer-count key of ``config`` (a transformers config or a dict),
    nested sub-configs (``text_config``, ``vision_config``, ...) included; per-layer lists
    (``layer_types``) are cut to ``n``. Returns the dotted keys written; raises InputError when
    none matched or when ``n`` is not in 1..(the model's layer count)."""
    if n < 1:
        raise InputError(f"--layers must be >= 1 (or 'all'), got {n}")
    written: list[str] = []
    seen: set[int] = set()

    def items(obj: Any):
        if isinstance(obj, dict):
            return list(obj.items())
        return list(vars(obj).items())

    def put(obj: Any, key: str, value: Any) -> None:
        if isinstance(obj, dict):
            obj[key] = value
        else:
            setattr(obj, key, value)

    def walk(obj: Any, prefix: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        counts = {}
        for key, value in items(obj):
            if key in LAYER_COUNT_KEYS and isinstance(value, int) and not isinstance(value, bool):
                if n > value:
                    raise InputError(f"--layers {n}: the model has only {value} layers ({prefix}{key})")
                counts[key] = value
        for key in counts:
            put(obj, key, n)
            written.append(prefix + key)
        old = max(counts.values()) if counts else None
        for key, value in items(obj):
            if key == "layer_types" and isinstance(value, list) and old is not None and len(value) == old:
                put(obj, key, value[:n])
            elif isinstance(value, dict) or _is_config(value):
                walk(value, prefix + key + ".")

    walk(config, "")
    if not written:
        raise InputError(f"--layers: no layer-count key ({', '.join(LAYER_COUNT_KEYS)}) in the model config")
    return written


def _is_config(x: Any) -> bool:
    try:
        from transformers import PretrainedConfig
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, PretrainedConfig)


class ByteTokenizer:
    """The fallback tokenizer of ``dump --config`` without ``--tokenizer``: one id per UTF-8 byte.
    No chat template, no special tokens."""

    eos_token_id = None
    pad_token_id = None

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": list(text.encode("utf-8"))}

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        raise InputError("--chat needs a tokenizer with a chat template (give --tokenizer)")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def load_tokenizer(path: str) -> Any:
    """A tokenizer from an HF directory (tokenizer.json ...) or a GGUF file."""
    from transformers import AutoTokenizer

    if os.path.isdir(path):
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    if os.path.isfile(path):
        directory, name = os.path.split(os.path.abspath(path))
        return AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
    raise InputError(f"{path}: no such tokenizer file or directory")


def load_from_config(
    config_path: str,
    seed: int,
    tokenizer: str | None = None,
    verbose: bool = False,
    layers: int | None = None,
    native_dtype: bool = False,
) -> Reference:
    """A model with random weights from a ``config.json``: ``torch.manual_seed(seed)`` then
    ``AutoModelForCausalLM.from_config`` (eager attention; float32 unless ``native_dtype``, which
    uses the config's dtype). Tokenizer: ``tokenizer`` (HF dir or GGUF), else ``ByteTokenizer``."""
    import json

    quiet_transformers(verbose)
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    try:
        with open(config_path, "r", encoding="utf-8") as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise InputError(f"{config_path}: not valid JSON ({e})") from None
    if not isinstance(d, dict) or "model_type" not in d:
        raise InputError(f"{config_path}: no model_type")
    try:
        cls = CONFIG_MAPPING[d["model_type"]]
    except KeyError:
        raise InputError(f"{config_path}: unknown model_type {d['model_type']!r}") from None
    config = cls.from_dict(d)
    if layers is not None:
        truncate_layers(config, layers)
    dtype = torch.float32
    if native_dtype:
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
    tok = load_tokenizer(tokenizer) if tokenizer else ByteTokenizer()
    torch.manual_seed(int(seed))
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager")
    model.eval()
    if tokenizer is None and config.vocab_size < 256:
        raise InputError(f"the byte fallback tokenizer needs vocab_size >= 256 (config has {config.vocab_size}); give --tokenizer")
    eos = _eos_ids(model, tok) if tokenizer else []
    pad = getattr(tok, "pad_token_id", None)
    if pad is None and eos:
        pad = eos[0]
    return Reference(model=model, tokenizer=tok, kind="config", path=os.path.abspath(config_path),
                     eos_token_ids=eos, pad_token_id=pad)


def _ids_tensor(ids: Sequence[int]) -> torch.Tensor:
    if len(ids) == 0:
        raise InputError("empty input: the prompt produced no tokens")
    return torch.tensor([list(ids)], dtype=torch.long)


@dataclass
class Generation:
    tokens: list[int]  # generated ids only; ends with the EOS id if generation stopped on it
    text: str
    stopped_on_eos: bool
    margins: list[float]  # top1 - top2 raw logit at each generated step
    runner_up: list[int]  # the second-best id at each generated step


def top2(logits: torch.Tensor) -> tuple[list[int], list[int], list[float]]:
    """For logits [T, V]: (argmax ids, runner-up ids, top1 - top2 margins), computed in f32 as given."""
    vals, idx = torch.topk(logits.float(), k=2, dim=-1)
    margins = (vals[:, 0] - vals[:, 1]).tolist()
    return idx[:, 0].tolist(), idx[:, 1].tolist(), [float(m) for m in margins]


@torch.no_grad()
def generate(ref: Reference, prompt_ids: Sequence[int], max_new_tokens: int) -> Generation:
    """Greedy decoding exactly as ``model.generate(do_sample=False, max_new_tokens=N)``.

    A fresh GenerationConfig is used so no processor (repetition penalty, temperature, ...)
    from a checkpoint's generation_config.json changes the choice; the raw logits of every
    step are checked to agree with the chosen token.
    """
    from transformers import GenerationConfig

    if max_new_tokens < 0:
        raise InputError("--max-tokens must be >= 0")
    if max_new_tokens == 0:
        return Generation([], "", False, [], [])
    input_ids = _ids_tensor(prompt_ids)
    cfg = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=int(max_new_tokens),
        eos_token_id=list(ref.eos_token_ids) or None,
        pad_token_id=ref.pad_token_id,
        bos_token_id=getattr(ref.model.config, "bos_token_id", None),
        use_cache=True,
        return_dict_in_generate=True,
        output_logits=True,
    )
    out = ref.model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        generation_config=cfg,
    )
    seq = out.sequences[0].tolist()
    if seq[: len(prompt_ids)] != list(prompt_ids):
        raise RuntimeError("generate() did not return the prompt as the sequence prefix")
    tokens = [int(t) for t in seq[len(prompt_ids) :]]
    logits = torch.cat([step.float() for step in out.logits], dim=0)  # [steps, V]
    if logits.shape[0] != len(tokens):
        raise RuntimeError(f"generate() returned {len(tokens)} tokens but {logits.shape[0]} logit rows")
    best, second, margins = top2(logits)
    for i, (tok, b) in enumerate(zip(tokens, best)):
        if tok != b and float(logits[i, tok]) != float(logits[i, b]):
            raise RuntimeError(f"step {i}: generate() chose {tok} but the raw argmax is {b}")
    stopped = bool(tokens) and tokens[-1] in ref.eos_token_ids
    text = ref.tokenizer.decode(tokens, skip_special_tokens=True)
    return Generation(tokens, text, stopped, margins, second)


@dataclass
class TeacherForced:
    argmax: list[int]  # one per position of prompt + tokens
    runner_up: list[int]
    margins: list[float]
    top_logits: list[list[list[float]]] | None  # per position: [[id, logit], ...] best first


@torch.no_grad()
def teacher_force(
    ref: Reference, prompt_ids: Sequence[int], tokens: Sequence[int], top_k: int = 0
) -> TeacherForced:
    """One forward pass (no KV cache) over prompt + tokens; the argmax at every position."""
    ids = list(prompt_ids) + list(tokens)
    input_ids = _ids_tensor(ids)
    logits = ref.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).logits[0]
    logits = logits.float()
    best, second, margins = top2(logits)
    top = None
    if top_k and top_k > 0:
        vals, idx = torch.topk(logits, k=min(int(top_k), logits.shape[-1]), dim=-1)
        top = [
            [[int(i), float(v)] for i, v in zip(irow, vrow)]
            for irow, vrow in zip(idx.tolist(), vals.tolist())
        ]
    return TeacherForced(best, second, margins, top)


def export_hf(ref: Reference, out_dir: str) -> list[str]:
    """Write the loaded model as a Hugging Face checkpoint directory (f32 safetensors, config.json,
    tokenizer.json, chat template), so the HF-directory code paths can be tested without a hub.
    Loading that directory with ``--hf-dir`` reproduces the GGUF's outputs exactly."""
    model = ref.model
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # weights are already dense f32 (see load); drop the GGUF marker
        quantizer.remove_quantization_config(model)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    ref.tokenizer.save_pretrained(out_dir)
    return sorted(os.listdir(out_dir))


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stack_versions() -> dict[str, str]:
    """Versions of the reference stack, as recorded in goldens."""
    from importlib import metadata

    out = {}
    for name in ("torch", "transformers", "gguf", "accelerate", "numpy", "safetensors"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["torch"] = torch.__version__
    return out


def embed(hf_dir: str, texts: Sequence[str]) -> dict:
    """Sentence embeddings as sentence-transformers computes them for the directory's pipeline
    (``modules.json``: Transformer, Pooling, Normalize), written out by hand so no
    sentence-transformers install is needed: each text tokenized with the tokenizer's specials
    and truncation at ``max_seq_length`` (``sentence_bert_config.json``), ``BertModel``'s last
    hidden state, pooled (mean over the attention mask, CLS or max, from the Pooling
    module's ``config.json``), then ``torch.nn.functional.normalize`` when a Normalize module
    follows. One text per forward, so there is no padding to mask."""
    import json as _json

    from transformers import AutoModel, AutoTokenizer

    path = os.path.abspath(hf_dir)
    if not is_encoder_dir(path):
        raise InputError(f"{hf_dir}: not an encoder checkpoint (config.json architectures must name BertModel)")
    quiet_transformers(False)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, dtype=torch.float32, attn_implementation="eager", local_files_only=True)
    model.eval()

    def read(rel: str) -> Any:
        p = os.path.join(path, rel)
        if not os.path.isfile(p):
            return None
        with open(p, encoding="utf-8") as f:
            return _json.load(f)

    max_length = model.config.max_position_embeddings
    pooling, normalize = "mean", False
    for m in read("modules.json") or []:
        kind = m.get("type", "").rsplit(".", 1)[-1]
        sub = m.get("path", "")
        if kind == "Transformer":
            st = read(os.path.join(sub, "sentence_bert_config.json")) or {}
            max_length = min(int(st.get("max_seq_length", max_length)), max_length)
        elif kind == "Pooling":
            cfg = read(os.path.join(sub, "config.json")) or {}
            modes = [k for k in ("mean_tokens", "cls_token", "max_tokens") if cfg.get("pooling_mode_" + k)]
            if len(modes) != 1:
                raise InputError(f"{sub}/config.json: expected one of mean/cls/max pooling, found {modes}")
            pooling = {"mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max"}[modes[0]]
        elif kind == "Normalize":
            normalize = True
        else:
            raise InputError(f"modules.json: module type {m.get('type')!r} is not supported")
    vectors, counts = [], []
    with torch.no_grad():
        for text in texts:
            enc = tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")
            states = model(**enc).last_hidden_state[0]
            mask = enc["attention_mask"][0].unsqueeze(-1).to(states.dtype)
            if pooling == "mean":
                # sentence-transformers' Pooling: sum(states * mask) / clamp(sum(mask), 1e-9).
                v = (states * mask).sum(0) / torch.clamp(mask.sum(0), min=1e-9)
            elif pooling == "cls":
                v = states[0]
            else:
                v = states.max(0).values
            if normalize:
                v = torch.nn.functional.normalize(v, p=2, dim=0)
            vectors.append([float(x) for x in v])
            counts.append(int(enc["input_ids"].shape[1]))
    return {"embeddings": vectors, "tokens": counts, "pooling": pooling, "normalized": normalize, "max_tokens": max_length}
