//! The IR's verifier and lowering passes on the graph of the tiny random-weight Llama
//! (`loupe_models::tiny`): what each checks and what each pass guarantees afterwards. The
//! executor's tests are in `tiny_exec.rs`.

mod common;

use std::collections::HashMap;

use common::{lowered, model, node_of, verify_reason};
use loupe_graph::kernel::MatmulPrecision;
use loupe_graph::passes::{self, LowerError, LowerOptions, PASSES};
use loupe_graph::verify::verify;
use loupe_graph::{Dim, Graph, GraphError, Op, ValueId};
use loupe_models::Precision;

// ---------------------------------------------------------------- verify

#[test]
fn verify_accepts_the_built_and_the_lowered_graph() {
    for precision in [Precision::F32, Precision::Native, Precision::Q8] {
        let m = model(precision);
        verify(&m.graph).unwrap();
        verify(&lowered(&m.graph)).unwrap();
    }
}

#[test]
fn verify_rejects_an_input_used_before_it_is_computed_or_that_does_not_exist() {
    let g = model(Precision::F32).graph;
    let mut bad = g.clone();
    let q = node_of(&bad, "model.layers.0.self_attn.q_proj");
    let later = bad.find_value("model.layers.1.input_layernorm").unwrap();
    bad.nodes[q].inputs[0] = later;
    let why = verify_reason(verify(&bad));
    assert!(why.contains(&format!("input %{} is used before it is computed", later.0)), "{why}");

    let mut bad = g.clone();
    bad.nodes[q].inputs[0] = ValueId(1_000_000);
    assert!(verify_reason(verify(&bad)).contains("used before it is computed"));

    let mut bad = g.clone();
    let first = bad.nodes[q].inputs[0];
    bad.nodes[q].inputs.push(first);
    assert!(verify_reason(verify(&bad)).contains("linear takes 1 inputs, got 2"));

    let mut bad = g;
    let out = bad.nodes[q].output;
    let k = node_of(&bad, "model.layers.0.self_attn.k_proj");
    bad.nodes[k].output = out;
    assert!(verify_reason(verify(&bad)).contains("computed twice"));
}

#[test]
fn verify_rejects_width_mismatches_and_names_the_node() {
    let g = model(Precision::Native).graph;
    // A projection declared one feature too wide for its weight.
    let mut bad = g.clone();
    let v = bad.find_value("model.layers.2.mlp.up_proj").unwrap();
    bad.values[v.0 as usize].shape = vec![Dim::Tokens, Dim::Fixed(129)];
    match verify(&bad) {
        Err(GraphError::Verify { node, name, location, reason }) => {
            assert_eq!(node, node_of(&g, "model.layers.2.mlp.up_proj"));
            assert_eq!(name, "model.layers.2.mlp.up_proj");
            assert!(location.contains("crates/loupe-models/src/decoder.rs:"), "{location}");
            assert!(reason.contains("model.layers.2.mlp.up_proj.weight") && reason.contains("129"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // An add of two different widths.
    let mut bad = g.clone();
    let add = node_of(&bad, "model.layers.1.attn_residual");
    bad.nodes[add].inputs[1] = bad.find_value("model.layers.1.self_attn.k_proj").unwrap();
    assert!(verify_reason(verify(&bad)).contains("add of widths Some(64) and Some(32)"));
    // Attention whose layer has no cache.
    let mut bad = g.clone();
    let attn = node_of(&bad, "model.layers.3.self_attn.attn_output");
    if let Op::Attention { layer, .. } = &mut bad.nodes[attn].op {
        *layer = 4;
    } else {
        panic!("attn_output is not computed by attention");
    }
    assert!(verify_reason(verify(&bad)).contains("outside the cache"));
    // Duplicate names and a graph without logits.
    let mut bad = g.clone();
    bad.values[3].name = bad.values[2].name.clone();
    assert!(verify_reason(verify(&bad)).contains("duplicate value name"));
    let mut bad = g;
    bad.logits = None;
    assert!(verify_reason(verify(&bad)).contains("no logits"));
}

#[test]
fn verify_rejects_a_memory_plan_that_reuses_a_live_slot() {
    let g = lowered(&model(Precision::Native).graph);
    let plan = g.memory_plan.clone().expect("plan-memory ran");
    // The residual stream entering layer 1 is read again by layer 1's residual add, long
    // after q_proj of layer 1 ran: giving q_proj its slot overwrites a live value.
    let residual = g.find_value("model.layers.0").unwrap();
    let q = g.find_value("model.layers.1.self_attn.q_proj").unwrap();
    let mut bad = g.clone();
    bad.memory_plan.as_mut().unwrap().slot[q.0 as usize] = plan.slot[residual.0 as usize];
    let why = verify_reason(verify(&bad));
    assert!(why.contains("still holds live") && why.contains("model.layers.0"), "{why}");
    // A plan of the wrong size, a slot out of range.
    let mut bad = g.clone();
    bad.memory_plan.as_mut().unwrap().slot.pop();
    assert!(verify_reason(verify(&bad)).contains("slots planned for"));
    let mut bad = g;
    bad.memory_plan.as_mut().unwrap().slot[q.0 as usize] = plan.n_slots as u32;
    assert!(verify_reason(verify(&bad)).contains(&format!("of {}", plan.n_slots)));
}

// ---------------------------------------------------------------- passes

#[test]
fn passes_are_the_documented_list() {
    let names: Vec<&str> = PASSES.iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        ["verify", "infer-shapes", "choose-precision", "fuse", "plan-memory", "select-kernels", "schedule"]
    );
    assert!(PASSES.iter().all(|p| !p.about.is_empty()));
    assert_eq!(passes::find("fuse").map(|(i, _)| i), Some(3));
    assert!(passes::find("nope").is_none());
}

#[test]
fn infer_shapes_agrees_with_the_builder_and_rejects_a_wrong_declaration() {
    let g = model(Precision::F32).graph;
    let mut ok = g.clone();
    let (_, pass) = passes::find("infer-shapes").unwrap();
    (pass.run)(&mut ok).unwrap();
    // Features split in two axes keep the width (verify passes) but not the shape.
    let mut bad = g;
    let v = bad.find_value("model.layers.0.mlp.gate_proj").unwrap();
    bad.values[v.0 as usize].shape = vec![Dim::Tokens, Dim::Fixed(2), Dim::Fixed(64)];
    verify(&bad).unwrap();
    let err = (pass.run)(&mut bad).unwrap_err();
    assert!(err.to_string().contains("linear computes [T, 128] but the node declares [T, 2, 64]"), "{err}");
}

#[test]
fn fuse_replaces_every_silu_mul_pair_and_keeps_the_activation_observable() {
    let m = model(Precision::Native);
    let layers = m.config.num_hidden_layers();
    let built = &m.graph;
    let mut g = built.clone();
    let (_, fuse) = passes::find("fuse").unwrap();
    (fuse.run)(&mut g).unwrap();
    verify(&g).unwrap();
    let count = |g: &Graph, f: fn(&Op) -> bool| g.nodes.iter().filter(|n| f(&n.op)).count();
    assert_eq!(count(built, |o| matches!(o, Op::Silu)), layers);
    assert_eq!(count(&g, |o| matches!(o, Op::Silu)), 0);
    assert_eq!(count(&g, |o| matches!(o, Op::SwiGlu)), layers);
    assert_eq!(count(&g, |o| matches!(o, Op::Mul)), 0);
    assert_eq!(g.nodes.len(), built.nodes.len() - layers);
    // Values are not renumbered or dropped: the activation is the side output of the swiglu
    // that computes act_mul from gate_proj and up_proj.
    assert_eq!(g.values.len(), built.values.len());
    for l in 0..layers {
        let at = |n: &str| g.find_value(&format!("model.layers.{l}.mlp.{n}")).unwrap();
        let node = &g.nodes[node_of(&g, &format!("model.layers.{l}.mlp.act_mul"))];
        assert!(matches!(node.op, Op::SwiGlu));
        assert_eq!(node.inputs, [at("gate_proj"), at("up_proj")]);
        assert_eq!(node.side, Some(at("act_fn")));
    }
    // Fusing twice changes nothing.
    let once = g.nodes.len();
    (fuse.run)(&mut g).unwrap();
    assert_eq!(g.nodes.len(), once);
}

/// Independent liveness: the node range over which each value must keep its buffer.
fn live_ranges(g: &Graph) -> HashMap<ValueId, (usize, usize)> {
    let mut r: HashMap<ValueId, (usize, usize)> = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for v in std::iter::once(n.output).chain(n.side) {
            r.insert(v, (i, i));
        }
        for v in &n.inputs {
            r.get_mut(v).unwrap().1 = i;
        }
    }
    if let Some(l) = g.logits {
        r.get_mut(&l).unwrap().1 = usize::MAX;
    }
    r
}

#[test]
fn plan_memory_shares_slots_only_between_values_whose_lifetimes_do_not_overlap() {
    for precision in [Precision::F32, Precision::Native] {
        let g = lowered(&model(precision).graph);
        let plan = g.memory_plan.as_ref().unwrap();
        assert_eq!(plan.slot.len(), g.values.len());
        assert!(plan.slot.iter().all(|&s| (s as usize) < plan.n_slots));
        assert!(
            plan.n_slots * 4 < g.values.len(),
            "{} slots for {} values: little reuse",
            plan.n_slots,
            g.values.len()
        );
        let ranges: Vec<(ValueId, (usize, usize))> = live_ranges(&g).into_iter().collect();
        for (i, (a, ra)) in ranges.iter().enumerate() {
            for (b, rb) in &ranges[i + 1..] {
                if plan.slot[a.0 as usize] == plan.slot[b.0 as usize] {
                    // The later one is written after the earlier one's last read (a node
                    // never writes over its own input).
                    let disjoint = ra.1 < rb.0 || rb.1 < ra.0;
                    assert!(
                        disjoint,
                        "{} {ra:?} and {} {rb:?} share slot {}",
                        g.value(*a).name,
                        g.value(*b).name,
                        plan.slot[a.0 as usize]
                    );
                }
            }
        }
        // The executor plans an unlowered graph the same way.
        assert_eq!(&passes::plan_memory(&g), plan);
    }
}

/// Wide values share few slots: a slot's buffer keeps the capacity of the largest value it
/// ever held, so the planner puts each value in the smallest free slot it fits. The slots that
/// ever hold a value of the widest row (the MLP's intermediate) are exactly as many as such
/// values are live at once (gate, up and their product), not every slot of the plan.
#[test]
fn plan_memory_keeps_the_widest_values_in_as_few_slots_as_are_live_at_once() {
    let g = lowered(&model(Precision::Native).graph);
    let plan = g.memory_plan.as_ref().unwrap();
    let width = |v: ValueId| -> Option<usize> {
        match g.value(v).shape.as_slice() {
            [Dim::Tokens, Dim::Fixed(w)] if Some(v) != g.logits => Some(*w),
            _ => None,
        }
    };
    let ranges = live_ranges(&g);
    // Side outputs only a tap reads are never written otherwise: they size no buffer.
    let sized = |v: &ValueId| !g.nodes.iter().any(|n| n.side == Some(*v)) || ranges[v].0 != ranges[v].1;
    let widest = ranges.keys().filter(|v| sized(v)).filter_map(|&v| width(v)).max().unwrap();
    let wide: Vec<ValueId> = ranges.keys().copied().filter(|v| sized(v) && width(*v) == Some(widest)).collect();
    let live_at_once = (0..g.nodes.len())
        .map(|i| wide.iter().filter(|v| ranges[*v].0 <= i && i <= ranges[*v].1).count())
        .max()
        .unwrap();
    let mut wide_slots: Vec<u32> = wide.iter().map(|v| plan.slot[v.0 as usize]).collect();
    wide_slots.sort_unstable();
    wide_slots.dedup();
    assert!(live_at_once >= 2 && wide.len() > live_at_once, "the tiny model has {} wide values", wide.len());
    assert_eq!(
        wide_slots.len(),
        live_at_once,
        "values {widest} wide are spread over slots {wide_slots:?} of {}; at most {live_at_once} are live at once",
        plan.n_slots
    );
}

#[test]
fn select_kernels_names_one_kernel_per_node_by_weight_type_and_precision() {
    for (precision, want) in [
        (Precision::F32, "matmul_f32(gemm)"),
        (Precision::Native, "matmul_wq(q4_1,"),
        (Precision::Q8, "matmul_q(q4_1x8-bit activations,"),
    ] {
        let g = lowered(&model(precision).graph);
        assert_eq!(g.kernels.len(), g.nodes.len());
        let kernel = |name: &str| {
            let i = node_of(&g, name);
            g.kernels[i].label(g.nodes[i].op.name())
        };
        assert!(
            kernel("model.layers.0.self_attn.q_proj").starts_with(want),
            "{precision:?}: {}",
            kernel("model.layers.0.self_attn.q_proj")
        );
        let v = kernel("model.layers.0.self_attn.v_proj");
        assert!(
            if precision == Precision::F32 { v == "matmul_f32(gemm)" } else { v.contains("q8_0") },
            "{precision:?}: {v}"
        );
        assert_eq!(kernel("model.layers.0.self_attn.attn_output"), "attention_f32");
        assert_eq!(kernel("model.layers.0.mlp.act_mul"), "silu_mul");
        let embed = kernel("model.embed_tokens");
        assert_eq!(embed, if precision == Precision::F32 { "gather_f32" } else { "gather_dequantize(q8_0)" });
    }
}

#[test]
fn choose_precision_records_each_matmul_weights_arithmetic() {
    for (precision, want) in [
        (Precision::F32, MatmulPrecision::F32),
        (Precision::Native, MatmulPrecision::Native),
        (Precision::Q8, MatmulPrecision::Q8),
        (Precision::Fp8, MatmulPrecision::Fp8),
    ] {
        let g = lowered(&model(precision).graph);
        assert_eq!(g.precision.len(), g.weights.len());
        let of = |name: &str| g.precision[g.weights.iter().position(|w| w.name == name).unwrap()];
        assert_eq!(of("model.layers.0.self_attn.q_proj.weight"), Some(want), "{precision:?}");
        assert_eq!(of("model.layers.0.input_layernorm.weight"), None, "no matmul reads a norm weight");
        // FP8 rounds the decoder layers' projections only: lm_head keeps f32 activations.
        let head = g.nodes.iter().find(|n| Some(n.output) == g.logits).unwrap();
        let Op::Linear { weight, .. } = head.op else { panic!("lm_head is a linear") };
        let head_precision = g.precision[weight.0 as usize];
        assert_ne!(head_precision, Some(MatmulPrecision::Fp8), "{precision:?}");
    }
}

#[test]
fn schedule_groups_q_k_v_and_gate_up_of_native_linears_and_the_ir_says_so() {
    for precision in [Precision::Native, Precision::Q8, Precision::F32] {
        let g = lowered(&model(precision).graph);
        let groups = g.groups.as_ref().expect("schedule ran");
        let text = loupe_graph::print::to_text(&g);
        if precision != Precision::Native {
            assert!(groups.is_empty() && !text.contains(" group="), "{precision:?}");
            continue;
        }
        assert_eq!(groups.len(), 2 * g.kv_layers);
        let names = |k: usize| -> Vec<&str> {
            let grp = groups[k];
            g.nodes[grp.first..grp.first + grp.len].iter().map(|n| g.value(n.output).name.as_str()).collect()
        };
        let at = |s: &str| format!("model.layers.0.{s}");
        assert_eq!(names(0), [at("self_attn.q_proj"), at("self_attn.k_proj"), at("self_attn.v_proj")]);
        assert_eq!(names(1), [at("mlp.gate_proj"), at("mlp.up_proj")]);
        let line = text.lines().find(|l| l.contains("model.layers.0.self_attn.k_proj = linear")).unwrap();
        assert!(line.contains(" group=2/3"), "{line}");
    }
}

#[test]
fn lower_stops_after_a_named_pass_and_writes_one_ir_file_per_pass() {
    let g = model(Precision::Native).graph;
    let out =
        passes::lower(g.clone(), &LowerOptions { stop_after: Some("fuse".into()), ..Default::default() }).unwrap();
    assert_eq!(out.stopped_after, Some("fuse"));
    assert!(out.graph.memory_plan.is_none() && out.graph.kernels.is_empty());
    assert!(out.graph.nodes.iter().any(|n| matches!(n.op, Op::SwiGlu)));
    let last =
        passes::lower(g.clone(), &LowerOptions { stop_after: Some("schedule".into()), ..Default::default() }).unwrap();
    assert_eq!(last.stopped_after, None, "stopping after the last pass is not stopping early");
    assert!(matches!(
        passes::lower(g.clone(), &LowerOptions { stop_after: Some("nope".into()), ..Default::default() }),
        Err(LowerError::UnknownPass(_))
    ));

    let dir = tempfile::tempdir().unwrap();
    let out =
        passes::lower(g, &LowerOptions { ir_output_dir: Some(dir.path().join("ir")), ..Default::default() }).unwrap();
    assert_eq!(out.files.len(), PASSES.len());
    for (i, (f, p)) in out.files.iter().zip(PASSES).enumerate() {
        assert_eq!(f.file_name().unwrap().to_string_lossy(), format!("{i:02}-{}.ir", p.name));
        let text = std::fs::read_to_string(f).unwrap();
        assert!(text.starts_with(&format!("# after pass {i:02} {}: ", p.name)), "{}", f.display());
        assert!(text.contains("model.layers.3.mlp.down_proj"), "{}", f.display());
    }
}

#[test]
fn lowering_reports_which_pass_made_the_graph_invalid() {
    let mut g = model(Precision::F32).graph;
    let v = g.find_value("model.layers.0.mlp.gate_proj").unwrap();
    g.values[v.0 as usize].shape = vec![Dim::Tokens, Dim::Fixed(2), Dim::Fixed(64)];
    let err = passes::lower(g, &LowerOptions { verify_between: true, ..Default::default() }).unwrap_err();
    match &err {
        LowerError::Pass { pass, .. } => assert_eq!(*pass, "infer-shapes", "{err}"),
        other => panic!("{other:?}"),
    }
}
