//! The hypotheses per op: which op produced a tensor (from its name, the contract of
//! ARCHITECTURE.md invariant 1), which reference tensors are its inputs, and the outputs the
//! correct op and each candidate bug compute from them.
//!
//! Kernels are loupe's own (`loupe_tensor::ops`), which track PyTorch to rounding in f32
//! mode; a hypothesis is a different kernel mode or parameter, never a separate
//! re-implementation.

use std::sync::Arc;

use loupe_graph::{Op, WeightData};
use loupe_models::roles::{MoeWiring, MAX_MOE_LAYERS};
use loupe_models::{DecoderConfig, HiddenAct, Model, Module, ModuleRole as R, Wiring};
use loupe_tensor::linear::matmul_f32;
use loupe_tensor::ops::{
    attention, gelu, rms_norm, round_bf16, silu, AttentionMask, AttentionShape, AttentionVariant, HeadMap, RopeMode,
    RopeTable,
};

use crate::{Context, ExplainError, Tensor};

/// The likely causes the attention hypotheses name (shared by the core and the block).
mod cause {
    pub const ROPE_INTERLEAVED: &str = "rotary embedding pairs adjacent elements (2i, 2i+1) instead of (i, i+head_dim/2): the interleaved (GPT-J) convention on split-half weights, or q/k rows not un-permuted";
    pub const SOFTMAX_SCALE: &str = "attention scores scaled by 1/head_dim instead of 1/sqrt(head_dim)";
    pub const NO_SCALE: &str = "attention scores not scaled by 1/sqrt(head_dim)";
    pub const GQA_MAPPING: &str = "query head h reads kv head h % n_kv (kv heads tiled) instead of h / (n_heads/n_kv) (repeat_kv / repeat_interleave)";
    pub const NO_MASK: &str = "the causal mask is missing: queries see later tokens of the same call";
    pub const KV_WRITE: &str = "the KV cache write is off by one: row p holds the key of position p-1";
}

/// One way of computing the op, not yet compared.
pub struct Candidate {
    pub id: &'static str,
    pub label: String,
    pub cause: String,
    pub data: Vec<f32>,
}

fn cand(id: &'static str, label: impl Into<String>, cause: impl Into<String>, data: Vec<f32>) -> Candidate {
    Candidate { id, label: label.into(), cause: cause.into(), data }
}

/// What to evaluate for one tensor.
pub struct Plan {
    /// The op, in words.
    pub op: String,
    /// Reference tensors the hypotheses read (checked against the target's copies).
    pub inputs: Vec<String>,
    /// The correct op first.
    pub candidates: Vec<Candidate>,
}

/// The op behind a value name.
enum Site {
    Rope {
        layer: usize,
        input: Module,
        kv: bool,
    },
    Attention {
        layer: usize,
        probs: bool,
    },
    Linear {
        module: Module,
        input: Module,
        layers: usize,
    },
    Norm {
        module: Module,
        input: Module,
        layers: usize,
    },
    Act {
        input: Module,
    },
    /// A residual add: the skip input and the block output (either name of it).
    Residual {
        skip: Module,
        branch: Module,
        what: &'static str,
    },
    /// No op model: only value-level hypotheses (bf16).
    Other,
}

/// Which op makes `name`, and from which inputs, as the model builder describes its values
/// ([`loupe_models::roles`]).
fn site(ctx: &Context<'_>, name: &str) -> Site {
    let Some(m) = Module::parse(name) else { return Site::Other };
    // Decoder layers the model needs for this value (the final norm reads the last layer
    // the reference dumped).
    let n_layers =
        if m.role.in_layer() { m.layer + 1 } else { ctx.reference.last_layer(ctx.step).map_or(0, |l| l + 1) };
    // The family's wiring, known from the reference's dump: RoPE reads the normed q/k in
    // families with q/k norms; Gemma's sandwich norms sit between blocks and residuals.
    let has = |role| ctx.reference.has(&Module::layer(m.layer, role).name(), ctx.step);
    // A MoE layer shows its router; its shared experts show as `mlp.shared_experts` (Hunyuan:
    // `mlp.shared_mlp`, and the router's linear as `mlp.gate.wg`).
    let shared_mlp = has(R::SharedMlp) || has(R::SharedMlpDown);
    let moe = has(R::Router).then(|| MoeWiring {
        sparse_layers: if m.layer < MAX_MOE_LAYERS { 1u128 << m.layer } else { 0 },
        shared_experts: has(R::SharedExperts) || has(R::SharedDown) || shared_mlp,
        shared_mlp,
        router_wg: has(R::RouterWg),
    });
    let wiring = Wiring {
        qk_norm: has(R::QNorm),
        qk_norm_after_rope: has(R::QLayerNorm),
        sandwich_norms: has(R::PreFfnNorm),
        final_softcap: has(R::Logits),
        moe,
        fused_projections: has(R::QkvProj),
    };
    let inputs = m.inputs_in(n_layers, wiring);
    let Some(&input) = inputs.first() else { return Site::Other };
    let layers = if m.role.in_layer() { m.layer + 1 } else { 1 };
    match m.role {
        R::FinalNorm if n_layers == 0 => Site::Other,
        // A MoE layer's `mlp` is the experts' output (or its sum with the shared experts),
        // not the dense `down_proj` it aliases elsewhere.
        R::Mlp if wiring.sparse(m.layer) => Site::Other,
        r if r.is_norm() => Site::Norm { module: m, input, layers },
        r if r.is_linear() => Site::Linear { module: m.canonical_in(wiring), input, layers },
        R::QRope => Site::Rope { layer: m.layer, input, kv: false },
        R::KRope => Site::Rope { layer: m.layer, input, kv: true },
        R::AttnCore => Site::Attention { layer: m.layer, probs: false },
        R::AttnProbs => Site::Attention { layer: m.layer, probs: true },
        R::ActFn | R::ActivationFn => Site::Act { input },
        R::AttnResidual | R::LayerOutput => {
            let what = if m.role == R::AttnResidual { "attention" } else { "MLP" };
            Site::Residual { skip: input, branch: inputs.get(1).copied().unwrap_or(input), what }
        }
        // The shared experts' activation reads their gate as the dense MLP's does.
        R::SharedActFn | R::SharedMlpActFn => Site::Act { input },
        // Routing and the experts have no op model here (yet), nor the column slices of a
        // fused projection: value-level hypotheses only.
        R::Embedding
        | R::ActMul
        | R::Logits
        | R::RouterIndices
        | R::RouterWeights
        | R::Experts
        | R::SharedActMul
        | R::SharedMlpActMul
        | R::QPart
        | R::KPart
        | R::VPart
        | R::GatePart
        | R::UpPart => Site::Other,
        // Covered by the guards above; listed so a new role fails to compile here.
        R::InputNorm
        | R::QNorm
        | R::KNorm
        | R::QLayerNorm
        | R::KLayerNorm
        | R::PostAttnNorm
        | R::PreFfnNorm
        | R::PostFfnNorm
        | R::FinalNorm
        | R::QProj
        | R::KProj
        | R::VProj
        | R::QkvProj
        | R::OProj
        | R::SelfAttn
        | R::Gate
        | R::Up
        | R::GateUpProj
        | R::Down
        | R::Mlp
        | R::LmHead
        | R::Router
        | R::RouterWg
        | R::SharedGate
        | R::SharedUp
        | R::SharedDown
        | R::SharedExperts
        | R::SharedMlpGate
        | R::SharedMlpUp
        | R::SharedMlpDown
        | R::SharedMlp => Site::Other,
    }
}

/// The hypotheses for `name` at the context's step.
pub fn plan(ctx: &mut Context<'_>, name: &str) -> Result<Plan, ExplainError> {
    // The attention block's output (`o_proj`, alias `self_attn`) against a reference that
    // dumped module outputs only (no `attn_output`, which no module returns): the block is
    // recomputed from the reference's q/k/v projections under each attention-core
    // hypothesis, then through o_proj.
    if let Some(m) = Module::parse(name).filter(|m| matches!(m.role, R::OProj | R::SelfAttn)) {
        if !ctx.reference.has(&Module::layer(m.layer, R::AttnCore).name(), ctx.step) {
            let mut plan = attn_block(ctx, m.layer)?;
            push_bf16(ctx, name, &mut plan);
            return Ok(plan);
        }
    }
    let mut plan = match site(ctx, name) {
        Site::Rope { layer, input, kv } => rope(ctx, layer, &input.name(), kv)?,
        Site::Attention { layer, probs } => attn(ctx, layer, probs)?,
        Site::Linear { module, input, layers } => linear(ctx, module, &input.name(), layers)?,
        Site::Norm { module, input, layers } => norm(ctx, module, &input.name(), layers)?,
        Site::Act { input } => act(ctx, &input.name())?,
        Site::Residual { skip, branch, what } => {
            // The block output has two names (`…self_attn.o_proj` and its alias
            // `…self_attn`): either may have been dumped.
            let names = branch.names();
            let b = ctx.reference.first_of(&names, ctx.step).unwrap_or(&names[0]).to_string();
            residual(ctx, &skip.name(), &b, what)?
        }
        Site::Other => {
            let r = ctx.reference(name)?;
            Plan {
                op: "no op model for this tensor: value-level hypotheses only".into(),
                inputs: Vec::new(),
                candidates: vec![cand("correct", "the reference value", "", r.data)],
            }
        }
    };
    push_bf16(ctx, name, &mut plan);
    Ok(plan)
}

/// Any tensor: the reference value held in bf16 (reduced-precision activations).
fn push_bf16(ctx: &Context<'_>, name: &str, plan: &mut Plan) {
    if let Ok(r) = ctx.reference(name) {
        let mut data = r.data;
        round_bf16(&mut data);
        plan.candidates.push(cand(
            "bf16",
            "reference value rounded to bf16",
            "the value is rounded to bf16 (a reduced-precision activation or cast)",
            data,
        ));
    }
}

/// The attention block of `layer` (RoPE on q and k, attention, o_proj) from the reference's
/// q/k/v projections, under each hypothesis of [`rope`], [`attn`] and [`linear`] one at a
/// time: used when the reference holds no attention output to start from.
fn attn_block(ctx: &mut Context<'_>, layer: usize) -> Result<Plan, ExplainError> {
    let [qn, kn, vn] = [R::QProj, R::KProj, R::VProj].map(|r| Module::layer(layer, r).name());
    let q = ctx.reference(&qn)?;
    // The cache at step K holds the keys and values of every step up to K, from position 0.
    let k = ctx.reference.rows_through(&kn, ctx.step)?;
    let v = ctx.reference.rows_through(&vn, ctx.step)?;
    let first = ctx.first_position()?;
    let model = ctx.model(layer + 1)?;
    let cfg = crate::decoder_config(model)?.clone();
    let (h, kvh, hd) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let tokens = rows_of(&q, h * hd, &qn)?;
    let context = rows_of(&k, kvh * hd, &kn)?;
    if rows_of(&v, kvh * hd, &vn)? != context || tokens > context || tokens == 0 {
        return Err(ExplainError::Shape {
            what: format!("{tokens} queries, {context} keys, {} values", v.data.len() / (kvh * hd).max(1)),
        });
    }
    let table = rope_table(model, layer)?;
    let o_name = Module::layer(layer, R::OProj).param("weight");
    let (o_shape, w_o) = weight(model, &o_name)
        .ok_or_else(|| ExplainError::Shape { what: format!("the model has no weight '{o_name}'") })?;
    let (n, kdim) = (o_shape[0], o_shape.get(1).copied().unwrap_or(1));
    if kdim != h * hd {
        return Err(ExplainError::Shape {
            what: format!("'{o_name}' is {n}x{kdim}, the attention output has {} features", h * hd),
        });
    }
    let roped = |x: &Tensor, heads: usize, from: usize, mode: RopeMode| -> Result<Vec<f32>, ExplainError> {
        let mut d = x.data.clone();
        table.apply_mode(&mut d, heads, from, mode)?;
        Ok(d)
    };
    let base = cfg.attention_shape();
    let plain = AttentionVariant::default();
    let block = |mode: RopeMode,
                 shape: AttentionShape,
                 variant: AttentionVariant,
                 late_keys: bool,
                 w: &[f32]|
     -> Result<Vec<f32>, ExplainError> {
        let qr = roped(&q, h, first, mode)?;
        let mut kr = roped(&k, kvh, 0, mode)?;
        if late_keys {
            // Row p holds the key of p-1, row 0 zeros.
            let (w, len) = (kvh * hd, kr.len());
            kr.copy_within(..len - w, w);
            kr[..w].fill(0.0);
        }
        let mut out = vec![0.0f32; tokens * h * hd];
        attention(shape, variant, &qr, &kr, &v.data, context, &mut out, None)?;
        let mut y = vec![0.0f32; tokens * n];
        matmul_f32(&out, w, &mut y, tokens, kdim, n)?;
        Ok(y)
    };
    let split = RopeMode::SplitHalf;
    let mut candidates = vec![
        cand(
            "correct",
            format!("RoPE split-half, causal attention, {}, kv head h/{}, then o_proj", scores(&base), h / kvh.max(1)),
            "",
            block(split, base, plain, false, &w_o)?,
        ),
        cand(
            "rope-interleaved",
            "RoPE interleaved (2i, 2i+1) on q and k",
            cause::ROPE_INTERLEAVED,
            block(RopeMode::Interleaved, base, plain, false, &w_o)?,
        ),
        cand(
            "softmax-scale",
            format!("scale 1/{hd}"),
            cause::SOFTMAX_SCALE,
            block(split, AttentionShape { scale: 1.0 / hd as f32, ..base }, plain, false, &w_o)?,
        ),
        cand(
            "no-scale",
            "scale 1",
            cause::NO_SCALE,
            block(split, AttentionShape { scale: 1.0, ..base }, plain, false, &w_o)?,
        ),
        cand(
            "gqa-mapping",
            format!("kv head h % {kvh}"),
            cause::GQA_MAPPING,
            block(split, base, AttentionVariant { head_map: HeadMap::Modulo, ..plain }, false, &w_o)?,
        ),
        cand(
            "mask",
            "no causal mask",
            cause::NO_MASK,
            block(split, base, AttentionVariant { mask: AttentionMask::None, ..plain }, false, &w_o)?,
        ),
        cand("kv-write", "keys written one position late", cause::KV_WRITE, block(split, base, plain, true, &w_o)?),
    ];
    if n == kdim {
        candidates.push(cand(
            "transposed-weight",
            "o_proj weight transposed",
            format!("`{o_name}` is used transposed ([in, out] read as [out, in])"),
            block(split, base, plain, false, &transposed(&w_o, n))?,
        ));
    }
    let op = format!(
        "the attention block of layer {layer} recomputed from `{qn}`, `{kn}`, `{vn}` (the reference holds no `{}`): RoPE, attention ({h} heads, {kvh} kv heads, head_dim {hd}, {context} positions), o_proj",
        Module::layer(layer, R::AttnCore).name()
    );
    Ok(Plan { op, inputs: vec![qn, kn, vn], candidates })
}

fn rows_of(t: &Tensor, width: usize, what: &str) -> Result<usize, ExplainError> {
    if width == 0 || !t.data.len().is_multiple_of(width) {
        return Err(ExplainError::Shape { what: format!("'{what}' has shape {:?}, not rows of {width}", t.shape) });
    }
    Ok(t.data.len() / width)
}

fn rope(ctx: &mut Context<'_>, layer: usize, input: &str, kv: bool) -> Result<Plan, ExplainError> {
    let x = ctx.reference(input)?;
    let first = ctx.first_position()?;
    let model = ctx.model(layer + 1)?;
    let cfg = crate::decoder_config(model)?;
    let heads = if kv { cfg.num_key_value_heads } else { cfg.num_attention_heads };
    rows_of(&x, heads * cfg.head_dim, input)?;
    let table = rope_table(model, layer)?;
    let run = |mode: RopeMode| -> Result<Vec<f32>, ExplainError> {
        let mut d = x.data.clone();
        table.apply_mode(&mut d, heads, first, mode)?;
        Ok(d)
    };
    let candidates = vec![
        cand("correct", "RoPE split-half (i, i+d/2)", "", run(RopeMode::SplitHalf)?),
        cand("rope-interleaved", "RoPE interleaved (2i, 2i+1)", cause::ROPE_INTERLEAVED, run(RopeMode::Interleaved)?),
        cand("rope-missing", "no RoPE", "rotary embedding not applied", x.data.clone()),
    ];
    let op = format!(
        "rotary embedding of `{input}` ({heads} heads x {}, theta {}, first position {first})",
        cfg.head_dim, cfg.rope_theta
    );
    Ok(Plan { op, inputs: vec![input.to_string()], candidates })
}

/// The graph's own table for `layer` (it carries GGUF frequency factors, if any).
fn rope_table(model: &Model, layer: usize) -> Result<Arc<RopeTable>, ExplainError> {
    let name = Module::layer(layer, R::QRope).name();
    let node = model.graph.find_value(&name).and_then(|v| model.graph.producer(v));
    if let Some(Op::Rope { table, .. }) = node.map(|n| &n.op) {
        return Ok(table.clone());
    }
    Err(ExplainError::Shape { what: format!("the model has no RoPE node '{name}'") })
}

fn attn(ctx: &mut Context<'_>, layer: usize, probs: bool) -> Result<Plan, ExplainError> {
    // q after RoPE, k after RoPE, v: the attention node's inputs (v is a part of the fused
    // `qkv_proj` in Phi-3, which the reference dump records as such).
    let v_role = if ctx.reference.has(&Module::layer(layer, R::VPart).name(), ctx.step) { R::VPart } else { R::VProj };
    let [qn, kn, vn] = [R::QRope, R::KRope, v_role].map(|r| Module::layer(layer, r).name());
    let q = ctx.reference(&qn)?;
    // The cache at step K holds the keys and values of every step up to K.
    let k = ctx.reference.rows_through(&kn, ctx.step)?;
    let v = ctx.reference.rows_through(&vn, ctx.step)?;
    let cfg: DecoderConfig = ctx.config()?;
    let (h, kvh, hd) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let tokens = rows_of(&q, h * hd, &qn)?;
    let context = rows_of(&k, kvh * hd, &kn)?;
    if rows_of(&v, kvh * hd, &vn)? != context || tokens > context || tokens == 0 {
        return Err(ExplainError::Shape {
            what: format!("{tokens} queries, {context} keys, {} values", v.data.len() / (kvh * hd).max(1)),
        });
    }
    let base = cfg.attention_shape();
    let run = |shape: AttentionShape, variant: AttentionVariant, keys: &[f32]| -> Result<Vec<f32>, ExplainError> {
        let mut out = vec![0.0f32; tokens * h * hd];
        let mut pr = vec![0.0f32; h * tokens * context];
        attention(shape, variant, &q.data, keys, &v.data, context, &mut out, Some(&mut pr))?;
        Ok(if probs { pr } else { out })
    };
    let plain = AttentionVariant::default();
    // Row p holds the key of p-1, row 0 zeros.
    let w = kvh * hd;
    let mut late = vec![0.0f32; k.data.len()];
    late[w..].copy_from_slice(&k.data[..k.data.len() - w]);
    let candidates = vec![
        cand(
            "correct",
            format!("causal, {}, kv head h/{}", scores(&base), h / kvh.max(1)),
            "",
            run(base, plain, &k.data)?,
        ),
        cand(
            "softmax-scale",
            format!("scale 1/{hd}"),
            cause::SOFTMAX_SCALE,
            run(AttentionShape { scale: 1.0 / hd as f32, ..base }, plain, &k.data)?,
        ),
        cand("no-scale", "scale 1", cause::NO_SCALE, run(AttentionShape { scale: 1.0, ..base }, plain, &k.data)?),
        cand(
            "gqa-mapping",
            format!("kv head h % {kvh}"),
            cause::GQA_MAPPING,
            run(base, AttentionVariant { head_map: HeadMap::Modulo, ..plain }, &k.data)?,
        ),
        cand(
            "mask",
            "no causal mask",
            cause::NO_MASK,
            run(base, AttentionVariant { mask: AttentionMask::None, ..plain }, &k.data)?,
        ),
        cand("kv-write", "keys written one position late", cause::KV_WRITE, run(base, plain, &late)?),
    ];
    let op = format!("attention of `{qn}` over `{kn}`, `{vn}` (steps 0..={}: {context} positions; {h} heads, {kvh} kv heads, head_dim {hd})", ctx.step);
    Ok(Plan { op, inputs: vec![qn, kn, vn], candidates })
}

/// The model's score arithmetic in words: `scale 1/sqrt(hd)` (or the configured scale, e.g.
/// Gemma's `query_pre_attn_scalar`), and the soft-cap where there is one.
fn scores(shape: &AttentionShape) -> String {
    let hd = shape.head_dim;
    let scale = if shape.scale == (hd as f32).powf(-0.5) {
        format!("scale 1/sqrt({hd})")
    } else {
        format!("scale {}", shape.scale)
    };
    match shape.softcap {
        Some(cap) => format!("{scale}, scores soft-capped at {cap}"),
        None => scale,
    }
}

/// The transpose of a square `n x n` row-major matrix (the transposed-weight hypothesis).
fn transposed(w: &[f32], n: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; n * n];
    for r in 0..n {
        for c in 0..n {
            t[c * n + r] = w[r * n + c];
        }
    }
    t
}

/// A weight of the loaded model as f32 `[rows, cols]`.
fn weight(model: &Model, name: &str) -> Option<(Vec<usize>, Arc<Vec<f32>>)> {
    let w = model.graph.weights.iter().find(|w| w.name == name)?;
    let data = match &w.data {
        WeightData::F32(d) => d.clone(),
        WeightData::Quant(q) => Arc::new(q.dequantize()),
    };
    Some((w.shape.clone(), data))
}

fn linear(ctx: &mut Context<'_>, module: Module, input: &str, layers: usize) -> Result<Plan, ExplainError> {
    let x = ctx.reference(input)?;
    let model = ctx.model(layers)?;
    let wname = module.param("weight");
    // A tied lm_head is the embedding table.
    let found = weight(model, &wname).or_else(|| {
        if module.role == R::LmHead {
            weight(model, &Module::model(R::Embedding).param("weight"))
        } else {
            None
        }
    });
    let (shape, w) = found.ok_or_else(|| ExplainError::Shape { what: format!("the model has no weight '{wname}'") })?;
    let (n, k) = (shape[0], shape.get(1).copied().unwrap_or(1));
    let m = rows_of(&x, k, input)?;
    let bias = weight(model, &module.param("bias")).map(|(_, b)| b);
    let apply = |w: &[f32]| -> Result<Vec<f32>, ExplainError> {
        let mut y = vec![0.0f32; m * n];
        matmul_f32(&x.data, w, &mut y, m, k, n)?;
        if let Some(b) = &bias {
            for row in y.chunks_exact_mut(n) {
                for (o, &bb) in row.iter_mut().zip(b.iter()) {
                    *o += bb;
                }
            }
        }
        Ok(y)
    };
    let mut candidates = vec![cand("correct", "x W^T", "", apply(&w)?)];
    if n == k {
        candidates.push(cand(
            "transposed-weight",
            "x W (weight transposed)",
            format!("`{wname}` is used transposed ([in, out] read as [out, in])"),
            apply(&transposed(&w, n))?,
        ));
    }
    Ok(Plan { op: format!("linear `{module}` ({n}x{k}) of `{input}`"), inputs: vec![input.to_string()], candidates })
}

fn norm(ctx: &mut Context<'_>, module: Module, input: &str, layers: usize) -> Result<Plan, ExplainError> {
    let x = ctx.reference(input)?;
    let model = ctx.model(layers)?;
    let cfg_eps = crate::decoder_config(model)?.rms_norm_eps;
    let wname = module.param("weight");
    let (_, w) = weight(model, &wname)
        .ok_or_else(|| ExplainError::Shape { what: format!("the model has no weight '{wname}'") })?;
    rows_of(&x, w.len(), input)?;
    let run = |w: &[f32], eps: f32| -> Result<Vec<f32>, ExplainError> {
        let mut out = vec![0.0f32; x.data.len()];
        rms_norm(&x.data, w, eps, &mut out)?;
        Ok(out)
    };
    let mut candidates = vec![cand("correct", format!("RMSNorm eps = {cfg_eps:e} (config)"), "", run(&w, cfg_eps)?)];
    // The weight convention, a classic porting bug: Gemma's RMSNorm scales by `1 + weight`
    // (the graph's weight already holds `1 + w`), others by `weight`.
    let (other_w, label, cause) = if model.config.family().norm_unit_offset() {
        (w.iter().map(|v| v - 1.0).collect::<Vec<f32>>(), "RMSNorm scaled by weight, not 1 + weight", "the norm multiplies by its stored weight where Gemma's RMSNorm multiplies by 1 + weight (the checkpoint's convention dropped, or a GGUF's stored weight + 1 undone twice)")
    } else {
        (w.iter().map(|v| v + 1.0).collect::<Vec<f32>>(), "RMSNorm scaled by 1 + weight", "the norm multiplies by 1 + weight (Gemma's convention) where this model's RMSNorm multiplies by its weight")
    };
    candidates.push(cand("norm-weight-offset", label, cause, run(&other_w, cfg_eps)?));
    // The usual defaults of other models, and the config's off by one or two decades.
    let mut tried: Vec<f32> = vec![cfg_eps];
    for eps in [1e-6f32, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, cfg_eps / 10.0, cfg_eps * 100.0] {
        if tried.iter().any(|t| (eps - t).abs() <= 1e-3 * t) {
            continue;
        }
        tried.push(eps);
        candidates.push(cand(
            "norm-eps",
            format!("RMSNorm eps = {eps:e}"),
            format!("RMSNorm epsilon is {eps:e} instead of the config's {cfg_eps:e}"),
            run(&w, eps)?,
        ));
    }
    Ok(Plan { op: format!("RMSNorm `{module}` of `{input}`"), inputs: vec![input.to_string()], candidates })
}

fn act(ctx: &mut Context<'_>, input: &str) -> Result<Plan, ExplainError> {
    // The activation the config names; without a loadable model (dumps alone), SiLU, the
    // Llama family's, said so in the label.
    let (configured, assumed) = match ctx.hidden_act() {
        Ok(a) => (a, ""),
        Err(_) => (HiddenAct::Silu, " (assumed: no model to read hidden_act from)"),
    };
    let x = ctx.reference(input)?;
    let with = |f: &dyn Fn(&mut [f32])| {
        let mut d = x.data.clone();
        f(&mut d);
        d
    };
    // The configured activation is "correct"; each other one is the hypothesis that the
    // port used it instead (hidden_act mixed up).
    let (name, what) = match configured {
        HiddenAct::Silu => ("SiLU", "SiLU"),
        HiddenAct::GeluTanh => ("GELU (tanh approximation)", "GELU with the tanh approximation"),
        HiddenAct::Gelu => ("GELU (erf)", "exact GELU"),
    };
    let mut candidates = vec![cand("correct", format!("{name}{assumed}"), "", with(&|d| apply_act(configured, d)))];
    if configured != HiddenAct::Silu {
        candidates.push(cand(
            "silu",
            "SiLU",
            format!("the activation is SiLU instead of {what} (hidden_act mixed up)"),
            with(&silu),
        ));
    }
    if configured != HiddenAct::GeluTanh {
        candidates.push(cand(
            "gelu-tanh",
            "GELU (tanh approximation)",
            format!("the activation is GELU with the tanh approximation instead of {what} (hidden_act mixed up)"),
            with(&|d| gelu(d, true)),
        ));
    }
    if configured != HiddenAct::Gelu {
        candidates.push(cand(
            "gelu-erf",
            "GELU (erf)",
            format!("the activation is exact GELU instead of {what} (hidden_act mixed up)"),
            with(&|d| gelu(d, false)),
        ));
    }
    Ok(Plan { op: format!("activation of `{input}`"), inputs: vec![input.to_string()], candidates })
}

fn apply_act(act: HiddenAct, d: &mut [f32]) {
    match act {
        HiddenAct::Silu => silu(d),
        HiddenAct::GeluTanh => gelu(d, true),
        HiddenAct::Gelu => gelu(d, false),
    }
}

fn residual(ctx: &mut Context<'_>, skip: &str, branch: &str, what: &str) -> Result<Plan, ExplainError> {
    let x = ctx.reference(skip)?;
    let o = ctx.reference(branch)?;
    if x.data.len() != o.data.len() {
        return Err(ExplainError::Shape { what: format!("`{skip}` {:?} and `{branch}` {:?}", x.shape, o.shape) });
    }
    let sum = x.data.iter().zip(&o.data).map(|(a, b)| a + b).collect();
    let candidates = vec![
        cand("correct", format!("{skip} + {what} output"), "", sum),
        cand(
            "missing-residual",
            format!("{what} output only"),
            format!("the residual add around the {what} block is missing (its input is not added back)"),
            o.data.clone(),
        ),
    ];
    Ok(Plan {
        op: format!("residual add of `{skip}` and `{branch}`"),
        inputs: vec![skip.to_string(), branch.to_string()],
        candidates,
    })
}
