//! The `infer-shapes` pass: each node's output shape derived from its op, its inputs'
//! shapes and its weights. The builder declares shapes (they carry axis names for dumps);
//! this pass recomputes them and rejects a node whose declaration disagrees, so a builder
//! bug surfaces here, named, rather than as a kernel length error at run time.

use crate::ir::{Dim, Graph, Op};
use crate::GraphError;

pub fn infer_shapes(graph: &mut Graph) -> Result<(), GraphError> {
    for (i, node) in graph.nodes.iter().enumerate() {
        let input = |k: usize| graph.value(node.inputs[k]).shape.clone();
        let with_last = |mut s: Vec<Dim>, n: usize| {
            if let Some(l) = s.last_mut() {
                *l = Dim::Fixed(n);
            }
            s
        };
        let inferred = match &node.op {
            Op::Embedding { table, .. } | Op::PositionEmbedding { table, .. } | Op::ConstantEmbedding { table, .. } => {
                vec![Dim::Tokens, Dim::Fixed(graph.weight(*table).shape.get(1).copied().unwrap_or(0))]
            }
            Op::Linear { weight, .. } => with_last(input(0), graph.weight(*weight).shape.first().copied().unwrap_or(0)),
            // A norm weight narrower than the row normalizes each slice of its width: the
            // output is viewed per slice ([token, head, head_dim] for per-head q/k norms).
            // With one head the row is as wide as the weight, and the node's declared
            // [T, 1, w] says it is a per-head norm all the same.
            Op::RmsNorm { weight, .. } => {
                let w = graph.weight(*weight).shape.first().copied().unwrap_or(0);
                let per_head = graph.value(node.output).shape.len() == 3;
                match crate::verify::row_width(graph.value(node.inputs[0])) {
                    Some(n) if w > 0 && n % w == 0 && (n != w || per_head) => {
                        vec![Dim::Tokens, Dim::Fixed(n / w), Dim::Fixed(w)]
                    }
                    _ => input(0),
                }
            }
            // RoPE rotates each head's pairs in place and returns the flat row.
            Op::Rope { .. } => match crate::verify::row_width(graph.value(node.inputs[0])) {
                Some(n) => vec![Dim::Tokens, Dim::Fixed(n)],
                None => input(0),
            },
            Op::LayerNorm { .. }
            | Op::Silu
            | Op::Gelu { .. }
            | Op::Copy
            | Op::RoundBf16
            | Op::Scale { .. }
            | Op::SoftCap { .. }
            | Op::Plant(_) => input(0),
            Op::Mul | Op::Add | Op::SwiGlu => input(0),
            Op::Slice { len, .. } => with_last(input(0), *len),
            // Attention returns the flat row of its heads whatever view q comes in: RoPE's
            // flat row, or (Hunyuan, whose q/k norms follow RoPE) a per-head norm's
            // [token, head, head_dim].
            Op::Attention { shape, .. } => vec![Dim::Tokens, Dim::Fixed(shape.n_heads * shape.head_dim)],
            Op::RouterSelect { router, .. } | Op::RouterWeights { router } => with_last(input(0), router.top_k),
            Op::Experts { .. } => input(0),
        };
        let out = graph.value(node.output);
        if inferred != out.shape {
            let show = |s: &[Dim]| s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
            return Err(GraphError::Verify {
                node: i,
                name: out.name.clone(),
                location: out.location.to_string(),
                reason: format!(
                    "{} computes [{}] but the node declares [{}]",
                    node.op.name(),
                    show(&inferred),
                    show(&out.shape)
                ),
            });
        }
    }
    Ok(())
}
