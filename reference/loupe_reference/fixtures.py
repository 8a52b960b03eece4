"""Test fixtures written by the reference stack for loupe's Rust tests.

``make-tiny``: a tiny random Llama checkpoint directory (config.json, model.safetensors, the
SmolLM2 tokenizer files), so the HF-directory path of both sides can be compared in seconds.

``save-pt``: tensors written with ``torch.save`` and ``numpy.save`` plus ``expected.json`` with
their values, so the Rust readers of ``.pt`` / ``.npy`` / ``.npz`` can be checked against the
real writers.
"""

from __future__ import annotations

import json
import os
from typing import Any

import loupe_reference  # noqa: F401  (offline environment first)
from loupe_reference import InputError

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The tiny model's shape (make-tiny).
TINY = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=2048,
)
# Llama 3 RoPE scaling for make-tiny --rope-scaling llama3. original_max_position_embeddings is
# small so that, with head_dim 16 and theta 1e4, the 8 frequencies fall in all three regimes
# (wavelengths 6.3 .. 19869: 3 kept, 1 interpolated, 4 divided by the factor).
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=256)
WEIGHT_STD = 0.15  # projection and embedding weights ~ N(0, 0.15^2)
NORM_JITTER = 0.1  # norm weights 1 + N(0, 0.1^2), so a loader that ignores them is caught


def default_tokenizer_gguf() -> str:
    """The SmolLM2 GGUF: $LOUPE_MODEL, else loupe's cache path (as crates/loupe-cli/tests/common.rs)."""
    env = os.environ.get("LOUPE_MODEL")
    if env:
        return env
    return os.path.join(_cache_root(), "models", DEFAULT_MODEL_FILE)


def _cache_root() -> str:
    base = os.environ.get("LOUPE_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = os.path.join(xdg, "loupe") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "loupe")
    return base


def cached_gguf_tokenizer(gguf: str) -> Any:
    """The GGUF's tokenizer as transformers builds it, converted once (5-7 s of gguf-py parsing)
    and kept as an HF tokenizer directory under ``<loupe cache>/tokenizers/``, keyed by the file's
    name, size and mtime. Written atomically (concurrent tests may race); falls back to the direct
    conversion when the cache is not writable."""
    import shutil
    import tempfile

    from loupe_reference import model as M

    st = os.stat(gguf)
    key = f"{os.path.basename(gguf)}-{st.st_size}-{st.st_mtime_ns}"
    cache = os.path.join(_cache_root(), "tokenizers", key)
    if os.path.isfile(os.path.join(cache, "tokenizer.json")):
        return M.load_tokenizer(cache)
    tok = M.load_tokenizer(gguf)
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=key + ".tmp-", dir=os.path.dirname(cache))
        try:
            tok.save_pretrained(tmp)
            os.rename(tmp, cache)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
    except OSError:
        pass
    return tok


# make-tiny --family: the transformers classes of each family built with the tiny shape.
FAMILIES = ("llama", "qwen2", "mistral", "qwen3", "gemma3", "gemma2", "qwen3_moe", "glm4_moe", "phi3", "seed_oss",
            "hunyuan_v1_moe")
MOE_FAMILIES = ("qwen3_moe", "glm4_moe", "hunyuan_v1_moe")
GEMMA_FAMILIES = ("gemma3", "gemma2")
# Gemma 3's tiny shape beyond TINY: query_pre_attn_scalar differs from head_dim (16) so the
# attention scale is tested; the global RoPE base differs from the sliding layers' one.
GEMMA3_QUERY_PRE_ATTN_SCALAR = 24
GEMMA3_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
# Gemma 2's tiny shape beyond TINY: query_pre_attn_scalar 8 (not head_dim 16) puts the scaled
# attention scores at a few units, so an attention soft-cap of 3 flattens the larger ones; the
# final cap of 5 bends logits of up to about 6 (both caps change greedy or sampled tokens).
GEMMA2_QUERY_PRE_ATTN_SCALAR = 8
GEMMA2_ATTN_SOFTCAP = 3.0
GEMMA2_FINAL_SOFTCAP = 5.0
# The MoE families' tiny shape beyond TINY: 8 experts of width 32, 2 per token, so a prompt of a
# dozen tokens reaches every expert. Qwen3-MoE: layer 0 sparse, layer 1 dense (mlp_only_layers),
# renormalized top-k. GLM-4-MoE: layer 0 dense (first_k_dense_replace 1), layer 1 sparse with 4
# groups of 2 experts of which a token may use 2, one shared expert, GLM-4.5's scaling 2.5,
# q/k norms and q/k/v biases on; partial_rotary_factor 1.0 (loupe refuses GLM's default 0.5).
MOE_EXPERTS = dict(num_experts_per_tok=2, moe_intermediate_size=32)
QWEN3_MOE = dict(num_experts=8, decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=True)
GLM4_MOE = dict(n_routed_experts=8, n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=1,
                routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=True, attention_bias=True)
# Hunyuan-MoE's tiny shape beyond TINY: every layer sparse (HunYuanMoEV1DecoderLayer), 8 experts
# and the shared MLP both intermediate_size (32) wide, top 2 given per layer as released
# checkpoints give it (a list; HunYuanMoEV1Gate indexes it by layer). With --rope-scaling dynamic,
# RoPE as Hunyuan-A13B's config has it: `dynamic` with alpha 1000 (a fixed base of
# theta * alpha^(hd / (hd - 2)), HunYuanMoEV1RotaryEmbedding's ntk_alpha; the `factor` is unused
# but required by transformers' validation of `dynamic`).
HUNYUAN_MOE = dict(num_experts=8, intermediate_size=32)
HUNYUAN_TOPK = 2
HUNYUAN_ROPE = dict(rope_type="dynamic", alpha=1000.0, factor=1.0)
# Router weights ~ N(0, 0.15^2) give logits of std ~1.2 over hidden 64 (spread, not one expert
# always winning); the selection-only correction bias ~ N(0, 0.05^2) moves the choice of experts whose
# sigmoid scores are close (dropping it changes tokens) without one expert taking every token.
CORRECTION_BIAS_STD = 0.05
# Phi-3's LongRoPE for make-tiny --family phi3 --rope-scaling longrope: a short original length
# (PHI3_ORIGINAL_MAX_POSITIONS) so that a chat prompt is past it at prefill and a raw one
# crosses it while generating; max_position_embeddings 2048 / 16 = 128 gives the default
# attention factor sqrt(1 + ln 128 / ln 16) ~ 1.66. The factors (rotary_dim / 2 of each) differ
# from 1 and from each other, so a loader that ignores either set, or the switch, is caught.
PHI3_ORIGINAL_MAX_POSITIONS = 16
PHI3_SHORT_FACTOR = (1.0, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 10.0)
PHI3_LONG_FACTOR = (1.0, 2.0, 5.0, 12.0, 30.0, 70.0, 160.0, 400.0)


def _family_classes(family: str) -> tuple[Any, Any]:
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaConfig, LlamaForCausalLM
    if family == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        return Qwen2Config, Qwen2ForCausalLM
    if family == "mistral":
        from transformers import MistralConfig, MistralForCausalLM

        return MistralConfig, MistralForCausalLM
    if family == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        return Qwen3Config, Qwen3ForCausalLM
    if family == "gemma3":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        return Gemma3TextConfig, Gemma3ForCausalLM
    if family == "gemma2":
        from transformers import Gemma2Config, Gemma2ForCausalLM

        return Gemma2Config, Gemma2ForCausalLM
    if family == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        return Qwen3MoeConfig, Qwen3MoeForCausalLM
    if family == "glm4_moe":
        from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

        return Glm4MoeConfig, Glm4MoeForCausalLM
    if family == "phi3":
        from transformers import Phi3Config, Phi3ForCausalLM

        return Phi3Config, Phi3ForCausalLM
    if family == "seed_oss":
        from transformers import SeedOssConfig, SeedOssForCausalLM

        return SeedOssConfig, SeedOssForCausalLM
    if family == "hunyuan_v1_moe":
        from transformers import HunYuanMoEV1Config, HunYuanMoEV1ForCausalLM

        return HunYuanMoEV1Config, HunYuanMoEV1ForCausalLM
    raise InputError(f"--family must be one of {', '.join(FAMILIES)}, got {family!r}")


def tiny_config(vocab_size: int, tie: bool, rope_scaling: str, layers: int, bos: int | None, eos: int | None,
                attention_bias: bool = False, mlp_bias: bool = False, hidden_act: str = "silu",
                family: str = "llama", sliding_window: int | None = None, partial_rotary: float | None = None) -> Any:
    config_cls, _ = _family_classes(family)
    if (family not in ("llama", "qwen3", "seed_oss") and attention_bias) or (family != "llama" and mlp_bias):
        # Qwen2's biases are fixed by its architecture (q/k/v yes, o and MLP no); Qwen3 reads
        # attention_bias only.
        raise InputError(f"--attention-bias/--mlp-bias do not apply to the {family} family")
    kw: dict[str, Any] = dict(TINY)
    kw.update(
        vocab_size=int(vocab_size),
        num_hidden_layers=int(layers),
        tie_word_embeddings=bool(tie),
        bos_token_id=bos,
        eos_token_id=eos,
    )
    if family in GEMMA_FAMILIES:
        # Gemma's key; the gate's activation is GELU-tanh unless told otherwise.
        kw.update(hidden_activation="gelu_pytorch_tanh" if hidden_act == "silu" else hidden_act)
    else:
        kw.update(hidden_act=hidden_act)
    if family == "llama":
        kw.update(attention_bias=bool(attention_bias), mlp_bias=bool(mlp_bias))
    if family == "qwen3":
        kw.update(attention_bias=bool(attention_bias))
    if family == "seed_oss":
        # SeedOssConfig's own defaults: q/k/v biases on, o_proj's off; --attention-bias adds
        # o_proj's (`attention_out_bias`).
        if attention_bias:
            kw.update(attention_out_bias=True)
    if family == "qwen3_moe":
        kw.update(MOE_EXPERTS, **QWEN3_MOE)
    if family == "glm4_moe":
        kw.update(MOE_EXPERTS, **GLM4_MOE)
        kw.update(rope_parameters={"rope_type": "default", "rope_theta": kw.pop("rope_theta"), "partial_rotary_factor": 1.0})
        if rope_scaling != "none":
            raise InputError("--rope-scaling does not apply to the glm4_moe family")
    if family == "hunyuan_v1_moe":
        kw.update(HUNYUAN_MOE, moe_topk=[HUNYUAN_TOPK] * int(layers))
        if rope_scaling == "dynamic":
            kw.update(rope_parameters=dict(HUNYUAN_ROPE, rope_theta=kw.pop("rope_theta")))
            rope_scaling = "none"
    elif rope_scaling == "dynamic":
        raise InputError(f"--rope-scaling dynamic (NTK-alpha) applies to the hunyuan_v1_moe family only, not {family}")
    if family == "mistral":
        # MistralConfig defaults to a 4096 window; the tiny model's is given or none.
        kw.update(sliding_window=int(sliding_window) if sliding_window else None)
    elif family == "gemma3":
        # Even layers slide (window given, default 8), odd ones attend globally, so both layer
        # types and both RoPE bases appear in a 2-layer model.
        kw.pop("rope_theta")
        kw.update(sliding_window=int(sliding_window or 8),
                  layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(int(layers))],
                  query_pre_attn_scalar=GEMMA3_QUERY_PRE_ATTN_SCALAR,
                  rope_parameters={k: dict(v) for k, v in GEMMA3_ROPE.items()})
        if rope_scaling != "none":
            raise InputError("--rope-scaling does not apply to the gemma3 family")
    elif family == "gemma2":
        # Layers 0, 2, ... slide (Gemma2Config's own rule, left to it), one RoPE base for all.
        kw.update(sliding_window=int(sliding_window or 8),
                  query_pre_attn_scalar=GEMMA2_QUERY_PRE_ATTN_SCALAR,
                  attn_logit_softcapping=GEMMA2_ATTN_SOFTCAP,
                  final_logit_softcapping=GEMMA2_FINAL_SOFTCAP)
        if rope_scaling != "none":
            raise InputError("--rope-scaling does not apply to the gemma2 family")
    elif family == "phi3":
        # Fused qkv_proj and gate_up_proj; Phi3Config has no head_dim (hidden / heads = 16).
        kw.pop("head_dim")
        kw.update(sliding_window=int(sliding_window) if sliding_window else None,
                  pad_token_id=None)
        params: dict[str, Any] = {"rope_type": "default", "rope_theta": kw.pop("rope_theta")}
        if partial_rotary is not None:
            params["partial_rotary_factor"] = float(partial_rotary)
        if rope_scaling == "longrope":
            half = int(TINY["head_dim"] * (partial_rotary or 1.0)) // 2
            params.update(rope_type="longrope", short_factor=list(PHI3_SHORT_FACTOR[:half]),
                          long_factor=list(PHI3_LONG_FACTOR[:half]))
            kw.update(original_max_position_embeddings=PHI3_ORIGINAL_MAX_POSITIONS)
        elif rope_scaling != "none":
            raise InputError(f"--rope-scaling for phi3 must be longrope or none, got {rope_scaling!r}")
        kw.update(rope_parameters=params)
        rope_scaling = "none"
    elif sliding_window:
        raise InputError(f"--sliding-window applies to the mistral, gemma3, gemma2 and phi3 families only, not {family}")
    if partial_rotary is not None and family != "phi3":
        raise InputError(f"--partial-rotary applies to the phi3 family only, not {family}")
    if rope_scaling == "llama3":
        kw["rope_scaling"] = dict(LLAMA3_ROPE)
    elif rope_scaling != "none":
        raise InputError(f"--rope-scaling must be llama3 or none (longrope: phi3; dynamic: hunyuan_v1_moe), got {rope_scaling!r}")
    return config_cls(**kw)


def make_tiny(out: str, seed: int = 0, tie: bool = False, rope_scaling: str = "none", layers: int = 2,
              tokenizer_gguf: str | None = None, attention_bias: bool = False, mlp_bias: bool = False,
              hidden_act: str = "silu", family: str = "llama", sliding_window: int | None = None,
              partial_rotary: float | None = None) -> list[str]:
    """Write the tiny random checkpoint of ``family`` (llama, qwen2) into ``out`` (created; must
    not hold a config.json). Biases (``attention_bias``, ``mlp_bias``, Qwen2's q/k/v) are random
    like the weights."""
    import torch

    from loupe_reference import model as M

    if layers < 1:
        raise InputError("--layers must be >= 1")
    gguf = tokenizer_gguf or default_tokenizer_gguf()
    if not os.path.isfile(gguf):
        raise InputError(f"{gguf}: no such file (the SmolLM2 GGUF supplies the tokenizer; set LOUPE_MODEL or --tokenizer-gguf)")
    if os.path.exists(os.path.join(out, "config.json")):
        raise InputError(f"{out}: already holds a checkpoint (config.json)")
    M.quiet_transformers(False)
    _, model_cls = _family_classes(family)

    tok = cached_gguf_tokenizer(gguf)
    from transformers.activations import ACT2FN

    if hidden_act not in ACT2FN:
        raise InputError(f"--hidden-act: unknown activation {hidden_act!r}")
    config = tiny_config(len(tok), tie, rope_scaling, layers, tok.bos_token_id, tok.eos_token_id,
                         attention_bias=attention_bias, mlp_bias=mlp_bias, hidden_act=hidden_act, family=family,
                         sliding_window=sliding_window, partial_rotary=partial_rotary)
    torch.manual_seed(int(seed))
    with torch.device("meta"):
        meta = model_cls(config)
    # Deterministic weights from the seed, independent of transformers' init code: parameters in
    # name order, tied ones once.
    gen = torch.Generator().manual_seed(int(seed))
    state = {}
    for name, p in sorted(meta.state_dict().items()):
        if tie and name == "lm_head.weight":
            continue
        if name.endswith("e_score_correction_bias"):
            state[name] = CORRECTION_BIAS_STD * torch.randn(p.shape, generator=gen, dtype=torch.float32)
        elif name.endswith("norm.weight"):
            # RMSNorm weights, the per-head q/k norms included; Gemma's norms scale by
            # 1 + weight, so theirs are centred on 0.
            centre = 0.0 if family in GEMMA_FAMILIES else 1.0
            state[name] = centre + NORM_JITTER * torch.randn(p.shape, generator=gen, dtype=torch.float32)
        else:
            state[name] = WEIGHT_STD * torch.randn(p.shape, generator=gen, dtype=torch.float32)
    model = model_cls(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    bad = [k for k in missing if not (tie and k == "lm_head.weight")]
    if bad or unexpected:
        raise RuntimeError(f"tiny model state mismatch: missing {bad}, unexpected {unexpected}")
    if tie:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.eval()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return sorted(os.listdir(out))


# ---------------------------------------------------------------------------------- save-pt


def _tensor_record(t: Any) -> dict[str, Any]:
    """dtype, shape, stride, storage offset and the values in logical row-major order."""
    import torch

    names = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
             torch.int64: "i64", torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool"}
    flat = t.contiguous().reshape(-1)
    if t.is_floating_point():
        values = [float(x) for x in flat.to(torch.float64).tolist()]
    elif t.dtype == torch.bool:
        values = [bool(x) for x in flat.tolist()]
    else:
        values = [int(x) for x in flat.tolist()]
    return {
        "dtype": names[t.dtype],
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "storage_offset": int(t.storage_offset()),
        "contiguous": bool(t.is_contiguous()),
        "values": values,
    }


def _array_record(a: Any) -> dict[str, Any]:
    import numpy as np

    names = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.float64): "f64",
             np.dtype(np.int64): "i64", np.dtype(np.int32): "i32", np.dtype(np.uint8): "u8", np.dtype(np.bool_): "bool",
             np.dtype(">f4"): "f32"}
    flat = np.asarray(a).reshape(-1, order="C")
    if flat.dtype.kind == "f":
        values = [float(x) for x in flat.astype(np.float64)]
    elif flat.dtype.kind == "b":
        values = [bool(x) for x in flat]
    else:
        values = [int(x) for x in flat]
    return {
        "dtype": names[a.dtype],
        "shape": list(a.shape),
        "fortran_order": bool(a.flags.f_contiguous and not a.flags.c_contiguous),
        "byte_order": "big" if a.dtype.byteorder == ">" else "little",
        "values": values,
    }


def save_pt(out: str) -> dict[str, Any]:
    """Write the torch/numpy fixture files and expected.json into ``out``; returns expected.json.

    Files (all small, deterministic):
      single.pt           torch.save(tensor f32 [2, 3])
      state_dict.pt       torch.save({"w_f32": f32 [3, 4], "w_f16": f16 [4], "w_bf16": bf16 [2, 2],
                                      "ids_i64": i64 [5] (values beyond 2^53), "scalar_f32": f32 []})
      noncontig.pt        torch.save(a view: base[1:3, 1::2].t(), shape [3, 2], stride [2, 6], offset 7;
                                     torch saves the whole 4x6 storage)
      shared.pt           torch.save({"a": base, "b": base[1]}): two tensors sharing one storage
      module_state.pt     torch.save(nn.Linear(3, 2).state_dict()): an OrderedDict with `_metadata`
                          ("weight" f32 [2, 3], "bias" f32 [2])
      list.pt             torch.save([f32 [2], i64 [3]])
      single.npy          numpy.save(f32 [2, 3])      (same values as single.pt)
      f16.npy, i64.npy    numpy.save of state_dict.pt's w_f16 and ids_i64
      fortran.npy         numpy.save(a transposed f32 [3, 2] array) -> header fortran_order: True
      bigendian.npy       numpy.save(">f4" [4])
      arrays.npz          numpy.savez(x=f32 [2, 3], y=i64 [3])              (stored zip members)
      arrays_compressed.npz  numpy.savez_compressed(same)                  (deflated members)
    expected.json:
      {"format": "loupe-pt-fixtures", "version": 1, "torch": ..., "numpy": ...,
       "files": {FILE: {"kind": "tensor"|"dict"|"list"|"npy"|"npz",
                        "tensors": {KEY: {"dtype", "shape", "values" (row-major, logical order),
                                          + "stride", "storage_offset", "contiguous" for .pt,
                                          + "fortran_order", "byte_order" for .npy/.npz}}}}}
      KEY is "" for a single tensor, the dict key, the list index as a string, or the npz member name
      (without ".npy").
    """
    import numpy as np
    import torch

    os.makedirs(out, exist_ok=True)
    files: dict[str, Any] = {}

    single = torch.tensor([[1.5, -2.25, 3.0], [0.1, 1e-8, -7e30]], dtype=torch.float32)
    torch.save(single, os.path.join(out, "single.pt"))
    files["single.pt"] = {"kind": "tensor", "tensors": {"": _tensor_record(single)}}

    sd = {
        "w_f32": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 8 - 0.5,
        "w_f16": torch.tensor([0.5, -1.0, 65504.0, 6.1035e-05], dtype=torch.float16),
        "w_bf16": torch.tensor([[1.0, -2.5], [3.140625, 1e38]], dtype=torch.bfloat16),
        "ids_i64": torch.tensor([0, -5, 2**40 + 1, 2**62 + 3, -(2**63)], dtype=torch.int64),
        "scalar_f32": torch.tensor(42.5, dtype=torch.float32),
    }
    torch.save(sd, os.path.join(out, "state_dict.pt"))
    files["state_dict.pt"] = {"kind": "dict", "tensors": {k: _tensor_record(v) for k, v in sd.items()}}

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base[1:3, 1::2].t()
    assert not view.is_contiguous() and view.storage_offset() == 7
    torch.save(view, os.path.join(out, "noncontig.pt"))
    files["noncontig.pt"] = {"kind": "tensor", "tensors": {"": _tensor_record(view)}}

    shared = {"a": base, "b": base[1]}
    torch.save(shared, os.path.join(out, "shared.pt"))
    files["shared.pt"] = {"kind": "dict", "tensors": {k: _tensor_record(v) for k, v in shared.items()}}

    # What real checkpoints hold: a module's state_dict (an OrderedDict carrying a `_metadata`
    # attribute, pickled with BUILD), here of a Linear(3, 2) with fixed weights.
    lin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.5, -1.0, 2.0], [0.0, 0.25, -0.125]]))
        lin.bias.copy_(torch.tensor([1.0, -1.0]))
    msd = lin.state_dict()
    torch.save(msd, os.path.join(out, "module_state.pt"))
    files["module_state.pt"] = {"kind": "dict", "tensors": {k: _tensor_record(v) for k, v in msd.items()}}

    lst = [torch.tensor([0.25, -0.75], dtype=torch.float32), torch.tensor([7, 8, 9], dtype=torch.int64)]
    torch.save(lst, os.path.join(out, "list.pt"))
    files["list.pt"] = {"kind": "list", "tensors": {str(i): _tensor_record(t) for i, t in enumerate(lst)}}

    def npy(name: str, arr: Any) -> None:
        np.save(os.path.join(out, name), arr, allow_pickle=False)
        files[name] = {"kind": "npy", "tensors": {"": _array_record(arr)}}

    npy("single.npy", single.numpy())
    npy("f16.npy", sd["w_f16"].numpy())
    npy("i64.npy", sd["ids_i64"].numpy())
    fortran = np.arange(6, dtype=np.float32).reshape(2, 3).T  # [3, 2], Fortran-contiguous
    npy("fortran.npy", fortran)
    npy("bigendian.npy", np.array([1.0, -2.0, 0.5, 3e-5], dtype=">f4"))

    members = {"x": single.numpy(), "y": np.array([3, 1, 4], dtype=np.int64)}
    np.savez(os.path.join(out, "arrays.npz"), **members)
    files["arrays.npz"] = {"kind": "npz", "tensors": {k: _array_record(v) for k, v in members.items()}}
    np.savez_compressed(os.path.join(out, "arrays_compressed.npz"), **members)
    files["arrays_compressed.npz"] = {"kind": "npz", "tensors": {k: _array_record(v) for k, v in members.items()}}

    expected = {
        "format": "loupe-pt-fixtures",
        "version": 1,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "files": files,
    }
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, allow_nan=False)
        f.write("\n")
    return expected
