"""max.nn.hooks.PrintHook on a tiny max.nn (V2) model shaped like a 2-layer Llama block stack
(LayerList of blocks with self_attn.{qkv_proj,o_proj}, mlp.{gate,up,down}_proj, norms, lm_head),
run under BINARY_MAX_CHECKPOINT. Run with the MAX venv's python: `hook.py OUTDIR`; writes
OUTDIR/max (the .max files) and prints what the hook recorded."""

import os
import sys

import numpy as np


def main():
    out = sys.argv[1]
    from max.driver import CPU, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops
    from max.nn import Linear, RMSNorm
    from max.nn.hooks import PrintHook
    from max.nn.layer import LayerList, Module

    dev, f32 = DeviceRef.CPU(), DType.float32
    D, H, KV, HD, F, V = 8, 2, 1, 4, 12, 11  # hidden, heads, kv heads, head dim, ffn, vocab

    class Attention(Module):
        def __init__(self):
            super().__init__()
            self.qkv_proj = Linear(D, (H + 2 * KV) * HD, f32, dev)
            self.o_proj = Linear(H * HD, D, f32, dev)

        def __call__(self, x):
            qkv = self.qkv_proj(x)
            q = qkv[:, : H * HD]
            v = qkv[:, (H + KV) * HD :]
            return self.o_proj(q * ops.concat([v, v], axis=1))

    class Mlp(Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = Linear(D, F, f32, dev)
            self.up_proj = Linear(D, F, f32, dev)
            self.down_proj = Linear(F, D, f32, dev)

        def __call__(self, x):
            return self.down_proj(ops.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm(D, f32, 1e-5)
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm(D, f32, 1e-5)
            self.mlp = Mlp()

        def __call__(self, x):
            h = x + self.self_attn(self.input_layernorm(x))
            return h + self.mlp(self.post_attention_layernorm(h))

    class Tiny(Module):
        def __init__(self):
            super().__init__()
            self.layers = LayerList([Block(), Block()])
            self.norm = RMSNorm(D, f32, 1e-5)
            self.lm_head = Linear(D, V, f32, dev)

        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.lm_head(self.norm(x[-1:, :]))

    # The hook writes export_path/<step>/tensor_names.txt after every layer call but
    # creates no folder, so the folder must exist first.
    os.makedirs(os.path.join(out, "export", "0"), exist_ok=True)
    hook = PrintHook(export_path=os.path.join(out, "export"))
    model = Tiny()
    rng = np.random.default_rng(0)
    weights = {k: (rng.standard_normal([int(d) for d in v.shape]) * 0.3).astype(np.float32) for k, v in model.raw_state_dict().items()}
    model.load_state_dict(weights)
    hook.name_layers(model)
    graph = Graph("tiny_hook", model, input_types=[TensorType(f32, [3, D], dev)])
    session = InferenceSession(devices=[CPU()])
    session.set_debug_print_options("BINARY_MAX_CHECKPOINT", 6, os.path.join(out, "max"))
    m = session.load(graph, weights_registry=model.state_dict())
    x = rng.standard_normal((3, D)).astype(np.float32)
    np.save(os.path.join(out, "input.npy"), x)
    m.execute(Buffer.from_numpy(x))
    write_reference(os.path.join(out, "reference"), model.raw_state_dict().keys(), weights, x, H, KV, HD)
    hook.step()
    hook.summarize()
    hook.remove()
    print("recorded:", hook._recorded_prints)


def write_reference(out, keys, w, x, H, KV, HD):
    """The same model in numpy, each value named as transformers names it (module paths,
    loupe's `self_attn.attn_output` and `mlp.act_mul`), one .npy per value: the other side
    of the no-map pairing test."""
    os.makedirs(out, exist_ok=True)
    keys = list(keys)
    prefix = "layers.layers." if any(k.startswith("layers.layers.") for k in keys) else "layers."

    def save(name, v):
        np.save(os.path.join(out, name + ".npy"), v.astype(np.float32))

    def rms(v, weight):
        return v / np.sqrt(np.mean(v.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-5) * weight

    def lin(v, name):
        return v @ w[name + ".weight"].T

    h = x.astype(np.float64)
    for n in range(2):
        p, hf = f"{prefix}{n}.", f"model.layers.{n}."
        a = rms(h, w[p + "input_layernorm.weight"])
        save(hf + "input_layernorm", a)
        qkv = lin(a, p + "self_attn.qkv_proj")
        q, k, v = qkv[:, : H * HD], qkv[:, H * HD : (H + KV) * HD], qkv[:, (H + KV) * HD :]
        save(hf + "self_attn.q_proj", q)
        save(hf + "self_attn.k_proj", k)
        save(hf + "self_attn.v_proj", v)
        core = q * np.concatenate([v, v], axis=1)
        save(hf + "self_attn.attn_output", core)
        o = lin(core, p + "self_attn.o_proj")
        save(hf + "self_attn.o_proj", o)
        h = h + o
        b = rms(h, w[p + "post_attention_layernorm.weight"])
        save(hf + "post_attention_layernorm", b)
        g, u = lin(b, p + "mlp.gate_proj"), lin(b, p + "mlp.up_proj")
        save(hf + "mlp.gate_proj", g)
        save(hf + "mlp.up_proj", u)
        prod = g / (1 + np.exp(-g)) * u
        save(hf + "mlp.act_mul", prod)
        d = lin(prod, p + "mlp.down_proj")
        save(hf + "mlp.down_proj", d)
        h = h + d
        save(hf.rstrip("."), h)
    normed = rms(h, w["norm.weight"])
    save("model.norm", normed)
    save("lm_head", lin(normed, "lm_head"))


if __name__ == "__main__":
    main()
