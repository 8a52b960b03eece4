//! Helpers shared by loupe-models' integration tests.
#![allow(dead_code)]

use loupe_graph::debug::DebugOptions;
use loupe_graph::exec::RunOptions;
use loupe_graph::{Executor, Graph, KvCache};

/// Logits of every position of `tokens` in one call.
pub fn all_logits(graph: &Graph, tokens: &[u32]) -> Vec<f32> {
    let mut exec = Executor::new(graph, &DebugOptions::default());
    let mut kv = KvCache::new(graph.kv_layers, graph.kv_width, graph.context_length);
    exec.run(graph, tokens, &mut kv, RunOptions { all_logits: true }, None).unwrap().to_vec()
}

pub fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |best, (i, &x)| if x > row[best] { i } else { best })
}
