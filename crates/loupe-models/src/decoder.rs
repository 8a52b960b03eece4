//! The decoder every decoder family builds ([`crate::family::Builder::Decoder`]), as a graph
//! whose values carry Hugging Face module paths (`transformers/models/llama/modeling_llama.py`
//! and the families' own): embedding, N x (RMSNorm, GQA self-attention with RoPE, residual,
//! RMSNorm, gated MLP or MoE block, residual), final norm, lm_head. What differs between
//! families is read from the config and its family's descriptor (norm offset, sandwich
//! norms, q/k norms, fused projections, windows, soft-caps).
//!
//! Planted faults ([`loupe_graph::fault`]) are built here, into the layer they name: the
//! faulty node keeps the module's name and is marked with its class. A graph built without
//! faults takes exactly the nodes it always did.

use std::sync::Arc;

use loupe_graph::{
    Dim, ExpertWeights, Fault, FaultClass, Graph, GraphBuilder, KvWrite, Op, Plant, ValueId, Weight, WeightData,
    WeightId,
};
use loupe_tensor::ops::{AttentionMask, AttentionVariant, HeadMap, RopeMode, RopeScaling, RopeTable};

use crate::config::{DecoderConfig, MoeConfig};
use crate::error::ModelError;
use crate::family::HiddenAct;
use crate::roles::{Module, ModuleRole as R};
use crate::weights::WeightSource;

/// The eps `norm-eps` plants: large enough to shrink small-norm rows visibly, while the
/// direction of each row barely changes (a scale bug).
pub const FAULT_NORM_EPS: f32 = 1e-1;
/// Fault `norm-eps-subtle` multiplies the config's eps by this.
pub const FAULT_NORM_EPS_SUBTLE_FACTOR: f32 = 100.0;
/// The multiplier of fault `o-proj-scale`: 3% too large, inside every default threshold
/// (cosine 1, NMSE 1e-3, norm ratio within 5%) and far outside an f32 noise floor.
pub const FAULT_O_PROJ_SCALE: f32 = 33.0 / 32.0;

/// Builds the graph, loading weights from `source` as each module needs them.
/// `layers` keeps only the first N decoder layers (for layer-truncated parity runs);
/// `faults` plants bugs into the layers they name (none in normal use).
pub fn build_decoder(
    cfg: &DecoderConfig,
    source: &mut dyn WeightSource,
    layers: Option<usize>,
    quantize_activations: bool,
    faults: &[Fault],
) -> Result<Graph, ModelError> {
    let n_layers = layers.unwrap_or(cfg.num_hidden_layers).min(cfg.num_hidden_layers);
    let d = cfg.hidden_size;
    let (h, kvh, hd) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    check_faults(cfg, source, faults, n_layers)?;
    let mut b = GraphBuilder::new();
    b.set_kv(n_layers, kvh * hd, cfg.max_position_embeddings);
    b.set_quantize_activations(quantize_activations);

    let rope_scaling = match source.rope_freq_factors()? {
        Some(f) => RopeScaling::FreqFactors(f),
        None => cfg.rope_scaling.clone(),
    };
    let rope_err = |e| ModelError::Tensor { path: source.path().to_path_buf(), name: "rope".into(), source: e };
    // Partial rotary (Phi-3's `partial_rotary_factor`) turns the first rotary_dim elements
    // of each head only; LongRoPE's two factor sets live in the table.
    let rope = Arc::new(RopeTable::partial(hd, cfg.rotary_dim, cfg.rope_theta, &rope_scaling).map_err(rope_err)?);
    // Gemma 3's sliding-window layers rotate with their own (unscaled) base.
    let local_rope = match cfg.rope_local_theta {
        Some(theta) => Some(Arc::new(RopeTable::new(hd, theta, &RopeScaling::None).map_err(rope_err)?)),
        None => None,
    };
    // Gemma 2 soft-caps the scaled scores inside every attention path (an attribute of the
    // op, as the mask is), so attention's output and probabilities keep their module names.
    let shape = cfg.attention_shape();
    let wiring = cfg.wiring();
    let unit_offset = cfg.family.norm_unit_offset();

    let hidden = |n: usize| vec![Dim::Tokens, Dim::Fixed(n)];
    let axes = || vec!["token", "hidden"];
    let mut load = |name: &str, shape: &[usize]| -> Result<Weight, ModelError> { source.load(name, shape) };
    // A norm's weight as the kernel multiplies by it: Gemma's `1 + weight` is formed here,
    // in f32 as `Gemma3RMSNorm` does, so one RMSNorm op serves every family.
    let norm_weight =
        |b: &mut GraphBuilder, load: &mut Load<'_>, m: Module, n: usize| -> Result<WeightId, ModelError> {
            let w = load(&m.param("weight"), &[n])?;
            Ok(b.weight(if unit_offset { plus_one(w) } else { w }))
        };
    // A hidden-wide RMSNorm with the config's eps, named after its module.
    let hidden_norm =
        |b: &mut GraphBuilder, load: &mut Load<'_>, m: Module, input: ValueId| -> Result<ValueId, ModelError> {
            let w = norm_weight(b, load, m, d)?;
            Ok(b.node(m.name(), Op::RmsNorm { weight: w, eps: cfg.rms_norm_eps }, &[input], hidden(d), axes()))
        };
    // Per-head q/k RMSNorms (Qwen3's q_norm/k_norm before RoPE, Hunyuan's query_layernorm /
    // key_layernorm after it): an RMSNorm over each head's head_dim values (a weight of
    // head_dim normalizes each head_dim-wide slice of the row). Shaped [token, head,
    // head_dim], as transformers' norms see (and their hooks return) q and k per head; the
    // rows are the same floats.
    let qk_norms = |b: &mut GraphBuilder,
                    load: &mut Load<'_>,
                    (mq, mk): (Module, Module),
                    q: ValueId,
                    k: ValueId|
     -> Result<(ValueId, ValueId), ModelError> {
        let (wq, wk) = (norm_weight(b, load, mq, hd)?, norm_weight(b, load, mk, hd)?);
        let per_head = |n: usize| vec![Dim::Tokens, Dim::Fixed(n), Dim::Fixed(hd)];
        let eps = cfg.rms_norm_eps;
        let q =
            b.node(mq.name(), Op::RmsNorm { weight: wq, eps }, &[q], per_head(h), vec!["token", "head", "head_dim"]);
        let k = b.node(
            mk.name(),
            Op::RmsNorm { weight: wk, eps },
            &[k],
            per_head(kvh),
            vec!["token", "kv_head", "head_dim"],
        );
        Ok((q, k))
    };

    let embedding = Module::model(R::Embedding);
    let embed = b.weight(load(&embedding.param("weight"), &[cfg.vocab_size, d])?);
    // transformers multiplies by sqrt(hidden_size) rounded to the weights' dtype (f32).
    let embed_scale = if cfg.family.scales_embedding() { (d as f64).sqrt() as f32 } else { 1.0 };
    let mut x = b.node(embedding.name(), Op::Embedding { table: embed, scale: embed_scale }, &[], hidden(d), axes());

    for l in 0..n_layers {
        // Every value and weight is named through `roles`, the description tools read.
        let m = |role| Module::layer(l, role);
        let has = |c: FaultClass| faults.iter().any(|f| f.layer == l && f.class == c);

        let w = norm_weight(&mut b, &mut load, m(R::InputNorm), d)?;
        let eps = if has(FaultClass::NormEps) {
            FAULT_NORM_EPS
        } else if has(FaultClass::NormEpsSubtle) {
            cfg.rms_norm_eps * FAULT_NORM_EPS_SUBTLE_FACTOR
        } else {
            cfg.rms_norm_eps
        };
        let normed = b.node(m(R::InputNorm).name(), Op::RmsNorm { weight: w, eps }, &[x], hidden(d), axes());
        mark_if(&mut b, normed, has(FaultClass::NormEps), FaultClass::NormEps);
        mark_if(&mut b, normed, has(FaultClass::NormEpsSubtle), FaultClass::NormEpsSubtle);
        // Planted by the executor in batched steps only (see the class's docs).
        mark_if(&mut b, normed, has(FaultClass::BatchReduction), FaultClass::BatchReduction);
        let (q, k, v) = if wiring.fused_projections {
            // Phi-3: one matmul named `qkv_proj` (as its forward hook sees it), then q, k and
            // v as its columns (`Phi3Attention.forward`: qkv[..., :query_pos], ...). The
            // weight stays fused as stored.
            let qkv =
                linear(&mut b, &mut load, &m(R::QkvProj).name(), normed, (h + 2 * kvh) * hd, d, cfg.qkv_bias, false)?;
            let parts = [(R::QPart, 0, h * hd), (R::KPart, h * hd, kvh * hd), (R::VPart, (h + kvh) * hd, kvh * hd)];
            let [q, k, v] = parts.map(|(role, start, len)| part(&mut b, &m(role).name(), qkv, start, len));
            (q, k, v)
        } else {
            let q = linear(&mut b, &mut load, &m(R::QProj).name(), normed, h * hd, d, cfg.qkv_bias, false)?;
            let k = linear(&mut b, &mut load, &m(R::KProj).name(), normed, kvh * hd, d, cfg.qkv_bias, false)?;
            let v = linear(&mut b, &mut load, &m(R::VProj).name(), normed, kvh * hd, d, cfg.qkv_bias, false)?;
            (q, k, v)
        };
        let (q, k) =
            if wiring.qk_norm { qk_norms(&mut b, &mut load, (m(R::QNorm), m(R::KNorm)), q, k)? } else { (q, k) };

        let interleaved = has(FaultClass::RopeInterleaved);
        let mode = if interleaved { RopeMode::Interleaved } else { RopeMode::SplitHalf };
        let table = match (&local_rope, cfg.window(l)) {
            (Some(local), Some(_)) => local.clone(),
            _ => rope.clone(),
        };
        let q = b.node(
            m(R::QRope).name(),
            Op::Rope { n_heads: h, table: table.clone(), mode },
            &[q],
            hidden(h * hd),
            vec!["token", "head*head_dim"],
        );
        let k = b.node(
            m(R::KRope).name(),
            Op::Rope { n_heads: kvh, table, mode },
            &[k],
            hidden(kvh * hd),
            vec!["token", "kv_head*head_dim"],
        );
        mark_if(&mut b, q, interleaved, FaultClass::RopeInterleaved);
        mark_if(&mut b, k, interleaved, FaultClass::RopeInterleaved);
        // Hunyuan norms the rotated q and k (`HunYuanMoEV1Attention.forward`).
        let (q, k) = if wiring.qk_norm_after_rope {
            qk_norms(&mut b, &mut load, (m(R::QLayerNorm), m(R::KLayerNorm)), q, k)?
        } else {
            (q, k)
        };

        // At most one class marks the node; several attention faults at one layer are all
        // applied, and the IR text shows each as an attribute anyway.
        let mut layer_shape = shape;
        let mut variant = AttentionVariant::default();
        if let Some(w) = cfg.window(l) {
            variant.mask = AttentionMask::SlidingWindow(w);
        }
        let mut kv_write = KvWrite::InPlace;
        let mut attn_fault = None;
        if has(FaultClass::SoftmaxScale) {
            layer_shape.scale = 1.0 / hd as f32;
            attn_fault = Some(FaultClass::SoftmaxScale);
        }
        if has(FaultClass::GqaMapping) {
            variant.head_map = HeadMap::Modulo;
            attn_fault = Some(FaultClass::GqaMapping);
        }
        if has(FaultClass::Mask) {
            variant.mask = AttentionMask::None;
            attn_fault = Some(FaultClass::Mask);
        }
        if has(FaultClass::KvWriteDecode) {
            kv_write = KvWrite::OneLateAtDecode;
            attn_fault = Some(FaultClass::KvWriteDecode);
        }
        if has(FaultClass::KvWrite) {
            kv_write = KvWrite::OneLate;
            attn_fault = Some(FaultClass::KvWrite);
        }
        if has(FaultClass::BlockTable) {
            // The executor plants it in batched steps, where there is a block table.
            attn_fault = Some(FaultClass::BlockTable);
        }
        if has(FaultClass::SpecMask) {
            // The executor plants it in batched steps that verify drafts.
            attn_fault = Some(FaultClass::SpecMask);
        }
        let attn = b.node(
            m(R::AttnCore).name(),
            Op::Attention { layer: l, shape: layer_shape, variant, kv_write },
            &[q, k, v],
            hidden(h * hd),
            vec!["token", "head*head_dim"],
        );
        if let Some(f) = attn_fault {
            b.mark_fault(attn, f);
        }
        b.side_output(
            attn,
            m(R::AttnProbs).name(),
            vec![Dim::Fixed(h), Dim::Tokens, Dim::Context],
            vec!["head", "query", "key"],
        );

        let o_name = m(R::OProj).name();
        let mut o = linear(&mut b, &mut load, &o_name, attn, d, h * hd, cfg.o_bias, has(FaultClass::TransposedWeight))?;
        if has(FaultClass::Bf16) {
            // The exact product keeps a suffixed name; the rounded value takes the module's.
            b.rename(o, format!("{o_name}.unrounded"));
            let (shape, axes) = feature(d);
            o = b.node(o_name.clone(), Op::RoundBf16, &[o], shape, axes);
            b.mark_fault(o, FaultClass::Bf16);
        }
        if has(FaultClass::OProjScale) {
            b.rename(o, format!("{o_name}.unscaled"));
            let (shape, axes) = feature(d);
            o = b.node(o_name.clone(), Op::Scale { factor: FAULT_O_PROJ_SCALE }, &[o], shape, axes);
            b.mark_fault(o, FaultClass::OProjScale);
        }
        // Test-only defects for the debug checks (nan-check, uninitialized-read-check).
        for (class, plant) in [(FaultClass::Nan, Plant::NanInf), (FaultClass::Uninit, Plant::HalfUnwritten)] {
            if has(class) {
                b.rename(o, format!("{o_name}.unplanted"));
                let (shape, axes) = feature(d);
                o = b.node(o_name.clone(), Op::Plant(plant), &[o], shape, axes);
                b.mark_fault(o, class);
            }
        }
        b.alias(o, m(R::SelfAttn).name());
        // Sandwich norms (Gemma): attention's output is normalized before the residual add.
        let branch = if wiring.sandwich_norms { hidden_norm(&mut b, &mut load, m(R::PostAttnNorm), o)? } else { o };
        let resid = if has(FaultClass::MissingResidual) {
            let r = b.node(m(R::AttnResidual).name(), Op::Copy, &[branch], hidden(d), axes());
            b.mark_fault(r, FaultClass::MissingResidual);
            r
        } else {
            b.node(m(R::AttnResidual).name(), Op::Add, &[x, branch], hidden(d), axes())
        };

        let mlp_norm = if wiring.sandwich_norms { R::PreFfnNorm } else { R::PostAttnNorm };
        let normed = hidden_norm(&mut b, &mut load, m(mlp_norm), resid)?;
        let down = if let (Some(moe), true) = (&cfg.moe, cfg.is_sparse(l)) {
            moe_mlp(&mut b, &mut load, cfg, moe, l, normed)?
        } else {
            let f = cfg.intermediate_size;
            let (gate, up, act_role) = if wiring.fused_projections {
                // Phi-3: `gate_up_proj` is one matmul; `chunk(2, dim=-1)` gives gate, then up
                // (`Phi3MLP.forward`), and the activation module is `activation_fn`.
                let gate_up = linear(&mut b, &mut load, &m(R::GateUpProj).name(), normed, 2 * f, d, false, false)?;
                let gate = part(&mut b, &m(R::GatePart).name(), gate_up, 0, f);
                let up = part(&mut b, &m(R::UpPart).name(), gate_up, f, f);
                (gate, up, R::ActivationFn)
            } else {
                let gate = linear(&mut b, &mut load, &m(R::Gate).name(), normed, f, d, false, false)?;
                let up = linear(&mut b, &mut load, &m(R::Up).name(), normed, f, d, false, false)?;
                (gate, up, R::ActFn)
            };
            let gelu = has(FaultClass::GeluTanh);
            let act_op = if gelu || cfg.hidden_act == HiddenAct::GeluTanh { Op::Gelu { tanh: true } } else { Op::Silu };
            // Phi-3 multiplies `up * act(gate)`; f32 products commute, so act * up is the same.
            let act = b.node(m(act_role).name(), act_op, &[gate], hidden(f), vec!["token", "feature"]);
            mark_if(&mut b, act, gelu, FaultClass::GeluTanh);
            let prod = b.node(m(R::ActMul).name(), Op::Mul, &[act, up], hidden(f), vec!["token", "feature"]);
            let down = linear(&mut b, &mut load, &m(R::Down).name(), prod, d, f, false, false)?;
            b.alias(down, m(R::Mlp).name());
            down
        };
        let branch =
            if wiring.sandwich_norms { hidden_norm(&mut b, &mut load, m(R::PostFfnNorm), down)? } else { down };
        x = b.node(m(R::LayerOutput).name(), Op::Add, &[resid, branch], hidden(d), axes());
    }

    let normed = hidden_norm(&mut b, &mut load, Module::model(R::FinalNorm), x)?;
    let head: WeightId = if cfg.tie_word_embeddings {
        embed
    } else {
        b.weight(load(&Module::model(R::LmHead).param("weight"), &[cfg.vocab_size, d])?)
    };
    let vocab = || vec![Dim::Tokens, Dim::Fixed(cfg.vocab_size)];
    let mut logits = b.node(
        Module::model(R::LmHead).name(),
        Op::Linear { weight: head, bias: None },
        &[normed],
        vocab(),
        vec!["token", "vocab"],
    );
    // Gemma 2's final soft-cap: `lm_head` keeps its module's (uncapped) output, the capped
    // rows are the model output's `logits`.
    if let Some(cap) = cfg.final_logit_softcap {
        logits =
            b.node(Module::model(R::Logits).name(), Op::SoftCap { cap }, &[logits], vocab(), vec!["token", "vocab"]);
    }
    b.set_logits(logits);
    let graph = b.finish();
    loupe_graph::verify::verify(&graph)?;
    Ok(graph)
}

/// A sparse MoE MLP (`Qwen3MoeSparseMoeBlock`, `Glm4MoeMoE`) on `normed`, the MLP's input
/// of layer `l`; returns the block's output (`mlp`). The router's logits are a linear
/// (`mlp.gate`); the routing is split into the chosen experts (`mlp.gate.top_k_index`) and
/// their weights (`mlp.gate.top_k_weights`), the two tensors the router's forward returns
/// besides its logits; the routed experts' weighted sum is `mlp.experts`, and with shared
/// experts (GLM) `mlp` adds their SwiGLU MLP (`mlp.shared_experts`), as `Glm4MoeMoE.forward`
/// does (`experts(...) + shared_experts(residuals)`). Hunyuan (`HunYuanMoEV1Moe`) names the
/// router's linear `mlp.gate.wg` (`mlp.gate` its alias) and its shared expert `mlp.shared_mlp`.
fn moe_mlp(
    b: &mut GraphBuilder,
    load: &mut Load<'_>,
    cfg: &DecoderConfig,
    moe: &MoeConfig,
    l: usize,
    normed: ValueId,
) -> Result<ValueId, ModelError> {
    let m = |role| Module::layer(l, role);
    let d = cfg.hidden_size;
    let router = moe.router;
    let (e, k) = (router.n_experts, router.top_k);
    let moe_wiring = cfg.wiring().moe.unwrap_or_default();
    // Hunyuan's gate module holds the linear as `wg`; the gate's first output is its logits.
    let logits = if moe_wiring.router_wg {
        let wg = linear(b, load, &m(R::RouterWg).name(), normed, e, d, false, false)?;
        b.alias(wg, m(R::Router).name());
        wg
    } else {
        linear(b, load, &m(R::Router).name(), normed, e, d, false, false)?
    };
    let bias = if moe.correction_bias {
        Some(b.weight(load(&m(R::Router).param("e_score_correction_bias"), &[e])?))
    } else {
        None
    };
    let per_token = |n: usize| vec![Dim::Tokens, Dim::Fixed(n)];
    let ids = b.node(
        m(R::RouterIndices).name(),
        Op::RouterSelect { router, bias },
        &[logits],
        per_token(k),
        vec!["token", "expert"],
    );
    let weights = b.node(
        m(R::RouterWeights).name(),
        Op::RouterWeights { router },
        &[logits, ids],
        per_token(k),
        vec!["token", "expert"],
    );
    // Checkpoints store each expert's projections as its own module
    // (`mlp.experts.N.gate_proj.weight`); transformers 5 fuses them into 3-D
    // `gate_up_proj` / `down_proj` parameters at load, which changes no number.
    let inter = moe.moe_intermediate_size;
    let experts_name = m(R::Experts).name();
    let mut experts = Vec::with_capacity(e);
    for x in 0..e {
        let mut w = |proj: &str, shape: &[usize]| -> Result<WeightId, ModelError> {
            Ok(b.weight(load(&format!("{experts_name}.{x}.{proj}.weight"), shape)?))
        };
        experts.push(ExpertWeights {
            gate: w("gate_proj", &[inter, d])?,
            up: w("up_proj", &[inter, d])?,
            down: w("down_proj", &[d, inter])?,
        });
    }
    let gelu_tanh = cfg.hidden_act == HiddenAct::GeluTanh;
    let routed = b.node(
        experts_name,
        Op::Experts { experts: Arc::new(experts), gelu_tanh },
        &[normed, ids, weights],
        per_token(d),
        vec!["token", "hidden"],
    );
    let Some(f) = moe.shared_intermediate_size else {
        // Qwen3-MoE: the block's output is the experts' (`Qwen3MoeSparseMoeBlock.forward`).
        b.alias(routed, m(R::Mlp).name());
        return Ok(routed);
    };
    // GLM's `mlp.shared_experts`, or Hunyuan's `mlp.shared_mlp` (the same SwiGLU MLP).
    let [r_gate, r_up, r_act, r_mul, r_down, r_out] = if moe_wiring.shared_mlp {
        [R::SharedMlpGate, R::SharedMlpUp, R::SharedMlpActFn, R::SharedMlpActMul, R::SharedMlpDown, R::SharedMlp]
    } else {
        [R::SharedGate, R::SharedUp, R::SharedActFn, R::SharedActMul, R::SharedDown, R::SharedExperts]
    };
    let gate = linear(b, load, &m(r_gate).name(), normed, f, d, false, false)?;
    let up = linear(b, load, &m(r_up).name(), normed, f, d, false, false)?;
    let act_op = if gelu_tanh { Op::Gelu { tanh: true } } else { Op::Silu };
    let act = b.node(m(r_act).name(), act_op, &[gate], per_token(f), vec!["token", "feature"]);
    let prod = b.node(m(r_mul).name(), Op::Mul, &[act, up], per_token(f), vec!["token", "feature"]);
    let shared = linear(b, load, &m(r_down).name(), prod, d, f, false, false)?;
    b.alias(shared, m(r_out).name());
    // `experts(...) + shared_experts(residuals)` (GLM), `final_hidden_states +
    // hidden_states_mlp` (Hunyuan): the routed output first.
    Ok(b.node(m(R::Mlp).name(), Op::Add, &[routed, shared], per_token(d), vec!["token", "hidden"]))
}

/// Loads a parameter by HF name, checking its shape.
type Load<'a> = dyn FnMut(&str, &[usize]) -> Result<Weight, ModelError> + 'a;

/// `x @ W^T (+ b)` named after the module; `transpose` plants transposed-weight.
/// `#[track_caller]` so the node records the layer code's line, not this helper's.
#[allow(clippy::too_many_arguments)]
#[track_caller]
fn linear(
    b: &mut GraphBuilder,
    load: &mut Load<'_>,
    module: &str,
    input: ValueId,
    rows: usize,
    cols: usize,
    bias: bool,
    transpose: bool,
) -> Result<ValueId, ModelError> {
    let mut w = load(&format!("{module}.weight"), &[rows, cols])?;
    if transpose {
        w = transposed(w);
    }
    let weight = b.weight(w);
    let bias = if bias { Some(b.weight(load(&format!("{module}.bias"), &[rows])?)) } else { None };
    let (shape, axes) = feature(rows);
    let v = b.node(module, Op::Linear { weight, bias }, &[input], shape, axes);
    if transpose {
        b.mark_fault(v, FaultClass::TransposedWeight);
    }
    Ok(v)
}

/// Columns `start..start + len` of a fused projection's output, as a value of its own.
#[track_caller]
fn part(b: &mut GraphBuilder, name: &str, fused: ValueId, start: usize, len: usize) -> ValueId {
    let (shape, axes) = feature(len);
    b.node(name, Op::Slice { start, len }, &[fused], shape, axes)
}

fn feature(n: usize) -> (Vec<Dim>, Vec<&'static str>) {
    (vec![Dim::Tokens, Dim::Fixed(n)], vec!["token", "feature"])
}

fn mark_if(b: &mut GraphBuilder, v: ValueId, on: bool, class: FaultClass) {
    if on {
        b.mark_fault(v, class);
    }
}

/// `1 + w` in f32, element by element: Gemma's RMSNorm scale (`Gemma3RMSNorm.forward`
/// computes `1.0 + self.weight.float()`), formed once at load.
fn plus_one(w: Weight) -> Weight {
    let data = match &w.data {
        WeightData::F32(d) => d.iter().map(|v| 1.0 + v).collect(),
        WeightData::Quant(q) => q.dequantize().into_iter().map(|v| 1.0 + v).collect(),
    };
    Weight { data: WeightData::F32(Arc::new(data)), ..w }
}

/// Rejects faults that cannot be planted in this model, before any weight is loaded.
fn check_faults(
    cfg: &DecoderConfig,
    source: &dyn WeightSource,
    faults: &[Fault],
    n_layers: usize,
) -> Result<(), ModelError> {
    for f in faults {
        let bad = |reason: String| ModelError::InvalidConfig {
            source_file: source.path().to_path_buf(),
            field: format!("fault {f}"),
            reason,
        };
        if f.layer >= n_layers {
            return Err(bad(format!("layer {} does not exist (the graph has {n_layers} decoder layers)", f.layer)));
        }
        let o_cols = cfg.num_attention_heads * cfg.head_dim;
        if f.class == FaultClass::GeluTanh && cfg.is_sparse(f.layer) {
            return Err(bad(format!(
                "layer {}'s MLP is a sparse MoE block, which has no mlp.act_fn to replace",
                f.layer
            )));
        }
        if f.class == FaultClass::GeluTanh && cfg.hidden_act == HiddenAct::GeluTanh {
            return Err(bad("the model's activation already is GELU (tanh approximation)".into()));
        }
        if f.class == FaultClass::TransposedWeight && o_cols != cfg.hidden_size {
            return Err(bad(format!(
                "o_proj's weight is {}x{o_cols}, not square, so it cannot be used transposed",
                cfg.hidden_size
            )));
        }
    }
    Ok(())
}

/// A square weight with rows and columns swapped, as f32 (block-quantized rows cannot be
/// transposed block-wise, so they are dequantized first).
fn transposed(w: Weight) -> Weight {
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let src: Vec<f32> = match &w.data {
        WeightData::F32(d) => d.as_ref().clone(),
        WeightData::Quant(q) => q.dequantize(),
    };
    let mut t = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = src[r * cols + c];
        }
    }
    Weight { name: w.name, shape: vec![cols, rows], data: WeightData::F32(Arc::new(t)), ..w }
}

#[cfg(test)]
mod tests;
