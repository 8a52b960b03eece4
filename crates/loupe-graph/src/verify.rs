//! Structural verification of a graph: run after building and between lowering passes.
//! An error names the node, its value, the op and the source location that built it.

use std::collections::HashSet;

use crate::ir::{Dim, Graph, Node, Op, ValueInfo, WeightData};
use crate::GraphError;

/// Features per token of a `[T, ...]` value (product of its fixed dims), if it is one.
pub fn row_width(v: &ValueInfo) -> Option<usize> {
    match v.shape.split_first() {
        Some((Dim::Tokens, rest)) => rest.iter().try_fold(1usize, |acc, d| match d {
            Dim::Fixed(n) => acc.checked_mul(*n),
            Dim::Tokens | Dim::Context => None,
        }),
        _ => None,
    }
}

/// Checks that every value is produced once, before use, with consistent widths.
pub fn verify(graph: &Graph) -> Result<(), GraphError> {
    let mut defined = vec![false; graph.values.len()];
    let mut names = HashSet::new();
    for v in &graph.values {
        for n in std::iter::once(&v.name).chain(&v.aliases) {
            if !names.insert(n.as_str()) {
                return Err(GraphError::Verify {
                    node: 0,
                    name: n.clone(),
                    location: v.location.to_string(),
                    reason: "duplicate value name".into(),
                });
            }
        }
    }
    for (i, node) in graph.nodes.iter().enumerate() {
        let out = graph.values.get(node.output.0 as usize);
        let Some(out) = out else {
            return Err(fail(graph, i, node, format!("output %{} does not exist", node.output.0)));
        };
        if node.inputs.len() != node.op.arity() {
            return Err(fail(
                graph,
                i,
                node,
                format!("{} takes {} inputs, got {}", node.op.name(), node.op.arity(), node.inputs.len()),
            ));
        }
        for inp in &node.inputs {
            if !defined.get(inp.0 as usize).copied().unwrap_or(false) {
                return Err(fail(graph, i, node, format!("input %{} is used before it is computed", inp.0)));
            }
        }
        if defined[node.output.0 as usize] {
            return Err(fail(graph, i, node, "value computed twice".into()));
        }
        check_widths(graph, i, node, out)?;
        defined[node.output.0 as usize] = true;
        if let Some(side) = node.side {
            match defined.get_mut(side.0 as usize) {
                Some(d) if !*d => *d = true,
                _ => return Err(fail(graph, i, node, format!("side output %{} is missing or computed twice", side.0))),
            }
        }
    }
    if let Some(plan) = &graph.memory_plan {
        verify_plan(graph, plan)?;
    }
    verify_decisions(graph)?;
    match graph.logits {
        Some(l) if defined.get(l.0 as usize).copied().unwrap_or(false) => Ok(()),
        _ => Err(GraphError::Verify {
            node: graph.nodes.len(),
            name: "<logits>".into(),
            location: "<graph>".into(),
            reason: "no logits value is computed".into(),
        }),
    }
}

/// The lowering's per-node and per-weight decisions line up with the graph: one kernel per
/// node (or none yet), one precision per weight (or none yet), groups of linears in range.
fn verify_decisions(graph: &Graph) -> Result<(), GraphError> {
    let fail = |what: &str, reason: String| GraphError::Verify {
        node: 0,
        name: format!("<{what}>"),
        location: "<graph>".into(),
        reason,
    };
    if !graph.kernels.is_empty() && graph.kernels.len() != graph.nodes.len() {
        return Err(fail("kernels", format!("{} kernels for {} nodes", graph.kernels.len(), graph.nodes.len())));
    }
    if !graph.precision.is_empty() && graph.precision.len() != graph.weights.len() {
        let reason = format!("{} precisions for {} weights", graph.precision.len(), graph.weights.len());
        return Err(fail("precision", reason));
    }
    for g in graph.groups.iter().flatten() {
        let linears =
            graph.nodes.get(g.first..g.first + g.len).filter(|n| n.iter().all(|n| matches!(n.op, Op::Linear { .. })));
        if g.len < 2 || g.len > loupe_tensor::linear::MAX_GROUP || linears.is_none() {
            return Err(fail(
                "groups",
                format!(
                    "group of {} from node {} is not 2 to {} linears",
                    g.len,
                    g.first,
                    loupe_tensor::linear::MAX_GROUP
                ),
            ));
        }
    }
    Ok(())
}

/// A memory plan never gives a value a slot that holds another value still to be read
/// (or the logits, which outlive the run).
fn verify_plan(graph: &Graph, plan: &crate::ir::MemoryPlan) -> Result<(), GraphError> {
    if plan.slot.len() != graph.values.len() {
        return Err(GraphError::Verify {
            node: 0,
            name: "<memory plan>".into(),
            location: "<graph>".into(),
            reason: format!("{} slots planned for {} values", plan.slot.len(), graph.values.len()),
        });
    }
    let mut last_use = vec![None::<usize>; graph.values.len()];
    for (i, node) in graph.nodes.iter().enumerate() {
        for inp in &node.inputs {
            last_use[inp.0 as usize] = Some(i);
        }
    }
    let mut owner: Vec<Option<crate::ValueId>> = vec![None; plan.n_slots];
    for (i, node) in graph.nodes.iter().enumerate() {
        for v in std::iter::once(node.output).chain(node.side) {
            let slot = plan.slot[v.0 as usize] as usize;
            let Some(o) = owner.get_mut(slot) else {
                return Err(fail(graph, i, node, format!("%{} has slot {slot} of {}", v.0, plan.n_slots)));
            };
            if let Some(prev) = *o {
                let live = graph.logits == Some(prev) || last_use[prev.0 as usize].is_some_and(|l| l >= i);
                if live {
                    return Err(fail(
                        graph,
                        i,
                        node,
                        format!(
                            "%{} is planned into buf={slot}, which still holds live %{} {}",
                            v.0,
                            prev.0,
                            graph.value(prev).name
                        ),
                    ));
                }
            }
            *o = Some(v);
        }
    }
    Ok(())
}

fn check_widths(graph: &Graph, i: usize, node: &Node, out: &ValueInfo) -> Result<(), GraphError> {
    let width = |k: usize| row_width(graph.value(node.inputs[k]));
    let out_w = row_width(out);
    let expect = |ok: bool, what: String| if ok { Ok(()) } else { Err(fail(graph, i, node, what)) };
    match &node.op {
        Op::Embedding { table, .. } => {
            let w = weight(graph, i, node, table.0)?;
            expect(
                w.shape.len() == 2 && out_w == Some(w.shape[1]),
                format!("embedding table {:?} vs output width {:?}", w.shape, out_w),
            )
        }
        Op::PositionEmbedding { table, .. } | Op::ConstantEmbedding { table, .. } => {
            let w = weight(graph, i, node, table.0)?;
            expect(
                w.shape.len() == 2 && out_w == Some(w.shape[1]),
                format!("embedding table {:?} vs output width {:?}", w.shape, out_w),
            )?;
            if let Op::ConstantEmbedding { row, .. } = node.op {
                expect(row < w.shape[0], format!("row {row} of a table of {} rows", w.shape[0]))?;
            }
            Ok(())
        }
        Op::LayerNorm { weight: wid, bias, eps } => {
            let w = weight(graph, i, node, wid.0)?;
            let b = weight(graph, i, node, bias.0)?;
            let ok = w.shape.len() == 1
                && b.shape == w.shape
                && width(0) == Some(w.shape[0])
                && out_w == width(0)
                && eps.is_finite()
                && *eps >= 0.0;
            expect(
                ok,
                format!("layer_norm weight {:?}, bias {:?}, eps {eps}, input width {:?}", w.shape, b.shape, width(0)),
            )
        }
        Op::RmsNorm { weight: wid, .. } => {
            let w = weight(graph, i, node, wid.0)?;
            // A weight narrower than the row normalizes each slice of its width (per-head
            // q/k norms).
            let slices = width(0).is_some_and(|n| w.shape.len() == 1 && w.shape[0] > 0 && n % w.shape[0] == 0);
            expect(slices && out_w == width(0), format!("norm weight {:?}, input width {:?}", w.shape, width(0)))
        }
        Op::Linear { weight: wid, bias } => {
            let w = weight(graph, i, node, wid.0)?;
            let ok = w.shape.len() == 2 && width(0) == Some(w.shape[1]) && out_w == Some(w.shape[0]);
            expect(
                ok,
                format!(
                    "weight {} {:?} against input width {:?} and output width {:?}",
                    w.name,
                    w.shape,
                    width(0),
                    out_w
                ),
            )?;
            if let Some(b) = bias {
                let b = weight(graph, i, node, b.0)?;
                expect(b.shape == [w.shape[0]], format!("bias {:?} for {} outputs", b.shape, w.shape[0]))?;
            }
            Ok(())
        }
        Op::Rope { n_heads, table, mode: _ } => {
            let need = n_heads * table.head_dim();
            expect(
                width(0) == Some(need) && out_w == Some(need),
                format!("rope over {n_heads} heads of {} needs width {need}, got {:?}", table.head_dim(), width(0)),
            )
        }
        Op::Attention { layer, shape, variant: _, kv_write: _ } => {
            let q = shape.n_heads * shape.head_dim;
            let kv = shape.n_kv_heads * shape.head_dim;
            let ok = width(0) == Some(q) && width(1) == Some(kv) && width(2) == Some(kv) && out_w == Some(q);
            expect(
                ok,
                format!(
                    "attention widths q {:?} k {:?} v {:?} out {:?} for {shape:?}",
                    width(0),
                    width(1),
                    width(2),
                    out_w
                ),
            )?;
            expect(
                *layer < graph.kv_layers && kv == graph.kv_width,
                format!(
                    "layer {layer} / kv width {kv} outside the cache ({} layers x {})",
                    graph.kv_layers, graph.kv_width
                ),
            )
        }
        Op::SoftCap { cap } => expect(
            cap.is_finite() && *cap > 0.0 && width(0).is_some() && out_w == width(0),
            format!("soft_cap {cap} (must be positive) of width {:?} into {out_w:?}", width(0)),
        ),
        Op::Slice { start, len } => {
            let fits = width(0).is_some_and(|w| *len > 0 && start.checked_add(*len).is_some_and(|e| e <= w));
            expect(
                fits && out_w == Some(*len),
                format!("slice of columns {start}..{start}+{len} of width {:?} into {out_w:?}", width(0)),
            )
        }
        Op::Silu | Op::Gelu { .. } | Op::Copy | Op::RoundBf16 | Op::Scale { .. } | Op::Plant(_) => {
            expect(width(0).is_some() && out_w == width(0), format!("{} changes width", node.op.name()))
        }
        Op::Mul | Op::Add | Op::SwiGlu => expect(
            width(0).is_some() && width(0) == width(1) && out_w == width(0),
            format!("{} of widths {:?} and {:?}", node.op.name(), width(0), width(1)),
        ),
        Op::RouterSelect { router, bias } => {
            expect(
                router.check().is_ok(),
                format!("router {router:?}: {}", router.check().err().map(|e| e.to_string()).unwrap_or_default()),
            )?;
            expect(
                width(0) == Some(router.n_experts) && out_w == Some(router.top_k),
                format!(
                    "router_select of {} experts, top_k {}: input width {:?}, output {out_w:?}",
                    router.n_experts,
                    router.top_k,
                    width(0)
                ),
            )?;
            if let Some(b) = bias {
                let b = weight(graph, i, node, b.0)?;
                expect(
                    b.shape == [router.n_experts],
                    format!("correction bias {:?} for {} experts", b.shape, router.n_experts),
                )?;
            }
            Ok(())
        }
        Op::RouterWeights { router } => expect(
            router.check().is_ok()
                && width(0) == Some(router.n_experts)
                && width(1) == Some(router.top_k)
                && out_w == Some(router.top_k),
            format!(
                "router_weights of {} experts, top_k {}: inputs {:?} {:?}, output {out_w:?}",
                router.n_experts,
                router.top_k,
                width(0),
                width(1)
            ),
        ),
        Op::Experts { experts, gelu_tanh: _ } => {
            let d = width(0);
            expect(
                !experts.is_empty() && d.is_some() && out_w == d && width(1).is_some() && width(1) == width(2),
                format!("experts: hidden {d:?}, ids {:?}, weights {:?}, output {out_w:?}", width(1), width(2)),
            )?;
            for e in experts.iter() {
                let (g, u, dn) = (
                    weight(graph, i, node, e.gate.0)?,
                    weight(graph, i, node, e.up.0)?,
                    weight(graph, i, node, e.down.0)?,
                );
                let ok = g.shape.len() == 2
                    && g.shape == u.shape
                    && Some(g.shape[1]) == d
                    && dn.shape == [g.shape[1], g.shape[0]];
                expect(
                    ok,
                    format!(
                        "expert weights {} {:?}, {} {:?}, {} {:?} for hidden {d:?}",
                        g.name, g.shape, u.name, u.shape, dn.name, dn.shape
                    ),
                )?;
            }
            Ok(())
        }
    }
}

fn weight<'g>(graph: &'g Graph, i: usize, node: &Node, id: u32) -> Result<&'g crate::Weight, GraphError> {
    let w =
        graph.weights.get(id as usize).ok_or_else(|| fail(graph, i, node, format!("weight #{id} does not exist")))?;
    let len = match &w.data {
        WeightData::F32(d) => d.len(),
        WeightData::Quant(q) => q.rows * q.cols,
    };
    if w.shape.iter().product::<usize>() != len {
        return Err(fail(graph, i, node, format!("weight {} has shape {:?} but {len} elements", w.name, w.shape)));
    }
    Ok(w)
}

fn fail(graph: &Graph, i: usize, node: &Node, reason: String) -> GraphError {
    let v = graph.values.get(node.output.0 as usize);
    GraphError::Verify {
        node: i,
        name: v.map(|v| v.name.clone()).unwrap_or_default(),
        location: v.map(|v| v.location.to_string()).unwrap_or_default(),
        reason,
    }
}
