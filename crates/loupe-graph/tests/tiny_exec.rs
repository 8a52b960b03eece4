//! The executor on the graph of the tiny random-weight Llama (`loupe_models::tiny`): what
//! it shows observers and computes, grouped and node by node, with debug checks and the
//! profiler.

mod common;

use std::collections::{BTreeMap, HashMap};

use common::{cache, executor, lowered, model, node_of, tiny_path, verify_reason, PROMPT};
use loupe_graph::debug::DebugOptions;
use loupe_graph::exec::RunOptions;
use loupe_graph::kernel::{Kernel, Matmul, MatmulPrecision};
use loupe_graph::verify::verify;
use loupe_graph::{Dim, Executor, Graph, GraphError, KvCache, Observer, Op, ValueId, ValueInfo, WeightData};
use loupe_models::tiny::TinyLlama;
use loupe_models::{load, LoadOptions, Precision};
use loupe_tensor::quant::Isa;
use loupe_tensor::GgmlType;

// ---------------------------------------------------------------- exec

/// Keeps every value it is shown, by name (side outputs included), in the order shown.
#[derive(Default)]
struct Recorder {
    order: Vec<String>,
    values: BTreeMap<String, (Vec<usize>, Vec<u32>)>,
}

impl Observer for Recorder {
    fn wants(&mut self, _: &ValueInfo) -> bool {
        true
    }
    fn observe(&mut self, v: &ValueInfo, shape: &[usize], data: &[f32]) {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "{}: shape {shape:?} for {} values",
            v.name,
            data.len()
        );
        self.order.push(v.name.clone());
        let old = self.values.insert(v.name.clone(), (shape.to_vec(), data.iter().map(|x| x.to_bits()).collect()));
        assert!(old.is_none(), "{} observed twice in one run", v.name);
    }
}

/// Prefill of PROMPT then one decode step, recording every value of each call.
fn record(g: &Graph) -> (Recorder, Recorder, Vec<u32>) {
    let mut exec = executor(g);
    let mut kv = cache(g);
    let mut prefill = Recorder::default();
    exec.run(g, &PROMPT, &mut kv, RunOptions { all_logits: true }, Some(&mut prefill)).unwrap();
    let mut decode = Recorder::default();
    let logits = exec.run(g, &[17], &mut kv, RunOptions::default(), Some(&mut decode)).unwrap();
    let bits = logits.iter().map(|x| x.to_bits()).collect();
    (prefill, decode, bits)
}

#[test]
fn the_observer_sees_every_value_once_in_execution_order_with_its_shape() {
    let g = model(Precision::Native).graph;
    let (prefill, decode, _) = record(&g);
    let mut all: Vec<&str> = g.values.iter().map(|v| v.name.as_str()).collect();
    all.sort();
    for (call, rec, tokens, context) in
        [("prefill", &prefill, PROMPT.len(), PROMPT.len()), ("decode", &decode, 1, PROMPT.len() + 1)]
    {
        let seen: Vec<&str> = rec.values.keys().map(String::as_str).collect();
        assert_eq!(seen, all, "{call}: the observer must see every value, side outputs included");
        // Each value after the values it is computed from.
        let pos: HashMap<&str, usize> = rec.order.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
        for n in &g.nodes {
            for i in &n.inputs {
                assert!(pos[g.value(*i).name.as_str()] < pos[g.value(n.output).name.as_str()], "{call}: order");
            }
        }
        let shape = |n: &str| rec.values[n].0.clone();
        assert_eq!(shape("model.embed_tokens"), [tokens, 64]);
        assert_eq!(shape("model.layers.2.self_attn.k_rope"), [tokens, 32]);
        assert_eq!(shape("model.layers.2.self_attn.attn_probs"), [4, tokens, context]);
        assert_eq!(shape("model.layers.2.mlp.act_fn"), [tokens, 128]);
        let vocab = 3 + 256 + TinyLlama::default().merges;
        assert_eq!(shape("lm_head"), [if call == "prefill" { tokens } else { 1 }, vocab]);
    }
    // Causal attention: token 0 sees only itself; each row of probabilities sums to 1.
    let (_, probs) = &prefill.values["model.layers.0.self_attn.attn_probs"];
    let probs: Vec<f32> = probs.iter().map(|&b| f32::from_bits(b)).collect();
    assert_eq!(probs[0], 1.0);
    assert!(probs[1..PROMPT.len()].iter().all(|&p| p == 0.0));
    for row in probs.chunks(PROMPT.len()) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    }
    // An alias is the same value: the observer is shown it once, under its name.
    let o = g.find_value("model.layers.0.self_attn.o_proj").unwrap();
    assert!(g.value(o).answers_to("model.layers.0.self_attn"));
}

#[test]
fn an_observer_that_wants_nothing_is_shown_nothing_and_changes_nothing() {
    struct Nothing(usize);
    impl Observer for Nothing {
        fn wants(&mut self, _: &ValueInfo) -> bool {
            false
        }
        fn observe(&mut self, _: &ValueInfo, _: &[usize], _: &[f32]) {
            self.0 += 1;
        }
    }
    let g = lowered(&model(Precision::Native).graph);
    let (_, _, tapped) = record(&g);
    let mut exec = executor(&g);
    let mut kv = cache(&g);
    let mut nothing = Nothing(0);
    exec.run(&g, &PROMPT, &mut kv, RunOptions { all_logits: true }, Some(&mut nothing)).unwrap();
    let plain: Vec<u32> = exec
        .run(&g, &[17], &mut kv, RunOptions::default(), Some(&mut nothing))
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    assert_eq!(nothing.0, 0);
    assert_eq!(plain, tapped, "observing every value changed the logits");
}

/// Decode runs q/k/v and gate/up as one grouped matmul each (one fork-join), which must
/// change no bit: every value and the logits equal those of the node-by-node loop (which any
/// debug option forces; `assert-level=all` checks without changing anything).
#[test]
fn grouped_decode_linears_change_no_value_bit_for_bit() {
    for g in [model(Precision::Native).graph, lowered(&model(Precision::Native).graph)] {
        let run = |debug: &DebugOptions| {
            let mut exec = Executor::new(&g, debug);
            let mut kv = cache(&g);
            exec.run(&g, &PROMPT, &mut kv, RunOptions::default(), None).unwrap();
            let mut rec = Recorder::default();
            let logits: Vec<u32> = exec
                .run(&g, &[17], &mut kv, RunOptions::default(), Some(&mut rec))
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            let again: Vec<u32> = exec
                .run(&g, &[18], &mut kv, RunOptions::default(), None)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            (rec, logits, again, exec.grouped_linears())
        };
        let (grouped, logits, again, n_grouped) = run(&DebugOptions::default());
        let checked = DebugOptions { assert_level: loupe_graph::debug::AssertLevel::All, ..DebugOptions::default() };
        let (plain, plain_logits, plain_again, n_plain) = run(&checked);
        // Two decode steps, each with q/k/v and gate/up in every layer.
        assert_eq!(n_grouped, 2 * 5 * g.kv_layers as u64, "the grouping did not happen");
        assert_eq!(n_plain, 0, "a debug option must run node by node");
        assert_eq!(grouped.order, plain.order, "observation order");
        for (name, v) in &plain.values {
            assert!(grouped.values.get(name) == Some(v), "{name} differs between grouped and node-by-node decode");
        }
        assert_eq!(logits, plain_logits);
        assert_eq!(again, plain_again, "the step after an observed one");
    }
}

/// Prefill of 20 tokens: on an AMX CPU q/k/v and gate/up run as one grouped AMX call each
/// (the activations quantized once), which must give every value the bits of the node-by-node
/// loop. Elsewhere nothing is grouped in prefill, and the two runs are the same code.
#[test]
fn grouped_prefill_linears_change_no_value_bit_for_bit() {
    let prompt: Vec<u32> = (0..20).map(|i| 3 + 17 * i).collect();
    for g in [model(Precision::Native).graph, lowered(&model(Precision::Native).graph)] {
        let run = |debug: &DebugOptions| {
            let mut exec = Executor::new(&g, debug);
            let mut kv = cache(&g);
            let mut rec = Recorder::default();
            let logits: Vec<u32> = exec
                .run(&g, &prompt, &mut kv, RunOptions::default(), Some(&mut rec))
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            (rec, logits, exec.grouped_linears())
        };
        let (grouped, logits, n_grouped) = run(&DebugOptions::default());
        let checked = DebugOptions { assert_level: loupe_graph::debug::AssertLevel::All, ..DebugOptions::default() };
        let (plain, plain_logits, n_plain) = run(&checked);
        let amx = loupe_tensor::quant::Isa::active() >= loupe_tensor::quant::Isa::Amx;
        assert_eq!(n_grouped, if amx { 5 * g.kv_layers as u64 } else { 0 }, "q/k/v and gate/up grouped on AMX only");
        assert_eq!(n_plain, 0, "a debug option must run node by node");
        for (name, v) in &plain.values {
            assert!(grouped.values.get(name) == Some(v), "{name} differs between grouped and node-by-node prefill");
        }
        assert_eq!(logits, plain_logits);
    }
}

#[test]
fn lowering_changes_no_value_bit_for_bit() {
    for precision in [Precision::F32, Precision::Native, Precision::Q8] {
        let built = model(precision).graph;
        let low = lowered(&built);
        let (bp, bd, bl) = record(&built);
        let (lp, ld, ll) = record(&low);
        for (call, b, l) in [("prefill", &bp, &lp), ("decode", &bd, &ld)] {
            assert_eq!(b.values.len(), l.values.len(), "{precision:?} {call}");
            for (name, v) in &b.values {
                assert!(
                    l.values.get(name) == Some(v),
                    "{precision:?} {call}: {name} differs between the built and the lowered graph"
                );
            }
        }
        assert_eq!(bl, ll, "{precision:?}: logits");
    }
}

#[test]
fn all_logits_gives_one_row_per_token_and_its_last_row_is_the_default_output() {
    let g = model(Precision::F32).graph;
    let mut exec = executor(&g);
    let all = exec.run(&g, &PROMPT, &mut cache(&g), RunOptions { all_logits: true }, None).unwrap().to_vec();
    let last = exec.run(&g, &PROMPT, &mut cache(&g), RunOptions::default(), None).unwrap().to_vec();
    let vocab = last.len();
    assert_eq!(vocab, 3 + 256 + TinyLlama::default().merges);
    assert_eq!(all.len(), PROMPT.len() * vocab);
    let tail = &all[(PROMPT.len() - 1) * vocab..];
    let worst = tail.iter().zip(&last).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-4, "last row of all_logits differs from the last-token logits by {worst}");
    // Rows differ from one another (each position predicts for itself).
    assert_ne!(&all[..vocab], tail);
}

#[test]
fn the_cache_grows_across_calls_as_one_long_call() {
    for precision in [Precision::F32, Precision::Native] {
        let g = model(precision).graph;
        let n = PROMPT.len();
        // One call over n tokens.
        let mut kv_one = cache(&g);
        let one = executor(&g).run(&g, &PROMPT, &mut kv_one, RunOptions { all_logits: true }, None).unwrap().to_vec();
        let vocab = one.len() / n;
        // n-3 tokens, then three decode steps.
        let mut exec = executor(&g);
        let mut kv = cache(&g);
        let mut rows = exec.run(&g, &PROMPT[..n - 3], &mut kv, RunOptions { all_logits: true }, None).unwrap().to_vec();
        assert_eq!(kv.len(), n - 3);
        for (k, &t) in PROMPT[n - 3..].iter().enumerate() {
            rows.extend_from_slice(exec.run(&g, &[t], &mut kv, RunOptions::default(), None).unwrap());
            assert_eq!(kv.len(), n - 2 + k);
        }
        assert_eq!(rows.len(), one.len());
        // Native decode multiplies by 16-bit activation blocks: not bit-identical, but close.
        let tol = if precision == Precision::F32 { 1e-4 } else { 2e-2 };
        for (pos, (a, b)) in rows.chunks(vocab).zip(one.chunks(vocab)).enumerate() {
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(
                worst <= tol * scale.max(1.0),
                "{precision:?} position {pos}: logits differ by {worst} (scale {scale})"
            );
        }
        // The cached keys and values are those of the long call.
        for layer in 0..g.kv_layers {
            let ((k1, v1), (k2, v2)) = (kv_one.layer(layer), kv.layer(layer));
            let (k1, v1, k2, v2) = (k1.to_f32_vec(), v1.to_f32_vec(), k2.to_f32_vec(), v2.to_f32_vec());
            assert_eq!(k1.len(), n * g.kv_width);
            assert_eq!((k1.len(), v1.len()), (k2.len(), v2.len()));
            let worst = k1.iter().zip(k2).chain(v1.iter().zip(v2)).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(worst < 50.0 * tol, "{precision:?} layer {layer}: cache rows differ by {worst}");
        }
    }
}

#[test]
fn the_executor_rejects_bad_calls_with_typed_errors() {
    let g = model(Precision::F32).graph;
    let mut exec = executor(&g);
    let mut kv = KvCache::new(g.kv_layers, g.kv_width, 8);
    assert!(matches!(exec.run(&g, &[], &mut kv, RunOptions::default(), None), Err(GraphError::Input(_))));
    assert!(matches!(
        exec.run(&g, &PROMPT, &mut kv, RunOptions::default(), None),
        Err(GraphError::ContextOverflow { needed: 9, capacity: 8 })
    ));
    assert_eq!(kv.len(), 0, "a refused call leaves the cache as it was");
    exec.run(&g, &PROMPT[..8], &mut kv, RunOptions::default(), None).unwrap();
    assert!(matches!(
        exec.run(&g, &[5], &mut kv, RunOptions::default(), None),
        Err(GraphError::ContextOverflow { needed: 9, capacity: 8 })
    ));
    // A token outside the vocabulary is an error of the embedding kernel, naming the value.
    let mut kv = cache(&g);
    match exec.run(&g, &[1_000_000], &mut kv, RunOptions::default(), None) {
        Err(e @ GraphError::Kernel { .. }) => assert!(e.to_string().contains("model.embed_tokens"), "{e}"),
        other => panic!("{other:?}"),
    }
    // An executor made for another graph (the first two layers only).
    let other = load(tiny_path(), LoadOptions { layers: Some(2), ..Default::default() }).unwrap().graph;
    assert!(other.values.len() < g.values.len());
    let mut wrong = executor(&other);
    assert!(matches!(wrong.run(&g, &PROMPT, &mut cache(&g), RunOptions::default(), None), Err(GraphError::Input(_))));
}

#[test]
fn debug_checks_of_the_executor_catch_planted_defects() {
    let faults = |s: &str| vec![s.parse::<loupe_models::Fault>().unwrap()];
    let nan = load(tiny_path(), LoadOptions { faults: faults("nan@1"), ..Default::default() }).unwrap().graph;
    let mut kv = cache(&nan);
    // Off: the NaN goes through.
    let logits = executor(&nan).run(&nan, &PROMPT, &mut kv, RunOptions::default(), None).unwrap().to_vec();
    assert!(logits.iter().any(|x| !x.is_finite()));
    let opts = DebugOptions { nan_check: true, nan_check_stride: 1, ..DebugOptions::default() };
    match Executor::new(&nan, &opts).run(&nan, &PROMPT, &mut cache(&nan), RunOptions::default(), None) {
        Err(e @ GraphError::NanCheck { .. }) => assert!(
            e.to_string().contains("'model.layers.1.self_attn.o_proj'") && e.to_string().contains("plant_nan"),
            "{e}"
        ),
        other => panic!("{:?}", other.map(|l| l.len())),
    }
    let uninit = load(tiny_path(), LoadOptions { faults: faults("uninit@0"), ..Default::default() }).unwrap().graph;
    let opts = DebugOptions { uninitialized_read_check: true, ..DebugOptions::default() };
    match Executor::new(&uninit, &opts).run(&uninit, &PROMPT, &mut cache(&uninit), RunOptions::default(), None) {
        Err(e @ GraphError::UninitializedRead { .. }) => {
            assert!(e.to_string().contains("model.layers.0.self_attn.o_proj"), "{e}")
        }
        other => panic!("{:?}", other.map(|l| l.len())),
    }
    // On a clean graph the checks change nothing.
    let g = model(Precision::Native).graph;
    let plain = executor(&g).run(&g, &PROMPT, &mut cache(&g), RunOptions::default(), None).unwrap().to_vec();
    let all_on = DebugOptions {
        nan_check: true,
        nan_check_stride: 1,
        uninitialized_read_check: true,
        assert_level: loupe_graph::debug::AssertLevel::All,
        ..DebugOptions::default()
    };
    let checked =
        Executor::new(&g, &all_on).run(&g, &PROMPT, &mut cache(&g), RunOptions::default(), None).unwrap().to_vec();
    assert_eq!(
        plain.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        checked.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    // The executor skips clearing the outputs of kernels that overwrite them (slots keep
    // stale values between nodes and steps); with every slot poisoned instead, prefill then
    // decode steps give the same bits, so no such kernel reads what it did not write.
    for precision in [Precision::F32, Precision::Native] {
        let g = model(precision).graph;
        let (mut plain, mut checked) = (executor(&g), Executor::new(&g, &all_on));
        let (mut kv_plain, mut kv_checked) = (cache(&g), cache(&g));
        for step in [&PROMPT[..], &[5], &[6], &PROMPT[..3]] {
            let a = plain.run(&g, step, &mut kv_plain, RunOptions::default(), None).unwrap().to_vec();
            let b = checked.run(&g, step, &mut kv_checked, RunOptions::default(), None).unwrap().to_vec();
            assert_eq!(
                a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{precision:?}, step of {}",
                step.len()
            );
        }
    }
}

#[test]
fn the_profiler_counts_every_node_with_its_shape_costs_and_writes_a_chrome_trace() {
    use loupe_graph::profile::{node_cost, AttnWork};
    use loupe_graph::Profiler;
    // Native precision: decode runs q/k/v and gate/up as grouped matmuls, whose time the
    // profiler splits among their nodes.
    let m = model(Precision::Native);
    let g = lowered(&m.graph);
    let profiler = Profiler::new();
    let mut exec = executor(&g);
    exec.set_profiler(Some(profiler.clone()));
    let mut kv = KvCache::with_dtype(g.kv_layers, g.kv_width, g.context_length, g.kv_dtype);
    exec.run(&g, &PROMPT, &mut kv, RunOptions::default(), None).unwrap();
    for t in [5u32, 6, 7] {
        exec.run(&g, &[t], &mut kv, RunOptions::default(), None).unwrap();
    }
    assert!(exec.grouped_linears() > 0, "decode grouped some linears");
    let data = profiler.snapshot();
    assert_eq!(data.steps, 4);
    assert_eq!(data.nodes.len(), g.nodes.len(), "every node has a row");
    for node in &g.nodes {
        let name = &g.value(node.output).name;
        let s = &data.nodes[name.as_str()];
        assert_eq!((s.calls, s.op), (4, node.op.name()), "{name}");
        // Prefill of 9 rows, then 3 decode rows at contexts 10, 11, 12.
        let rows_logits = name == "lm_head";
        let mut want = (0u64, 0u64);
        for (past, rows) in [(0usize, PROMPT.len()), (9, 1), (10, 1), (11, 1)] {
            let r = if rows_logits { 1 } else { rows };
            let (b, f) = node_cost(&g, node, r, AttnWork::causal(past, rows));
            want = (want.0 + b, want.1 + f);
        }
        assert_eq!((s.bytes, s.flops), want, "{name}");
    }
    // Attention reads each cached position's keys and values once per step.
    let attn = g.nodes.iter().find(|n| matches!(n.op, Op::Attention { .. })).unwrap();
    let (bytes, flops) = node_cost(&g, attn, 1, AttnWork::causal(9, 1));
    let (kv_width, kv_elem) = (g.kv_width as u64, g.kv_dtype.bytes() as u64);
    let Op::Attention { shape, .. } = &attn.op else { unreachable!() };
    let q_width = (shape.n_heads * shape.head_dim) as u64;
    assert_eq!(bytes, 4 * q_width + 2 * 10 * kv_width * kv_elem);
    assert_eq!(flops, 4 * 10 * q_width);
    assert_eq!(AttnWork::causal(0, 4).pairs, 1 + 2 + 3 + 4, "causal prefill scores the lower triangle");

    let total: u64 = data.nodes.values().map(|s| s.nanos).sum();
    assert!(total > 0 && total <= data.step_nanos, "node time {total} within step time {}", data.step_nanos);
    let table = data.table(5);
    assert!(
        table.contains("profile: 4 steps") && table.contains("by op kind") && table.contains("slowest 5 nodes"),
        "{table}"
    );
    let ranked = data.ranked();
    assert!(ranked.windows(2).all(|w| w[0].nanos >= w[1].nanos));

    // The trace: valid JSON, named threads, one complete event per node run on thread 0
    // (a grouped matmul is one event for its nodes).
    let trace: serde_json::Value = serde_json::from_str(&data.chrome_trace()).expect("the trace is JSON");
    let events = trace["traceEvents"].as_array().unwrap();
    assert!(events.iter().any(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == 0));
    let on_graph_thread = events.iter().filter(|e| e["ph"] == "X" && e["tid"] == 0).count() as u64;
    let grouped_events = events.iter().filter(|e| e["cat"] == "linear_group").count() as u64;
    assert!(grouped_events > 0);
    assert_eq!(on_graph_thread + exec.grouped_linears() - grouped_events, 4 * g.nodes.len() as u64);
    assert!(events
        .iter()
        .filter(|e| e["ph"] == "X")
        .all(|e| e["dur"].as_f64().unwrap() >= 0.0 && e["ts"].as_f64().is_some()));
}

#[test]
fn profiling_changes_no_number() {
    let m = model(Precision::Native);
    let g = lowered(&m.graph);
    let run = |profile: bool| {
        let mut exec = executor(&g);
        if profile {
            exec.set_profiler(Some(loupe_graph::Profiler::new()));
        }
        let mut kv = KvCache::with_dtype(g.kv_layers, g.kv_width, g.context_length, g.kv_dtype);
        let mut out = exec.run(&g, &PROMPT, &mut kv, RunOptions::default(), None).unwrap().to_vec();
        out.extend_from_slice(exec.run(&g, &[5], &mut kv, RunOptions::default(), None).unwrap());
        out
    };
    let (plain, profiled) = (run(false), run(true));
    assert!(plain.iter().zip(&profiled).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// The tiny graph with a `soft_cap` node after `lm_head` as its logits (Gemma 2's final
/// soft-cap): the logits are `lm_head`'s soft-capped, row for row, and `lm_head` still runs
/// on the logits' rows only — the last token in generation, each span's last in a batched
/// step (where it gathers them) — with the same numbers as in the graph without the cap.
#[test]
fn a_soft_cap_after_lm_head_runs_on_the_logits_rows_only() {
    use loupe_graph::{BatchSpan, KvDtype, PagedKvCache};
    let plain = model(Precision::F32).graph;
    let cap = 2.0;
    let mut g = plain.clone();
    let head = g.logits.unwrap();
    let capped = ValueId(g.values.len() as u32);
    let mut info = g.value(head).clone();
    info.name = "logits".into();
    info.aliases.clear();
    g.values.push(info);
    g.nodes.push(loupe_graph::Node {
        op: Op::SoftCap { cap },
        inputs: vec![head],
        output: capped,
        side: None,
        fault: None,
    });
    g.logits = Some(capped);
    verify(&g).unwrap();
    let on = g.logit_rows_values();
    assert!(on[head.0 as usize] && on[capped.0 as usize] && on.iter().filter(|&&x| x).count() == 2);
    let capped_of = |x: &[f32]| {
        let mut y = x.to_vec();
        loupe_tensor::ops::soft_cap(&mut y, cap);
        y
    };
    for g2 in [g.clone(), lowered(&g)] {
        for all_logits in [false, true] {
            let opts = RunOptions { all_logits };
            let want = executor(&plain).run(&plain, &PROMPT, &mut cache(&plain), opts, None).unwrap().to_vec();
            let got = executor(&g2).run(&g2, &PROMPT, &mut cache(&g2), opts, None).unwrap().to_vec();
            assert_eq!(got, capped_of(&want), "all_logits {all_logits}");
        }
        // A batched step of two sequences: one logits row each, gathered by lm_head.
        let batched = |graph: &Graph| {
            let mut kv = PagedKvCache::new(graph.kv_layers, graph.kv_width, 4, 8, KvDtype::F32);
            let spans = [
                BatchSpan { len: 6, past: 0, blocks: &[0, 1], logits: 1, prompt_rows: 6, argmax_only: false },
                BatchSpan { len: 3, past: 0, blocks: &[2], logits: 1, prompt_rows: 3, argmax_only: false },
            ];
            executor(graph).run_batch(graph, &PROMPT, &spans, &mut kv, None).unwrap().to_vec()
        };
        let want = batched(&plain);
        assert_eq!(want.len(), 2 * (3 + 256 + TinyLlama::default().merges));
        assert_eq!(batched(&g2), capped_of(&want));
    }
    assert!(loupe_graph::print::to_text(&g)
        .contains(&format!("%{} logits = soft_cap(%{} lm_head) cap=2", capped.0, head.0)));
    // A cap that is not a positive number is refused by the verifier.
    let mut bad = g.clone();
    bad.nodes.last_mut().unwrap().op = Op::SoftCap { cap: 0.0 };
    assert!(verify_reason(verify(&bad)).contains("soft_cap 0"));
}

/// `slice` nodes splitting a value's columns (how Phi-3's fused `qkv_proj` and
/// `gate_up_proj` outputs become q, k, v and gate, up): each part holds its columns of every
/// row, bit for bit, at prefill and decode, built and lowered; the parts side by side are the
/// input again; the IR names the columns and the verifier refuses a slice past the row.
#[test]
fn slices_split_a_value_into_its_columns() {
    let mut g = model(Precision::F32).graph;
    let src = g.find_value("model.norm").unwrap();
    let width = match g.value(src).shape.last() {
        Some(Dim::Fixed(n)) => *n,
        other => panic!("model.norm width {other:?}"),
    };
    let parts = [(0, 5), (5, width - 5)];
    for (k, &(start, len)) in parts.iter().enumerate() {
        let out = ValueId(g.values.len() as u32);
        let mut info = g.value(src).clone();
        info.name = format!("model.norm.part{k}");
        info.aliases.clear();
        info.shape = vec![Dim::Tokens, Dim::Fixed(len)];
        g.values.push(info);
        g.nodes.push(loupe_graph::Node {
            op: Op::Slice { start, len },
            inputs: vec![src],
            output: out,
            side: None,
            fault: None,
        });
    }
    verify(&g).unwrap();
    for graph in [g.clone(), lowered(&g)] {
        let (prefill, decode, _) = record(&graph);
        for rec in [&prefill, &decode] {
            let (shape, whole) = &rec.values["model.norm"];
            let rows = shape[0];
            let mut joined = vec![Vec::new(); rows];
            for (k, &(start, len)) in parts.iter().enumerate() {
                let (pshape, part) = &rec.values[&format!("model.norm.part{k}")];
                assert_eq!(pshape, &vec![rows, len]);
                for r in 0..rows {
                    assert_eq!(
                        &part[r * len..(r + 1) * len],
                        &whole[r * width + start..r * width + start + len],
                        "part {k} row {r}"
                    );
                    joined[r].extend_from_slice(&part[r * len..(r + 1) * len]);
                }
            }
            assert_eq!(&joined.concat(), whole);
        }
    }
    let text = loupe_graph::print::to_text(&g);
    assert!(text.contains(&format!("model.norm.part1 = slice(%{} model.norm) columns=5..{width}", src.0)), "{text}");
    let mut bad = g.clone();
    bad.nodes.last_mut().unwrap().op = Op::Slice { start: 6, len: width - 5 };
    assert!(verify_reason(verify(&bad)).contains("slice of columns 6.."));
}

#[test]
fn the_executor_runs_the_selected_kernel_and_reports_one_that_does_not_fit_the_weights() {
    let mut g = lowered(&model(Precision::Native).graph);
    let i = node_of(&g, "model.layers.0.self_attn.q_proj");
    assert!(matches!(g.kernels[i], Kernel::Linear(Matmul { precision: MatmulPrecision::Native, .. })));
    // An f32 kernel for block-quantized weights: the executor does not choose again.
    g.kernels[i] = Kernel::Linear(Matmul { precision: MatmulPrecision::F32, ty: GgmlType::F32, isa: Isa::Scalar });
    g.groups = Some(Vec::new());
    let err = executor(&g).run(&g, &PROMPT, &mut cache(&g), RunOptions::default(), None).unwrap_err();
    match &err {
        GraphError::Kernel { name, .. } => assert_eq!(name, "model.layers.0.self_attn.q_proj", "{err}"),
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("selected for weight model.layers.0.self_attn.q_proj.weight"), "{err}");
}

/// Spans that read their logits only for each row's argmax (`BatchSpan::argmax_only`):
/// `lm_head` (block-quantized, native) screens them, so each row's argmax and its value
/// are the full computation's, bit for bit, while other values may differ (the screen ran);
/// a step where one span needs its logits, or an observer watches, computes them in full.
#[test]
fn argmax_only_spans_keep_every_rows_argmax() {
    use loupe_graph::{BatchSpan, KvDtype, PagedKvCache};
    use loupe_tensor::linear::can_screen;
    let g = lowered(&model(Precision::Native).graph);
    let head = g.nodes.iter().find(|n| Some(n.output) == g.logits).unwrap();
    let Op::Linear { weight, .. } = &head.op else { panic!("the logits come from {:?}", head.op) };
    let WeightData::Quant(q) = &g.weight(*weight).data else { panic!("lm_head is not block-quantized") };
    assert!(can_screen(q), "the tiny lm_head ({}) cannot be screened: the test proves nothing", q.ty);
    let run = |argmax_only: [bool; 2]| {
        let mut kv = PagedKvCache::new(g.kv_layers, g.kv_width, 4, 8, KvDtype::F32);
        // Verification-like spans: several logits rows each.
        let spans = [
            BatchSpan { len: 6, past: 0, blocks: &[0, 1], logits: 4, prompt_rows: 2, argmax_only: argmax_only[0] },
            BatchSpan { len: 3, past: 0, blocks: &[2], logits: 3, prompt_rows: 0, argmax_only: argmax_only[1] },
        ];
        executor(&g).run_batch(&g, &PROMPT, &spans, &mut kv, None).unwrap().to_vec()
    };
    let full = run([false, false]);
    let screened = run([true, true]);
    let vocab = full.len() / 7;
    let argmax = |row: &[f32]| (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
    for (r, (f, s)) in full.chunks_exact(vocab).zip(screened.chunks_exact(vocab)).enumerate() {
        let best = argmax(f);
        assert_eq!(argmax(s), best, "row {r}");
        assert_eq!(s[best].to_bits(), f[best].to_bits(), "row {r}: the argmax keeps its bits");
    }
    assert!(full.iter().zip(&screened).any(|(a, b)| a.to_bits() != b.to_bits()), "the screen did not run");
    // One span needs its logits: the whole step computes them in full.
    assert!(run([true, false]).iter().zip(&full).all(|(a, b)| a.to_bits() == b.to_bits()));
}
