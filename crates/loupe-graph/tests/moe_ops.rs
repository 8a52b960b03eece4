//! The MoE ops on a hand-built graph (embedding → router linear → `router_select` →
//! `router_weights` → `experts`): the experts' output against an f64 recomputation of its
//! formula for prefill, decode and a batched step; `--precision fp8` rounds the experts'
//! matmul inputs; the verifier rejects bad geometry and the executor a bad expert id.

use std::sync::Arc;

use loupe_graph::debug::DebugOptions;
use loupe_graph::exec::RunOptions;
use loupe_graph::{
    BatchSpan, Dim, Executor, ExpertWeights, Graph, GraphBuilder, KvCache, KvDtype, Observer, Op, PagedKvCache,
    ValueInfo, Weight, WeightData,
};
use loupe_tensor::ops::{Router, RouterScoring};
use loupe_tensor::GgmlType;

const D: usize = 32;
const I: usize = 16;
const E: usize = 4;
const K: usize = 2;
const VOCAB: usize = 10;

fn weight(name: &str, shape: &[usize], seed: &mut u64) -> Weight {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((*seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 0.6
        })
        .collect();
    Weight {
        name: name.into(),
        shape: shape.to_vec(),
        data: WeightData::F32(Arc::new(data)),
        source_type: GgmlType::F32,
        fp8: false,
    }
}

/// Embedding, router (named outside `model.layers` so `--precision fp8` leaves it alone),
/// routing and the experts (named as decoder-layer weights, which fp8 rounds), then a head.
fn graph(router: Router) -> Graph {
    let mut seed = 42;
    let mut b = GraphBuilder::new();
    // No attention: no cache rows, but a context for the positions.
    b.set_kv(0, 0, 64);
    let row = |n: usize| vec![Dim::Tokens, Dim::Fixed(n)];
    let table = b.weight(weight("embed", &[VOCAB, D], &mut seed));
    let x = b.node("x", Op::Embedding { table, scale: 1.0 }, &[], row(D), vec!["token", "hidden"]);
    let rw = b.weight(weight("router", &[E, D], &mut seed));
    let logits = b.node("gate", Op::Linear { weight: rw, bias: None }, &[x], row(E), vec!["token", "feature"]);
    // A small correction bias (±0.03), so both groups win some tokens.
    let bias = (router.scoring == RouterScoring::Sigmoid).then(|| {
        let mut w = weight("bias", &[E], &mut seed);
        if let WeightData::F32(d) = &w.data {
            w.data = WeightData::F32(Arc::new(d.iter().map(|v| v * 0.1).collect()));
        }
        b.weight(w)
    });
    let ids = b.node("ids", Op::RouterSelect { router, bias }, &[logits], row(K), vec!["token", "expert"]);
    let w = b.node("weights", Op::RouterWeights { router }, &[logits, ids], row(K), vec!["token", "expert"]);
    let experts = (0..E)
        .map(|e| {
            let p = format!("model.layers.0.mlp.experts.{e}");
            ExpertWeights {
                gate: b.weight(weight(&format!("{p}.gate_proj.weight"), &[I, D], &mut seed)),
                up: b.weight(weight(&format!("{p}.up_proj.weight"), &[I, D], &mut seed)),
                down: b.weight(weight(&format!("{p}.down_proj.weight"), &[D, I], &mut seed)),
            }
        })
        .collect();
    let out = b.node(
        "experts",
        Op::Experts { experts: Arc::new(experts), gelu_tanh: false },
        &[x, ids, w],
        row(D),
        vec!["token", "hidden"],
    );
    // A head after the experts: the logits' node runs on the logits' rows only.
    let hw = b.weight(weight("lm_head", &[VOCAB, D], &mut seed));
    let head = b.node("lm_head", Op::Linear { weight: hw, bias: None }, &[out], row(VOCAB), vec!["token", "vocab"]);
    b.set_logits(head);
    let g = b.finish();
    loupe_graph::verify::verify(&g).unwrap();
    g
}

struct Capture(Vec<(String, Vec<f32>)>);
impl Observer for Capture {
    fn wants(&mut self, _: &ValueInfo) -> bool {
        true
    }
    fn observe(&mut self, v: &ValueInfo, _: &[usize], data: &[f32]) {
        self.0.push((v.name.clone(), data.to_vec()));
    }
}

fn get<'a>(c: &'a Capture, name: &str) -> &'a [f32] {
    &c.0.iter().find(|(n, _)| n == name).unwrap().1
}

fn f32s(g: &Graph, name: &str) -> Vec<f32> {
    match &g.weights.iter().find(|w| w.name == name).unwrap().data {
        WeightData::F32(d) => d.as_ref().clone(),
        WeightData::Quant(q) => q.dequantize(),
    }
}

/// `sum_j w_j * down_e(silu(gate_e x) * up_e x)` over the token's chosen experts, in f64.
fn reference(g: &Graph, x: &[f32], ids: &[f32], w: &[f32]) -> Vec<f64> {
    let tokens = x.len() / D;
    let mut out = vec![0.0f64; tokens * D];
    for t in 0..tokens {
        let xr = &x[t * D..(t + 1) * D];
        for j in 0..K {
            let e = ids[t * K + j] as usize;
            let p = format!("model.layers.0.mlp.experts.{e}");
            let (gw, uw, dw) = (
                f32s(g, &format!("{p}.gate_proj.weight")),
                f32s(g, &format!("{p}.up_proj.weight")),
                f32s(g, &format!("{p}.down_proj.weight")),
            );
            let h: Vec<f64> = (0..I)
                .map(|r| {
                    let dot = |m: &[f32]| (0..D).map(|c| m[r * D + c] as f64 * xr[c] as f64).sum::<f64>();
                    let gt = dot(&gw);
                    gt / (1.0 + (-gt).exp()) * dot(&uw)
                })
                .collect();
            for o in 0..D {
                out[t * D + o] += w[t * K + j] as f64 * (0..I).map(|c| dw[o * I + c] as f64 * h[c]).sum::<f64>();
            }
        }
    }
    out
}

fn max_err(a: &[f32], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (*x as f64 - y).abs()).fold(0.0, f64::max)
}

fn routers() -> [Router; 2] {
    [
        Router {
            scoring: RouterScoring::Softmax,
            n_experts: E,
            top_k: K,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            scaling: 1.0,
        },
        Router {
            scoring: RouterScoring::Sigmoid,
            n_experts: E,
            top_k: K,
            n_group: 2,
            topk_group: 1,
            norm_topk_prob: true,
            scaling: 2.5,
        },
    ]
}

#[test]
fn experts_follow_their_formula_in_prefill_decode_and_batched_steps() {
    for router in routers() {
        let g = graph(router);
        let mut exec = Executor::new(&g, &DebugOptions::default());
        let mut kv = KvCache::new(0, 0, 16);
        let prompt = [1u32, 2, 3, 4, 5, 6, 7, 8];
        let mut seen = [false; E];
        for tokens in [&prompt[..], &[9u32][..]] {
            let mut cap = Capture(Vec::new());
            exec.run(&g, tokens, &mut kv, RunOptions { all_logits: true }, Some(&mut cap)).unwrap();
            let (x, ids, w) = (get(&cap, "x"), get(&cap, "ids"), get(&cap, "weights"));
            ids.iter().for_each(|&i| seen[i as usize] = true);
            let want = reference(&g, x, ids, w);
            assert!(
                max_err(get(&cap, "experts"), &want) < 1e-5,
                "{router:?}: {}",
                max_err(get(&cap, "experts"), &want)
            );
        }
        assert!(seen.iter().all(|&s| s), "{router:?}: not every expert was used: {seen:?}");
        // Two sequences in one batched step: each row as its formula (row-local matmuls).
        let mut exec = Executor::new(&g, &DebugOptions::default());
        let mut paged = PagedKvCache::new(0, 0, 4, 4, KvDtype::F32);
        let spans = [
            BatchSpan { len: 5, past: 0, blocks: &[0, 1], logits: 1, prompt_rows: 5, argmax_only: false },
            BatchSpan { len: 3, past: 0, blocks: &[2], logits: 1, prompt_rows: 3, argmax_only: false },
        ];
        let mut cap = Capture(Vec::new());
        exec.run_batch(&g, &prompt, &spans, &mut paged, Some(&mut cap)).unwrap();
        let want = reference(&g, get(&cap, "x"), get(&cap, "ids"), get(&cap, "weights"));
        assert!(max_err(get(&cap, "experts"), &want) < 1e-5, "{router:?} batched");
    }
}

#[test]
fn fp8_rounds_the_experts_inputs() {
    for router in routers() {
        let g = graph(router);
        let mut fp8 = g.clone();
        // Marked as the loader marks the decoder layers' weights under `--precision fp8`
        // (values left unrounded: only the inputs' rounding is under test).
        for w in fp8.weights.iter_mut().filter(|w| w.name.starts_with("model.layers.")) {
            w.fp8 = true;
        }
        let run = |g: &Graph| {
            let mut exec = Executor::new(g, &DebugOptions::default());
            let mut cap = Capture(Vec::new());
            exec.run(g, &[1, 2, 3, 4], &mut KvCache::new(0, 0, 8), RunOptions { all_logits: true }, Some(&mut cap))
                .unwrap();
            cap
        };
        let (a, b) = (run(&g), run(&fp8));
        // The router is not a decoder-layer weight: same routing, so only the experts moved.
        assert_eq!((get(&a, "ids"), get(&a, "weights")), (get(&b, "ids"), get(&b, "weights")));
        let (ea, eb) = (get(&a, "experts"), get(&b, "experts"));
        let scale = ea.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let err = ea.iter().zip(eb).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(err > 0.0 && err < 0.15 * scale, "{router:?}: fp8 error {err} of {scale}");
    }
}

#[test]
fn bad_geometry_is_refused_by_the_verifier() {
    let mut g = graph(routers()[0]);
    let i = g.nodes.iter().position(|n| matches!(n.op, Op::RouterSelect { .. })).unwrap();
    if let Op::RouterSelect { router, .. } = &mut g.nodes[i].op {
        router.top_k = E + 1;
    }
    let e = loupe_graph::verify::verify(&g).unwrap_err().to_string();
    assert!(e.contains("router"), "{e}");
    let mut g = graph(routers()[0]);
    let i = g.nodes.iter().position(|n| matches!(n.op, Op::Experts { .. })).unwrap();
    if let Op::Experts { experts, .. } = &mut g.nodes[i].op {
        let mut v = experts.as_ref().clone();
        let first = &mut v[0];
        std::mem::swap(&mut first.gate, &mut first.down);
        *experts = Arc::new(v);
    }
    let e = loupe_graph::verify::verify(&g).unwrap_err().to_string();
    assert!(e.contains("expert weights"), "{e}");
}
