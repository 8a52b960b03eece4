"""Capturing named activations with forward hooks: the reference side of ``loupe dump``.

Every module of ``model.named_modules()`` (except the root) gets a forward hook that records its
OUTPUT (a tuple output: element 0; ``ModelOutput`` containers are skipped), with the batch
dimension squeezed, so a hidden state is ``[T, D]``. Beside the module outputs, the points that
loupe names but PyTorch has no module for are captured under loupe's names:

=========================================  ==========================================================
``model.layers.N.self_attn.q_rope``        q after RoPE (``apply_rotary_pos_emb``'s output), ``[T, H*hd]``
``model.layers.N.self_attn.k_rope``        k after RoPE, ``[T, KVH*hd]``
``model.layers.N.self_attn.attn_probs``    eager attention's softmax probabilities, ``[H, T, ctx]``
``model.layers.N.self_attn.attn_output``   the input of ``o_proj`` (forward pre-hook), ``[T, H*hd]``
``model.layers.N.attn_residual``           the input of ``post_attention_layernorm`` (pre-hook; in layers with
                                           Gemma's sandwich norms, of ``pre_feedforward_layernorm``)
``model.layers.N.mlp.act_mul``             the input of ``down_proj`` (pre-hook; also ``mlp.shared_experts.act_mul``,
                                           Hunyuan's ``mlp.shared_mlp.act_mul``)
``model.layers.N.mlp.gate.top_k_index``    a MoE router's chosen experts (element 2 of its output tuple), each
                                           token's ids in ascending order, as float32 (loupe's layout)
``model.layers.N.mlp.gate.top_k_weights``  their weights (element 1), in the same order
``model.layers.N.self_attn.qkv_proj.q``    Phi-3: the q, k and v columns of the fused ``qkv_proj``'s output
(``.k``, ``.v``)                           (as ``Phi3Attention.forward`` slices it), ``[T, H*hd]`` / ``[T, KVH*hd]``
``model.layers.N.mlp.gate_up_proj.gate``   Phi-3: the two halves of ``gate_up_proj``'s output (``chunk(2)``)
(``.up``)
``logits``                                 the model output's ``logits`` where they differ from ``lm_head``'s
                                           output: soft-capped by ``config.final_logit_softcapping`` (Gemma 2)
=========================================  ==========================================================

``model.layers.N.self_attn`` (the attention module's output) equals ``.o_proj``'s output; both are
recorded. RoPE and attention probabilities are captured by temporarily replacing
``apply_rotary_pos_emb`` and ``eager_attention_forward`` in the modeling module of each attention
class (Llama-family code), restored on exit.

A module called more than once in one step records ``name``, then ``name(1)``, ``name(2)``, ...
(MAX's convention: the k-th extra call gets ``(k)``), so no capture overwrites another
(docs/parity-protocol.md, false cliff 3).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from loupe_reference.dumpfmt import Entry

# Axis names, as loupe's graph names them.
HIDDEN = ["token", "hidden"]
FEATURE = ["token", "feature"]


def axes_for(name: str, ndim: int, module: nn.Module | None = None) -> list[str]:
    base = re.sub(r"\(\d+\)$", "", name)
    if base.endswith(".attn_probs") and ndim == 3:
        return ["head", "query", "key"]
    if ndim != 2:
        return [f"dim{i}" for i in range(ndim)]
    if base.endswith((".top_k_index", ".top_k_weights")):
        return ["token", "expert"]
    if base.endswith(".q_rope") or base.endswith(".attn_output"):
        return ["token", "head*head_dim"]
    if base.endswith(".k_rope"):
        return ["token", "kv_head*head_dim"]
    if base in ("lm_head", "logits") or base.endswith(".lm_head"):
        return ["token", "vocab"]
    if base.endswith("rotary_emb"):
        return ["token", "head_dim"]
    if isinstance(module, nn.Linear) or base.endswith((".act_fn", ".activation_fn", ".act_mul", ".mlp", ".self_attn",
                                                       ".qkv_proj.q", ".qkv_proj.k", ".qkv_proj.v",
                                                       ".gate_up_proj.gate", ".gate_up_proj.up")):
        return FEATURE
    return HIDDEN


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None  # ModelOutput (a dict), None, ...


def _pre_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    for v in kwargs.values():
        if isinstance(v, torch.Tensor):
            return v
    return None


def squeeze_batch(t: torch.Tensor) -> torch.Tensor:
    """Drop a leading batch dimension of size 1 (``[1, T, D] -> [T, D]``)."""
    if t.dim() >= 2 and t.shape[0] == 1:
        return t[0]
    return t


def heads_to_tokens(t: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, hd]`` (batch 1) -> ``[T, H*hd]``, heads in order."""
    if t.dim() == 4:
        b, h, tt, hd = t.shape
        return squeeze_batch(t.transpose(1, 2).reshape(b, tt, h * hd))
    return squeeze_batch(t)


# Attention classes that apply q_norm/k_norm after moving heads first (``[B, H, T, hd]``;
# ``modeling_gemma3.py``). Qwen3 norms ``[B, T, H, hd]``, loupe's layout, so only these are
# transposed on capture.
HEADS_FIRST_QK_NORM = ("Gemma3Attention",)


def heads_first_to_token_major(t: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, hd]`` (batch 1) -> ``[T, H, hd]``, the layout loupe's q/k norms have."""
    if t.dim() == 4:
        return squeeze_batch(t.transpose(1, 2))
    return squeeze_batch(t)


class Recorder:
    """Hooks on a model that turn every forward into named ``Entry``s.

    ``taps``: regular expressions (``re.search`` on the name without a ``(k)`` suffix); a tensor is
    kept when any matches (all when None). ``native``: keep float16/bfloat16 values in their dtype
    (bf16 as raw bits); otherwise every floating tensor is stored as float32.
    """

    def __init__(self, model: nn.Module, taps: Sequence[str] | None = None, native: bool = False,
                 sink: Callable[[Entry], None] | None = None):
        self.model = model
        self.sink = sink  # when set, each entry goes there (a file writer, a printer) instead of ``entries``
        self.taps = [re.compile(t) for t in taps] if taps else None
        self.native = native
        self.entries: list[Entry] = []
        self.step = 0
        self.order = 0
        self._calls: dict[str, int] = {}
        self._attn_stack: list[str] = []
        self._attn_names: dict[int, str] = {}
        self._handles: list[Any] = []
        self._patches: list[tuple[Any, str, Any]] = []
        self.fired: set[str] = set()

    # ------------------------------------------------------------------ capture
    def wants(self, name: str) -> bool:
        return self.taps is None or any(p.search(name) for p in self.taps)

    def begin_step(self, step: int) -> None:
        self.step = step
        self._calls = {}

    def record(self, name: str, tensor: torch.Tensor, layout: Callable[[torch.Tensor], torch.Tensor] = squeeze_batch,
               module: nn.Module | None = None) -> None:
        k = self._calls.get(name, 0)
        self._calls[name] = k + 1
        self.fired.add(name)
        if not self.wants(name):
            return
        label = name if k == 0 else f"{name}({k})"
        t = layout(tensor.detach())
        arr, dtype = self._to_numpy(t)
        e = Entry(label, self.step, self.order, arr, dtype, axes_for(label, arr.ndim, module))
        self.order += 1
        if self.sink is not None:
            self.sink(e)
        else:
            self.entries.append(e)

    def _to_numpy(self, t: torch.Tensor) -> tuple[np.ndarray, str]:
        t = t.to("cpu")
        if t.is_floating_point():
            if self.native and t.dtype == torch.bfloat16:
                return t.contiguous().view(torch.int16).numpy().view(np.uint16).copy(), "bf16"
            if self.native and t.dtype in (torch.float16, torch.float64):
                arr = t.contiguous().numpy().copy()
                return arr, "f16" if t.dtype == torch.float16 else "f64"
            return t.to(torch.float32).contiguous().numpy().copy(), "f32"
        if t.dtype == torch.bool:
            return t.contiguous().numpy().copy(), "bool"
        arr = t.contiguous().numpy().copy()
        from loupe_reference.dumpfmt import dtype_name

        return arr, dtype_name(arr)

    # ------------------------------------------------------------------ hooks
    def __enter__(self) -> "Recorder":
        if getattr(getattr(self.model, "config", None), "final_logit_softcapping", None) is not None:
            # The capped logits come from the root's forward, after lm_head's hook.
            self._handles.append(self.model.register_forward_hook(self._logits_hook()))
        for name, module in self.model.named_modules():
            if name == "":
                continue
            leaf = name.rsplit(".", 1)[-1]
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            layout = squeeze_batch
            if leaf in ("q_norm", "k_norm") and type(self.model.get_submodule(parent)).__name__ in HEADS_FIRST_QK_NORM:
                layout = heads_first_to_token_major
            elif leaf in ("query_layernorm", "key_layernorm"):
                # Hunyuan norms q and k after RoPE, heads first (HunYuanMoEV1Attention.forward).
                layout = heads_first_to_token_major
            self._handles.append(module.register_forward_hook(self._output_hook(name, module, layout)))
            if leaf == "self" and parent.endswith(".attention"):
                # BERT's `attention.self` (BertSelfAttention): its probabilities come from the
                # patched eager_attention_forward, named after it.
                self._attn_names[id(module)] = name
                self._patch_attention_module(type(module))
            elif leaf == "LayerNorm" and (parent == "embeddings" or parent.endswith(".attention.output") or parent.endswith(".output")):
                # BERT's residual sums (and the embeddings' sum) are the LayerNorms' inputs;
                # loupe names them after the module that adds them.
                label = "embeddings.add_position" if parent == "embeddings" else parent + ".residual"
                self._handles.append(module.register_forward_pre_hook(self._input_hook(label), with_kwargs=True))
            elif leaf == "self_attn":
                self._attn_names[id(module)] = name
                self._handles.append(module.register_forward_pre_hook(self._attn_enter(name), with_kwargs=True))
                self._patch_attention_module(type(module))
            elif leaf == "o_proj" and parent.endswith("self_attn"):
                self._handles.append(module.register_forward_pre_hook(self._input_hook(parent + ".attn_output"), with_kwargs=True))
            elif leaf == "post_attention_layernorm" and not self._has_sandwich_norms(parent):
                self._handles.append(module.register_forward_pre_hook(self._input_hook(parent + ".attn_residual"), with_kwargs=True))
            elif leaf == "pre_feedforward_layernorm":
                # Gemma's sandwich norms: post_attention_layernorm normalizes attention's output,
                # and the residual sum is the input of the MLP's norm.
                self._handles.append(module.register_forward_pre_hook(self._input_hook(parent + ".attn_residual"), with_kwargs=True))
            elif leaf == "gate" and parent.endswith("mlp") and hasattr(module, "top_k") and not isinstance(module, nn.Linear):
                # A MoE router returns (logits, weights, indices); the hook above records the logits.
                self._handles.append(module.register_forward_hook(self._router_hook(name)))
            elif leaf == "qkv_proj" and parent.endswith("self_attn"):
                self._handles.append(module.register_forward_hook(self._qkv_parts_hook(name, self.model.get_submodule(parent))))
            elif leaf == "gate_up_proj" and parent.endswith("mlp"):
                self._handles.append(module.register_forward_hook(self._gate_up_parts_hook(name)))
            elif leaf == "down_proj" and parent.endswith(("mlp", "mlp.shared_experts", "mlp.shared_mlp")):
                self._handles.append(module.register_forward_pre_hook(self._input_hook(parent + ".act_mul"), with_kwargs=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for mod, attr, orig in reversed(self._patches):
            setattr(mod, attr, orig)
        self._patches.clear()

    def _has_sandwich_norms(self, layer: str) -> bool:
        try:
            return hasattr(self.model.get_submodule(layer), "pre_feedforward_layernorm")
        except AttributeError:
            return False

    def _output_hook(self, name: str, module: nn.Module, layout: Callable[[torch.Tensor], torch.Tensor] = squeeze_batch):
        is_attn = name.rsplit(".", 1)[-1] == "self_attn"

        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            if is_attn and self._attn_stack and self._attn_stack[-1] == name:
                self._attn_stack.pop()
            t = _first_tensor(out)
            if t is not None:
                self.record(name, t, layout=layout, module=module)

        return hook

    def _router_hook(self, name: str):
        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            if not (isinstance(out, tuple) and len(out) == 3):
                return
            weights, indices = out[1], out[2]
            # Sorted by expert id: the order of a router's top-k carries no meaning (the experts
            # loop adds their outputs in id order) and is unspecified for torch.topk(sorted=False),
            # which the GLM / DeepSeek-V3 router asks for.
            order = torch.argsort(indices, dim=-1)
            self.record(name + ".top_k_index", torch.gather(indices, -1, order).to(torch.float32))
            self.record(name + ".top_k_weights", torch.gather(weights, -1, order))

        return hook

    def _qkv_parts_hook(self, name: str, attn: nn.Module):
        """Phi-3's fused projection: its q, k, v columns, sliced as ``Phi3Attention.forward`` does."""
        q_width = attn.config.num_attention_heads * attn.head_dim
        kv_width = attn.num_key_value_heads * attn.head_dim

        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            t = _first_tensor(out)
            if t is not None:
                self.record(name + ".q", t[..., :q_width])
                self.record(name + ".k", t[..., q_width:q_width + kv_width])
                self.record(name + ".v", t[..., q_width + kv_width:])

        return hook

    def _gate_up_parts_hook(self, name: str):
        """Phi-3's fused MLP projection: gate and up, ``chunk(2, dim=-1)`` as ``Phi3MLP.forward``."""
        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            t = _first_tensor(out)
            if t is not None:
                gate, up = t.chunk(2, dim=-1)
                self.record(name + ".gate", gate)
                self.record(name + ".up", up)

        return hook

    def _logits_hook(self):
        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            logits = getattr(out, "logits", None)
            if isinstance(logits, torch.Tensor):
                self.record("logits", logits)

        return hook

    def _attn_enter(self, name: str):
        def hook(mod: nn.Module, args: Any, kwargs: Any) -> None:
            self._attn_stack.append(name)

        return hook

    def _input_hook(self, label: str):
        def hook(mod: nn.Module, args: Any, kwargs: Any) -> None:
            t = _pre_input(args, kwargs)
            if t is not None:
                self.record(label, t)

        return hook

    def _patch_attention_module(self, cls: type) -> None:
        """Wrap the modeling module's apply_rotary_pos_emb / eager_attention_forward (once)."""
        mod = sys.modules.get(cls.__module__)
        if mod is None:
            return
        if any(m is mod for m, _, _ in self._patches):
            return
        rope = getattr(mod, "apply_rotary_pos_emb", None)
        if callable(rope):
            def rope_wrapper(q, k, *args, **kwargs):
                q_embed, k_embed = rope(q, k, *args, **kwargs)
                if self._attn_stack:
                    base = self._attn_stack[-1]
                    self.record(base + ".q_rope", q_embed, layout=heads_to_tokens)
                    self.record(base + ".k_rope", k_embed, layout=heads_to_tokens)
                return q_embed, k_embed

            setattr(mod, "apply_rotary_pos_emb", rope_wrapper)
            self._patches.append((mod, "apply_rotary_pos_emb", rope))
        eager = getattr(mod, "eager_attention_forward", None)
        if callable(eager):
            def eager_wrapper(module, *args, **kwargs):
                out = eager(module, *args, **kwargs)
                name = self._attn_names.get(id(module))
                if name is not None and isinstance(out, tuple) and len(out) > 1 and isinstance(out[1], torch.Tensor):
                    self.record(name + ".attn_probs", out[1])
                return out

            setattr(mod, "eager_attention_forward", eager_wrapper)
            self._patches.append((mod, "eager_attention_forward", eager))


@dataclass
class DumpRun:
    entries: list[Entry]  # empty when a sink took them
    count: int  # tensors captured
    prompt_tokens: list[int]
    decode_tokens: list[int]  # the token fed at decode steps 1..K
    next_token: int | None  # the greedy argmax after the last step
    missing: list[str]  # loupe sub-op names that never fired (e.g. q_rope when RoPE is not patchable)


@torch.no_grad()
def run_dump(model: nn.Module, prompt_ids: Sequence[int], steps: int = 0, teacher: Sequence[int] | None = None,
             taps: Sequence[str] | None = None, native: bool = False,
             sink: Callable[[Entry], None] | None = None) -> DumpRun:
    """Prefill (step 0) and ``steps`` decode steps with a KV cache, recording every forward.

    Decode step k feeds one token (``teacher[k-1]``, else the greedy argmax of the previous
    step's last logits) with the attention mask extended to ``len(prompt) + k`` (false cliff 2)."""
    if not prompt_ids:
        raise ValueError("empty input: the prompt produced no tokens")
    if teacher is not None and len(teacher) < steps:
        raise ValueError(f"--teacher-force gives {len(teacher)} tokens for {steps} steps")
    from transformers import DynamicCache

    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    from loupe_reference.model import is_encoder

    if is_encoder(model):
        # An encoder runs its input once; there is no next token to decode.
        if steps > 0:
            raise ValueError(f"{type(model).__name__} is an encoder: it has no decode steps (--steps must be 0)")
        with Recorder(model, taps=taps, native=native, sink=sink) as rec:
            rec.begin_step(0)
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
            entries, count = rec.entries, rec.order
        return DumpRun(entries, count, list(prompt_ids), [], None, [])
    cache = DynamicCache(config=model.config) if steps > 0 else None
    fed: list[int] = []
    with Recorder(model, taps=taps, native=native, sink=sink) as rec:
        rec.begin_step(0)
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache, use_cache=steps > 0)
        logits = out.logits[0, -1]
        for k in range(1, steps + 1):
            tok = int(teacher[k - 1]) if teacher is not None else int(torch.argmax(logits.float()))
            fed.append(tok)
            rec.begin_step(k)
            step_ids = torch.tensor([[tok]], dtype=torch.long)
            mask = torch.ones((1, len(prompt_ids) + k), dtype=torch.long)
            out = model(input_ids=step_ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[0, -1]
        fired = set(rec.fired)
        entries, count = rec.entries, rec.order
    expected = [s for s in (".q_rope", ".k_rope", ".attn_probs") if any(n.endswith(".self_attn") for n in fired)]
    missing = [s for s in expected if not any(n.endswith(s) for n in fired)]
    return DumpRun(entries, count, list(prompt_ids), fed, int(torch.argmax(logits.float())), missing)
