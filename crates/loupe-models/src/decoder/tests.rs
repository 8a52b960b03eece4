use std::collections::HashMap;
use std::path::{Path, PathBuf};

use loupe_graph::{Executor, KvCache, Observer, RunOptions, ValueInfo};

use super::*;

/// Deterministic pseudo-random weights for a tiny model.
struct FakeSource {
    path: PathBuf,
    seed: u64,
}

impl WeightSource for FakeSource {
    fn load(&mut self, hf_name: &str, shape: &[usize]) -> Result<Weight, ModelError> {
        let n: usize = shape.iter().product();
        let norm = hf_name.contains("norm");
        let data = (0..n)
            .map(|_| {
                self.seed = self.seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = ((self.seed >> 33) as f32) / (1u64 << 31) as f32 - 0.5;
                if norm {
                    1.0 + 0.2 * u
                } else {
                    0.4 * u
                }
            })
            .collect();
        Ok(Weight {
            name: hf_name.into(),
            shape: shape.to_vec(),
            data: WeightData::F32(Arc::new(data)),
            source_type: loupe_tensor::GgmlType::F32,
            fp8: false,
        })
    }
    fn rope_freq_factors(&mut self) -> Result<Option<Vec<f32>>, ModelError> {
        Ok(None)
    }
    fn path(&self) -> &Path {
        &self.path
    }
}

fn tiny() -> DecoderConfig {
    DecoderConfig {
        family: crate::family::Family::Llama,
        vocab_size: 50,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 3,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 4,
        rotary_dim: 4,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        max_position_embeddings: 64,
        tie_word_embeddings: true,
        qkv_bias: false,
        o_bias: false,
        layer_windows: Vec::new(),
        hidden_act: HiddenAct::Silu,
        attention_scale: 0.5,
        rope_local_theta: None,
        attn_logit_softcap: None,
        final_logit_softcap: None,
        qk_norm: false,
        moe: None,
    }
}

/// A tiny MoE model: Qwen3-MoE (softmax router, 4 experts, top 2, layers 0 and 2 sparse),
/// GLM-4-MoE (grouped sigmoid router with correction bias, a shared expert, layers 1
/// and 2 sparse) or Hunyuan-MoE (Qwen3-MoE's router, a shared MLP, every layer sparse).
fn tiny_moe(family: crate::family::Family) -> DecoderConfig {
    use crate::family::Family;
    use loupe_tensor::ops::{Router, RouterScoring};
    let glm = family == Family::Glm4Moe;
    let hy = family == Family::HunyuanMoe;
    let router = if glm {
        Router {
            scoring: RouterScoring::Sigmoid,
            n_experts: 4,
            top_k: 2,
            n_group: 2,
            topk_group: 1,
            norm_topk_prob: true,
            scaling: 2.5,
        }
    } else {
        Router {
            scoring: RouterScoring::Softmax,
            n_experts: 4,
            top_k: 2,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            scaling: 1.0,
        }
    };
    let moe = MoeConfig {
        router,
        moe_intermediate_size: 8,
        shared_intermediate_size: (glm || hy).then_some(8),
        correction_bias: glm,
        sparse_layers: if glm {
            vec![false, true, true]
        } else if hy {
            vec![true; 3]
        } else {
            vec![true, false, true]
        },
    };
    // Hunyuan's q/k norms come after RoPE, from its family's wiring.
    DecoderConfig { family, qk_norm: !glm && !hy, tie_word_embeddings: false, moe: Some(moe), ..tiny() }
}

fn build(faults: &[Fault]) -> Graph {
    let mut src = FakeSource { path: "fake".into(), seed: 7 };
    build_decoder(&tiny(), &mut src, None, false, faults).unwrap()
}

struct Capture(HashMap<String, Vec<f32>>);
impl Observer for Capture {
    fn wants(&mut self, _: &ValueInfo) -> bool {
        true
    }
    fn observe(&mut self, v: &ValueInfo, _: &[usize], data: &[f32]) {
        self.0.insert(v.name.clone(), data.to_vec());
    }
}

/// Every value of a prefill of 6 tokens and one decode step, by `name@step`.
/// Every value of `want` is in `got` with the same bits (`label` prefixes the failing name).
fn assert_same_bits(want: &HashMap<String, Vec<f32>>, got: &HashMap<String, Vec<f32>>, label: &str) {
    for (k, v) in want {
        assert_eq!(
            got.get(k).map(|x| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>()),
            Some(v.iter().map(|f| f.to_bits()).collect()),
            "{label}{k}"
        );
    }
}

fn run(graph: &Graph) -> HashMap<String, Vec<f32>> {
    let mut exec = Executor::new(graph, &Default::default());
    let mut kv = KvCache::new(graph.kv_layers, graph.kv_width, 16);
    let mut all = HashMap::new();
    for (step, tokens) in [vec![3u32, 14, 15, 9, 26, 5], vec![35]].iter().enumerate() {
        let mut cap = Capture(HashMap::new());
        exec.run(graph, tokens, &mut kv, RunOptions { all_logits: true }, Some(&mut cap)).unwrap();
        all.extend(cap.0.into_iter().map(|(k, v)| (format!("{k}@{step}"), v)));
    }
    all
}

/// The node that plants each class at layer 1, by the value name it keeps.
fn planted_value(c: FaultClass) -> &'static str {
    match c {
        FaultClass::RopeInterleaved => "model.layers.1.self_attn.q_rope",
        FaultClass::TransposedWeight | FaultClass::Bf16 | FaultClass::Nan | FaultClass::Uninit => {
            "model.layers.1.self_attn.o_proj"
        }
        FaultClass::NormEps | FaultClass::NormEpsSubtle => "model.layers.1.input_layernorm",
        FaultClass::OProjScale => "model.layers.1.self_attn.o_proj",
        FaultClass::GeluTanh => "model.layers.1.mlp.act_fn",
        FaultClass::SoftmaxScale
        | FaultClass::GqaMapping
        | FaultClass::KvWrite
        | FaultClass::KvWriteDecode
        | FaultClass::Mask => "model.layers.1.self_attn.attn_output",
        FaultClass::MissingResidual => "model.layers.1.attn_residual",
        FaultClass::BlockTable | FaultClass::BatchReduction | FaultClass::SpecMask | FaultClass::StreamDropLast => {
            unreachable!("{c} is not in FaultClass::ALL")
        }
    }
}

/// The batched-engine faults leave every single-sequence run bit-identical and change
/// the batched step's logits: `block-table` once a sequence spans two blocks,
/// `batch-reduction` in any step of several rows.
#[test]
fn batched_engine_faults_show_only_in_batched_steps() {
    use loupe_graph::{BatchSpan, KvDtype, PagedKvCache};
    let clean = build(&[]);
    let batched_logits = |g: &Graph| {
        let mut exec = Executor::new(g, &Default::default());
        let mut kv = PagedKvCache::new(g.kv_layers, g.kv_width, 4, 8, KvDtype::F32);
        let tokens = [3u32, 14, 15, 9, 26, 5, 7, 8, 2];
        let spans = [
            BatchSpan { len: 6, past: 0, blocks: &[0, 1], logits: 1, prompt_rows: 6, argmax_only: false },
            BatchSpan { len: 3, past: 0, blocks: &[2], logits: 1, prompt_rows: 3, argmax_only: false },
        ];
        exec.run_batch(g, &tokens, &spans, &mut kv, None).unwrap().to_vec()
    };
    let base = batched_logits(&clean);
    for class in [FaultClass::BlockTable, FaultClass::BatchReduction] {
        let g = build(&[Fault { class, layer: 1 }]);
        assert_eq!(run(&g), run(&clean), "{class}: the single-sequence path changed");
        let text = loupe_graph::print::to_text(&g);
        assert!(text.contains(&format!("FAULT={}", class.name())), "{class}: not marked\n{text}");
        let faulty = batched_logits(&g);
        let vocab = base.len() / 2;
        assert_ne!(faulty[..vocab], base[..vocab], "{class}: the two-block sequence's logits did not change");
    }
}

/// `spec-mask` leaves a batched step without drafts bit-identical and changes the logits of a
/// step that verifies drafts (a span with a logits row per position).
#[test]
fn the_spec_mask_fault_shows_only_in_verify_steps() {
    use loupe_graph::{BatchSpan, KvDtype, PagedKvCache};
    let clean = build(&[]);
    let faulty = build(&[Fault { class: FaultClass::SpecMask, layer: 1 }]);
    assert_eq!(run(&faulty), run(&clean), "the single-sequence path changed");
    // A prompt of 5, then a step verifying 3 rows (the last token and 2 drafts).
    let steps = |g: &Graph, verify: usize| {
        let mut exec = Executor::new(g, &Default::default());
        let mut kv = PagedKvCache::new(g.kv_layers, g.kv_width, 4, 8, KvDtype::F32);
        let prompt = [3u32, 14, 15, 9, 26];
        let span = BatchSpan { len: 5, past: 0, blocks: &[0, 1], logits: 1, prompt_rows: 5, argmax_only: false };
        exec.run_batch(g, &prompt, &[span], &mut kv, None).unwrap();
        let next = [5u32, 7, 8];
        let span = BatchSpan { len: 3, past: 5, blocks: &[0, 1], logits: verify, prompt_rows: 0, argmax_only: false };
        exec.run_batch(g, &next, &[span], &mut kv, None).unwrap().to_vec()
    };
    assert_eq!(steps(&faulty, 1), steps(&clean, 1), "a step without drafts changed");
    let (base, spec) = (steps(&clean, 3), steps(&faulty, 3));
    let vocab = base.len() / 3;
    assert_ne!(spec[..vocab], base[..vocab], "the first verified row did not see the later drafts");
}

#[test]
fn each_fault_changes_its_node_and_nothing_before_it() {
    let clean = build(&[]);
    let base = run(&clean);
    let text = loupe_graph::print::to_text(&clean);
    assert!(!text.contains("FAULT="), "{text}");
    for class in FaultClass::ALL {
        let g = build(&[Fault { class, layer: 1 }]);
        let text = loupe_graph::print::to_text(&g);
        let name = planted_value(class);
        let line = text
            .lines()
            .find(|l| l.contains(&format!(" {name} =")))
            .unwrap_or_else(|| panic!("{class}: no node {name}\n{text}"));
        assert!(line.contains(&format!("FAULT={}", class.name())), "{class}: {line}");
        let vals = run(&g);
        // Everything of layer 0 is bit-identical; the planted value differs at some step
        // (kv-write only shows from position 1; mask only in a multi-token call).
        for (k, v) in &base {
            if k.starts_with("model.layers.0.") || k.starts_with("model.embed_tokens") {
                assert_eq!(vals.get(k), Some(v), "{class}: {k} changed");
            }
        }
        let differs = ["@0", "@1"].iter().any(|s| {
            let key = format!("{name}{s}");
            vals[&key] != base[&key]
        });
        assert!(differs, "{class}: {name} did not change");
        // kv-write-decode spares the prompt's call by design: its logits change at step 1.
        let step = if class == FaultClass::KvWriteDecode { "@1" } else { "@0" };
        assert_ne!(vals[&format!("lm_head{step}")], base[&format!("lm_head{step}")], "{class}: logits unchanged");
        if class == FaultClass::KvWriteDecode {
            assert_eq!(vals["lm_head@0"], base["lm_head@0"], "{class}: the prompt's call is untouched");
        }
    }
}

/// Every planted fault also plants into Phi-3's fused wiring (the activation's module is
/// `mlp.activation_fn` there): its node is marked, layer 0 is untouched and the logits
/// change; and the fused graph lowers without changing a bit.
#[test]
fn faults_plant_into_the_fused_wiring_and_lowering_keeps_its_values() {
    let cfg = DecoderConfig { family: crate::family::Family::Phi3, ..tiny() };
    let build = |faults: &[Fault]| {
        let mut src = FakeSource { path: "fake".into(), seed: 7 };
        build_decoder(&cfg, &mut src, None, false, faults).unwrap()
    };
    let clean = build(&[]);
    let base = run(&clean);
    assert!(
        base.contains_key("model.layers.1.self_attn.qkv_proj@0")
            && base.contains_key("model.layers.1.mlp.gate_up_proj.up@1")
    );
    for class in FaultClass::ALL {
        let g = build(&[Fault { class, layer: 1 }]);
        let name =
            if class == FaultClass::GeluTanh { "model.layers.1.mlp.activation_fn" } else { planted_value(class) };
        let text = loupe_graph::print::to_text(&g);
        let line = text
            .lines()
            .find(|l| l.contains(&format!(" {name} =")))
            .unwrap_or_else(|| panic!("{class}: no node {name}\n{text}"));
        assert!(line.contains(&format!("FAULT={}", class.name())), "{class}: {line}");
        let vals = run(&g);
        for (k, v) in &base {
            if k.starts_with("model.layers.0.") {
                assert_eq!(vals.get(k), Some(v), "{class}: {k} changed");
            }
        }
        let step = if class == FaultClass::KvWriteDecode { "@1" } else { "@0" };
        assert_ne!(vals[&format!("lm_head{step}")], base[&format!("lm_head{step}")], "{class}: logits unchanged");
    }
    let lowered = loupe_graph::passes::lower(
        clean.clone(),
        &loupe_graph::passes::LowerOptions { verify_between: true, ..Default::default() },
    )
    .unwrap()
    .graph;
    assert!(lowered.nodes.iter().any(|n| matches!(n.op, Op::SwiGlu)), "silu(gate part) * up part fuses");
    let low = run(&lowered);
    assert_same_bits(&base, &low, "");
}

/// Lowering (fuse, plan-memory, ...) changes no number, and a tap on a fused-away value
/// still sees it.
#[test]
fn lowered_graph_is_bit_identical_and_keeps_every_value_observable() {
    let built = build(&[]);
    let lowered = loupe_graph::passes::lower(
        built.clone(),
        &loupe_graph::passes::LowerOptions { verify_between: true, ..Default::default() },
    )
    .unwrap()
    .graph;
    assert!(lowered.nodes.len() < built.nodes.len(), "fuse removed no node");
    assert!(lowered.nodes.iter().any(|n| matches!(n.op, Op::SwiGlu)));
    let plan = lowered.memory_plan.as_ref().unwrap();
    assert!(plan.n_slots < lowered.values.len() / 2, "{} slots for {} values", plan.n_slots, lowered.values.len());
    // The verifier rejects a plan that puts two live values in one slot.
    let mut bad = lowered.clone();
    if let Some(p) = bad.memory_plan.as_mut() {
        p.slot.iter_mut().for_each(|s| *s = 0);
    }
    let e = loupe_graph::verify::verify(&bad).unwrap_err();
    assert!(e.to_string().contains("which still holds live"), "{e}");
    let (a, b) = (run(&built), run(&lowered));
    assert_eq!(a.len(), b.len());
    assert_same_bits(&a, &b, "");
    // Without observers the fused kernel takes its other path: same logits.
    let logits = |g: &Graph| {
        let mut exec = Executor::new(g, &Default::default());
        let mut kv = KvCache::new(g.kv_layers, g.kv_width, 16);
        exec.run(g, &[3, 14, 15, 9], &mut kv, RunOptions { all_logits: true }, None).unwrap().to_vec()
    };
    assert_eq!(logits(&built), logits(&lowered));
}

/// `roles` describes exactly what the builder emits: every value (and alias) is named by
/// a role, each role appears in each layer, and each node reads the values `inputs` says.
#[test]
fn roles_describe_the_built_graph() {
    use crate::family::Family;
    use crate::roles::{Module, ModuleRole};
    // Every wiring: plain (Llama), q/k norms (Qwen3), q/k and sandwich norms (Gemma 3),
    // sandwich norms and the final soft-cap (Gemma 2), sparse and dense layers (Qwen3-MoE),
    // with shared experts (GLM-4-MoE), fused projections (Phi-3, with partial rotary), q/k
    // norms after RoPE with Hunyuan's module names (`mlp.gate.wg`, `mlp.shared_mlp`).
    for family in [
        Family::Llama,
        Family::Qwen3,
        Family::Gemma3,
        Family::Gemma2,
        Family::Qwen3Moe,
        Family::Glm4Moe,
        Family::Phi3,
        Family::HunyuanMoe,
    ] {
        let cfg = match family {
            Family::Qwen3Moe | Family::Glm4Moe | Family::HunyuanMoe => tiny_moe(family),
            Family::Phi3 => DecoderConfig { family, rotary_dim: 2, ..tiny() },
            _ => DecoderConfig { family, qk_norm: family.qk_norm(), ..tiny() },
        };
        let cfg = if family == Family::Gemma2 {
            DecoderConfig { attn_logit_softcap: Some(5.0), final_logit_softcap: Some(3.0), ..cfg }
        } else {
            cfg
        };
        let wiring = cfg.wiring();
        assert_eq!(wiring.final_softcap, family == Family::Gemma2);
        let mut src = FakeSource { path: "fake".into(), seed: 7 };
        let g = build_decoder(&cfg, &mut src, None, false, &[]).unwrap();
        let n_layers = cfg.num_hidden_layers;
        let mut seen = std::collections::HashSet::new();
        for node in &g.nodes {
            for out in std::iter::once(node.output).chain(node.side) {
                let v = g.value(out);
                let m = Module::parse(&v.name).unwrap_or_else(|| panic!("{}: no role", v.name));
                assert_eq!(m.name(), v.name);
                seen.insert(m);
                let want: Vec<String> = m.inputs_in(n_layers, wiring).iter().map(Module::name).collect();
                let got: Vec<String> = node.inputs.iter().map(|&i| g.value(i).name.clone()).collect();
                assert_eq!(got, want, "{family:?}: inputs of {}", v.name);
                let aliases: Vec<Module> =
                    v.aliases.iter().map(|a| Module::parse(a).unwrap_or_else(|| panic!("{a}: no role"))).collect();
                assert!(aliases.iter().all(|a| a.canonical_in(wiring) == m), "{}: {:?}", v.name, v.aliases);
                assert_eq!(m.names_in(wiring)[1..], v.aliases[..], "{}", v.name);
                seen.extend(aliases);
            }
        }
        for l in 0..n_layers {
            for role in ModuleRole::ALL {
                assert_eq!(
                    seen.contains(&Module::layer(l, role)),
                    wiring.emits_at(l, role),
                    "{family:?} layer {l}: {role:?}"
                );
            }
        }
        for m in &seen {
            // (a sparse layer's `mlp` is no linear: the experts' output or a sum)
            let moe_block = m.role == ModuleRole::Mlp && wiring.sparse(m.layer);
            if (m.role.is_linear() && !moe_block) || m.role.is_norm() || m.role == ModuleRole::Embedding {
                // (Hunyuan's `mlp.gate` is an alias of its linear `mlp.gate.wg`)
                let w = m.canonical_in(wiring).param("weight");
                // a tied lm_head reads the embedding table
                assert!(g.weights.iter().any(|x| x.name == w) || m.role == ModuleRole::LmHead, "{w}");
            }
        }
    }
}

#[test]
fn faults_are_checked() {
    let mut src = FakeSource { path: "fake".into(), seed: 7 };
    let e =
        build_decoder(&tiny(), &mut src, Some(2), false, &[Fault { class: FaultClass::Mask, layer: 2 }]).unwrap_err();
    assert!(e.to_string().contains("layer 2 does not exist"), "{e}");
    let mut cfg = tiny();
    cfg.num_attention_heads = 2;
    cfg.num_key_value_heads = 1;
    let e = build_decoder(&cfg, &mut src, None, false, &[Fault { class: FaultClass::TransposedWeight, layer: 0 }])
        .unwrap_err();
    assert!(e.to_string().contains("not square"), "{e}");
}

#[test]
fn transposed_weight_is_the_transpose() {
    let g = build(&[Fault { class: FaultClass::TransposedWeight, layer: 1 }]);
    let clean = build(&[]);
    let find =
        |g: &Graph| g.weights.iter().find(|w| w.name == "model.layers.1.self_attn.o_proj.weight").cloned().unwrap();
    let (WeightData::F32(a), WeightData::F32(t)) = (find(&clean).data, find(&g).data) else { panic!("f32 expected") };
    let n = 16;
    for r in 0..n {
        for c in 0..n {
            assert_eq!(a[r * n + c], t[c * n + r]);
        }
    }
}

/// The experts' output against a scalar f64 recomputation from the graph's own weights
/// and the routing the graph chose, and the routing against the router's logits: for
/// each token, the chosen ids are the top-k of the scores (grouped sigmoid: with the
/// bias, inside the chosen groups), each expert id appears in ascending order, and the
/// weights are the renormalized (and scaled) unbiased scores. Prefill and one decode step.
#[test]
fn moe_layers_compute_their_formula() {
    use crate::family::Family;
    for family in [Family::Qwen3Moe, Family::Glm4Moe, Family::HunyuanMoe] {
        // Hunyuan's router linear is `mlp.gate.wg`, its shared expert `mlp.shared_mlp`.
        let (router, shared) =
            if family == Family::HunyuanMoe { ("gate.wg", "shared_mlp") } else { ("gate", "shared_experts") };
        let cfg = tiny_moe(family);
        let mut src = FakeSource { path: "fake".into(), seed: 11 };
        let g = build_decoder(&cfg, &mut src, None, false, &[]).unwrap();
        let vals = run(&g);
        let w = |name: &str| -> Vec<f32> {
            match &g.weights.iter().find(|x| x.name == name).unwrap_or_else(|| panic!("{name}")).data {
                WeightData::F32(d) => d.as_ref().clone(),
                WeightData::Quant(_) => unreachable!("f32 test weights"),
            }
        };
        let moe = cfg.moe.clone().unwrap();
        let (d, inter, e, k) = (cfg.hidden_size, moe.moe_intermediate_size, moe.router.n_experts, moe.router.top_k);
        let mut chosen = vec![0usize; e];
        for l in (0..cfg.num_hidden_layers).filter(|&l| cfg.is_sparse(l)) {
            let p = format!("model.layers.{l}.mlp");
            let bias = moe.correction_bias.then(|| w(&format!("{p}.gate.e_score_correction_bias")));
            for step in ["@0", "@1"] {
                let x = &vals[&format!("model.layers.{l}.post_attention_layernorm{step}")];
                let logits = &vals[&format!("{p}.{router}{step}")];
                let ids = &vals[&format!("{p}.gate.top_k_index{step}")];
                let wts = &vals[&format!("{p}.gate.top_k_weights{step}")];
                let out = &vals[&format!("{p}.experts{step}")];
                let tokens = x.len() / d;
                for t in 0..tokens {
                    let lg: Vec<f64> = logits[t * e..(t + 1) * e].iter().map(|&v| v as f64).collect();
                    let scores: Vec<f64> = if family == Family::Glm4Moe {
                        lg.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect()
                    } else {
                        let m = lg.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let s: f64 = lg.iter().map(|v| (v - m).exp()).sum();
                        lg.iter().map(|v| (v - m).exp() / s).collect()
                    };
                    let mut choice: Vec<f64> = scores
                        .iter()
                        .enumerate()
                        .map(|(i, s)| s + bias.as_ref().map_or(0.0, |b| b[i] as f64))
                        .collect();
                    if moe.router.n_group > 1 {
                        let per = e / moe.router.n_group;
                        let gs: Vec<f64> = choice
                            .chunks(per)
                            .map(|c| {
                                let mut c = c.to_vec();
                                c.sort_by(|a, b| b.partial_cmp(a).unwrap());
                                c[0] + c[1]
                            })
                            .collect();
                        let best = (0..gs.len()).max_by(|&a, &b| gs[a].partial_cmp(&gs[b]).unwrap()).unwrap();
                        for (i, c) in choice.iter_mut().enumerate() {
                            if i / per != best {
                                *c = f64::NEG_INFINITY;
                            }
                        }
                    }
                    let mut order: Vec<usize> = (0..e).collect();
                    order.sort_by(|&a, &b| choice[b].partial_cmp(&choice[a]).unwrap());
                    let mut want: Vec<usize> = order[..k].to_vec();
                    want.sort();
                    let got: Vec<usize> = ids[t * k..(t + 1) * k].iter().map(|&v| v as usize).collect();
                    assert_eq!(got, want, "{family:?} layer {l}{step} token {t}");
                    let total: f64 = want.iter().map(|&i| scores[i]).sum();
                    let scale = if family == Family::Glm4Moe { 2.5 } else { 1.0 };
                    let mut y = vec![0.0f64; d];
                    for (j, &i) in want.iter().enumerate() {
                        let wt = scores[i] / total * scale;
                        assert!(
                            (wts[t * k + j] as f64 - wt).abs() < 1e-5,
                            "{family:?} weight {} vs {wt}",
                            wts[t * k + j]
                        );
                        chosen[i] += 1;
                        let (gw, uw, dw) = (
                            w(&format!("{p}.experts.{i}.gate_proj.weight")),
                            w(&format!("{p}.experts.{i}.up_proj.weight")),
                            w(&format!("{p}.experts.{i}.down_proj.weight")),
                        );
                        let xr = &x[t * d..(t + 1) * d];
                        let h: Vec<f64> = (0..inter)
                            .map(|r| {
                                let dot = |m: &[f32]| (0..d).map(|c| m[r * d + c] as f64 * xr[c] as f64).sum::<f64>();
                                let gt = dot(&gw);
                                gt / (1.0 + (-gt).exp()) * dot(&uw)
                            })
                            .collect();
                        for (o, yo) in y.iter_mut().enumerate() {
                            *yo += wt * (0..inter).map(|c| dw[o * inter + c] as f64 * h[c]).sum::<f64>();
                        }
                    }
                    for o in 0..d {
                        assert!(
                            (out[t * d + o] as f64 - y[o]).abs() < 1e-4,
                            "{family:?} layer {l}{step} token {t} dim {o}: {} vs {}",
                            out[t * d + o],
                            y[o]
                        );
                    }
                }
            }
            // GLM's and Hunyuan's block output adds the shared experts.
            if moe.shared_intermediate_size.is_some() {
                let (a, b, m) = (
                    &vals[&format!("{p}.experts@0")],
                    &vals[&format!("{p}.{shared}.down_proj@0")],
                    &vals[&format!("{p}@0")],
                );
                for i in 0..m.len() {
                    assert_eq!(m[i], a[i] + b[i]);
                }
            }
        }
        assert!(chosen.iter().all(|&c| c > 0), "{family:?}: some expert was never chosen: {chosen:?}");
    }
}

/// MoE layers in the batched engine's executor path: two sequences in one ragged step
/// route each token as the single-sequence path does and give the same logits (to f32
/// matmul rounding: the batched path's matmuls are the row-invariant ones); lowering
/// changes no bit of any value.
#[test]
fn moe_batched_step_equals_single_sequences_and_lowering_changes_nothing() {
    use crate::family::Family;
    use loupe_graph::{BatchSpan, KvDtype, PagedKvCache};
    for family in [Family::Qwen3Moe, Family::Glm4Moe, Family::HunyuanMoe] {
        let mut src = FakeSource { path: "fake".into(), seed: 11 };
        let g = build_decoder(&tiny_moe(family), &mut src, None, false, &[]).unwrap();
        let seqs: [&[u32]; 2] = [&[3, 14, 15, 9, 26, 5], &[7, 8, 2]];
        let single: Vec<Vec<f32>> = seqs
            .iter()
            .map(|t| {
                let mut exec = Executor::new(&g, &Default::default());
                let mut kv = KvCache::new(g.kv_layers, g.kv_width, 16);
                exec.run(&g, t, &mut kv, RunOptions { all_logits: false }, None).unwrap().to_vec()
            })
            .collect();
        let mut exec = Executor::new(&g, &Default::default());
        let mut kv = PagedKvCache::new(g.kv_layers, g.kv_width, 4, 8, KvDtype::F32);
        let tokens: Vec<u32> = seqs.concat();
        let spans = [
            BatchSpan { len: 6, past: 0, blocks: &[0, 1], logits: 1, prompt_rows: 6, argmax_only: false },
            BatchSpan { len: 3, past: 0, blocks: &[2], logits: 1, prompt_rows: 3, argmax_only: false },
        ];
        let batched = exec.run_batch(&g, &tokens, &spans, &mut kv, None).unwrap().to_vec();
        let vocab = batched.len() / 2;
        for (i, s) in single.iter().enumerate() {
            let b = &batched[i * vocab..(i + 1) * vocab];
            let diff = s.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(diff < 1e-4, "{family:?} sequence {i}: batched logits differ by {diff}");
        }
        let lowered = loupe_graph::passes::lower(
            g.clone(),
            &loupe_graph::passes::LowerOptions { verify_between: true, ..Default::default() },
        )
        .unwrap()
        .graph;
        let (a, b) = (run(&g), run(&lowered));
        assert_eq!(a.len(), b.len());
        assert_same_bits(&a, &b, &format!("{family:?} "));
    }
}

/// gelu-tanh cannot be planted into a sparse layer, which has no `mlp.act_fn`.
#[test]
fn moe_layers_refuse_the_activation_fault() {
    let mut src = FakeSource { path: "fake".into(), seed: 7 };
    let e = build_decoder(
        &tiny_moe(crate::family::Family::Qwen3Moe),
        &mut src,
        None,
        false,
        &[Fault { class: FaultClass::GeluTanh, layer: 0 }],
    )
    .unwrap_err();
    assert!(e.to_string().contains("sparse MoE block"), "{e}");
}

/// Expert weights stored block-quantized (Q8_0) run through the same matmuls as a
/// quantized linear (`--precision native`: f32 activations; `q8`: 8-bit activations),
/// single-sequence and batched: the first sparse layer's experts output stays within
/// Q8_0's rounding of the f32 graph's (same weights before quantization, same routing).
#[test]
fn moe_experts_run_quantized_weights() {
    use crate::family::Family;
    use loupe_graph::{BatchSpan, KvDtype, PagedKvCache};
    struct QuantExperts(FakeSource);
    impl WeightSource for QuantExperts {
        fn load(&mut self, name: &str, shape: &[usize]) -> Result<Weight, ModelError> {
            let w = self.0.load(name, shape)?;
            if !name.contains(".experts.") {
                return Ok(w);
            }
            let WeightData::F32(d) = &w.data else { unreachable!("FakeSource gives f32") };
            let q =
                loupe_tensor::linear::QMatrix::quantize(loupe_tensor::GgmlType::Q8_0, shape[0], shape[1], d).unwrap();
            Ok(Weight { data: WeightData::Quant(Arc::new(q)), source_type: loupe_tensor::GgmlType::Q8_0, ..w })
        }
        fn rope_freq_factors(&mut self) -> Result<Option<Vec<f32>>, ModelError> {
            Ok(None)
        }
        fn path(&self) -> &Path {
            self.0.path()
        }
    }
    for family in [Family::Qwen3Moe, Family::Glm4Moe] {
        // Q8_0 blocks are 32 wide: hidden and expert widths of 32.
        let mut cfg = tiny_moe(family);
        cfg.hidden_size = 32;
        cfg.head_dim = 8;
        if let Some(m) = cfg.moe.as_mut() {
            m.moe_intermediate_size = 32;
            m.shared_intermediate_size = m.shared_intermediate_size.map(|_| 32);
        }
        let f32_graph =
            build_decoder(&cfg, &mut FakeSource { path: "fake".into(), seed: 3 }, None, false, &[]).unwrap();
        let layer = (0..cfg.num_hidden_layers).find(|&l| cfg.is_sparse(l)).unwrap();
        let name = format!("model.layers.{layer}.mlp.experts@0");
        let want = &run(&f32_graph)[&name];
        for q8 in [false, true] {
            let g = build_decoder(&cfg, &mut QuantExperts(FakeSource { path: "fake".into(), seed: 3 }), None, q8, &[])
                .unwrap();
            assert!(g.weights.iter().any(|w| matches!(w.data, WeightData::Quant(_))));
            let got = &run(&g)[&name];
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let err = want.iter().zip(got).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            // 8-bit activations add their own rounding to the weights'.
            let tol = if q8 { 0.04 } else { 0.02 };
            assert!(err < tol * scale && err > 0.0, "{family:?} q8 {q8}: error {err} of {scale}");
            // The batched path (row-local quantized matmuls) agrees with the single one.
            let mut exec = Executor::new(&g, &Default::default());
            let mut kv = PagedKvCache::new(g.kv_layers, g.kv_width, 4, 8, KvDtype::F32);
            let tokens = [3u32, 14, 15, 9, 26, 5];
            let batched = exec
                .run_batch(
                    &g,
                    &tokens,
                    &[BatchSpan { len: 6, past: 0, blocks: &[0, 1], logits: 1, prompt_rows: 6, argmax_only: false }],
                    &mut kv,
                    None,
                )
                .unwrap()
                .to_vec();
            let mut exec = Executor::new(&g, &Default::default());
            let mut kv = KvCache::new(g.kv_layers, g.kv_width, 16);
            let single = exec.run(&g, &tokens, &mut kv, RunOptions { all_logits: false }, None).unwrap().to_vec();
            let diff = single.iter().zip(&batched).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(diff < 1e-3, "{family:?} q8 {q8}: batched logits differ by {diff}");
        }
    }
}
