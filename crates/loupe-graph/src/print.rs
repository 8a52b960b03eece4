//! Readable text form of the IR, one node per line:
//! `%12 model.layers.0.self_attn.q_proj = linear(%11 model.layers.0.input_layernorm) w=model.layers.0.self_attn.q_proj.weight[576x576 q4_1] : [T, 576] f32  # crates/loupe-models/src/decoder.rs:88`
//! then, once the lowering passes have set them, ` buf=N` (the buffer slot of `plan-memory`;
//! `side=%N name buf=M` for a side output), ` kernel=NAME` (`select-kernels`' choice) and
//! ` group=J/N` (member J of N linears that `schedule` runs as one grouped matmul).
//!
//! A node carrying a planted fault says so after its attributes: `... FAULT=rope-interleaved`.

use std::fmt::Write;

use loupe_tensor::ops::{AttentionMask, HeadMap, RopeMode};

use crate::ir::{Graph, Op, WeightId};
use crate::kv::KvWrite;

/// The whole graph as text.
pub fn to_text(graph: &Graph) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# {} nodes, {} weights, kv cache {} layers x {}",
        graph.nodes.len(),
        graph.weights.len(),
        graph.kv_layers,
        graph.kv_width
    );
    if let Some(p) = &graph.memory_plan {
        let _ = writeln!(s, "# memory plan: {} buffer slots for {} values", p.n_slots, graph.values.len());
    }
    for (i, node) in graph.nodes.iter().enumerate() {
        let v = graph.value(node.output);
        let inputs: Vec<String> = node.inputs.iter().map(|i| format!("%{} {}", i.0, graph.value(*i).name)).collect();
        let _ = write!(s, "%{} {} = {}({})", node.output.0, v.name, node.op.name(), inputs.join(", "));
        let w = |id: &WeightId| {
            let w = graph.weight(*id);
            let dims: Vec<String> = w.shape.iter().map(|d| d.to_string()).collect();
            format!("{}[{} {}]", w.name, dims.join("x"), w.compute_type())
        };
        match &node.op {
            Op::Embedding { table, scale } => {
                let _ = write!(s, " table={}", w(table));
                if *scale != 1.0 {
                    let _ = write!(s, " scale={scale}");
                }
            }
            Op::PositionEmbedding { table, offset } => {
                let _ = write!(s, " table={} offset={offset}", w(table));
            }
            Op::ConstantEmbedding { table, row } => {
                let _ = write!(s, " table={} row={row}", w(table));
            }
            Op::RmsNorm { weight, eps } => {
                let _ = write!(s, " w={} eps={eps:e}", w(weight));
            }
            Op::LayerNorm { weight, bias, eps } => {
                let _ = write!(s, " w={} b={} eps={eps:e}", w(weight), w(bias));
            }
            Op::Linear { weight, bias } => {
                let _ = write!(s, " w={}", w(weight));
                if let Some(b) = bias {
                    let _ = write!(s, " b={}", w(b));
                }
            }
            Op::Rope { n_heads, table, mode } => {
                let _ = write!(s, " heads={n_heads} head_dim={}", table.head_dim());
                // Partial rotary and LongRoPE only where the model has them.
                if table.rotary_dim() != table.head_dim() {
                    let _ = write!(s, " rotary_dim={}", table.rotary_dim());
                }
                if let Some(n) = table.long_after() {
                    let _ = write!(s, " longrope(long_after={n}, attention_factor={})", table.attention_factor());
                }
                // Only the non-default pairing is spelled out, so the text of a normal graph
                // does not change.
                if *mode != RopeMode::default() {
                    let _ = write!(s, " pairs={}", mode.name());
                }
            }
            Op::Attention { layer, shape, variant, kv_write } => {
                let _ = write!(
                    s,
                    " layer={layer} heads={} kv_heads={} head_dim={} scale={}",
                    shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.scale
                );
                if let Some(cap) = shape.softcap {
                    let _ = write!(s, " softcap={cap}");
                }
                match variant.head_map {
                    HeadMap::Grouped => {}
                    HeadMap::Modulo => s.push_str(" head_map=modulo"),
                }
                match variant.mask {
                    AttentionMask::Causal => {}
                    AttentionMask::None => s.push_str(" mask=none"),
                    AttentionMask::SlidingWindow(w) => {
                        let _ = write!(s, " mask=sliding-window({w})");
                    }
                }
                match kv_write {
                    KvWrite::InPlace => {}
                    KvWrite::OneLate => s.push_str(" kv_write=one-late"),
                    KvWrite::OneLateAtDecode => s.push_str(" kv_write=one-late-at-decode"),
                }
            }
            Op::Scale { factor } => {
                let _ = write!(s, " factor={factor}");
            }
            Op::SoftCap { cap } => {
                let _ = write!(s, " cap={cap}");
            }
            Op::RouterSelect { router, bias } => {
                let _ = write!(s, " {} experts={} top_k={}", router_scoring(router), router.n_experts, router.top_k);
                if router.n_group > 1 {
                    let _ = write!(s, " groups={} topk_group={}", router.n_group, router.topk_group);
                }
                if let Some(b) = bias {
                    let _ = write!(s, " bias={}", w(b));
                }
            }
            Op::RouterWeights { router } => {
                let _ = write!(
                    s,
                    " {} experts={} top_k={} norm_topk_prob={}",
                    router_scoring(router),
                    router.n_experts,
                    router.top_k,
                    router.norm_topk_prob
                );
                if router.scaling != 1.0 {
                    let _ = write!(s, " scaling={}", router.scaling);
                }
            }
            Op::Experts { experts, gelu_tanh } => {
                let first = experts.first().map(|e| w(&e.gate)).unwrap_or_default();
                let _ = write!(
                    s,
                    " n={} act={} gate0={first}",
                    experts.len(),
                    if *gelu_tanh { "gelu_tanh" } else { "silu" }
                );
            }
            Op::Slice { start, len } => {
                let _ = write!(s, " columns={start}..{}", start + len);
            }
            Op::Silu | Op::Gelu { .. } | Op::Mul | Op::Add | Op::Copy | Op::RoundBf16 | Op::SwiGlu | Op::Plant(_) => {}
        }
        if let Some(f) = node.fault {
            let _ = write!(s, " FAULT={f}");
        }
        let dims: Vec<String> = v.shape.iter().map(|d| d.to_string()).collect();
        let _ = write!(s, " : [{}] f32", dims.join(", "));
        if !v.aliases.is_empty() {
            let _ = write!(s, " aka {}", v.aliases.join(", "));
        }
        let buf = |id: crate::ValueId| {
            graph
                .memory_plan
                .as_ref()
                .and_then(|p| p.slot.get(id.0 as usize))
                .map(|b| format!(" buf={b}"))
                .unwrap_or_default()
        };
        let _ = write!(s, "{}", buf(node.output));
        if let Some(side) = node.side {
            let _ = write!(s, " side=%{} {}{}", side.0, graph.value(side).name, buf(side));
        }
        if let Some(k) = graph.kernels.get(i) {
            let _ = write!(s, " kernel={}", k.label(node.op.name()));
        }
        if let Some(g) = graph.groups.iter().flatten().find(|g| (g.first..g.first + g.len).contains(&i)) {
            let _ = write!(s, " group={}/{}", i - g.first + 1, g.len);
        }
        let _ = writeln!(s, "  # {}", v.location);
    }
    if let Some(l) = graph.logits {
        let _ = writeln!(s, "return %{} {}", l.0, graph.value(l).name);
    }
    s
}

fn router_scoring(r: &loupe_tensor::ops::Router) -> &'static str {
    match r.scoring {
        loupe_tensor::ops::RouterScoring::Softmax => "softmax",
        loupe_tensor::ops::RouterScoring::Sigmoid => "sigmoid",
    }
}
