//! What the tiny-graph tests share: the tiny random-weight Llama (`loupe_models::tiny`),
//! loaded, lowered and run.
#![allow(dead_code)] // each test binary uses some of these

use std::path::PathBuf;
use std::sync::OnceLock;

use loupe_graph::debug::DebugOptions;
use loupe_graph::passes::{self, LowerOptions};
use loupe_graph::{Executor, Graph, GraphError, KvCache};
use loupe_models::tiny::{self, TinyLlama};
use loupe_models::{load, LoadOptions, Model, Precision};

/// The tiny model's file, written once per test binary.
pub fn tiny_path() -> &'static PathBuf {
    static PATH: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &PATH
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tiny.gguf");
            tiny::write_tiny_llama_gguf(&path, &TinyLlama::default()).unwrap();
            (dir, path)
        })
        .1
}

pub fn model(precision: Precision) -> Model {
    load(tiny_path(), LoadOptions { precision, ..Default::default() }).unwrap()
}

pub fn lowered(graph: &Graph) -> Graph {
    passes::lower(graph.clone(), &LowerOptions { verify_between: true, ..Default::default() }).unwrap().graph
}

pub fn executor(graph: &Graph) -> Executor {
    Executor::new(graph, &DebugOptions::default())
}

pub fn cache(graph: &Graph) -> KvCache {
    KvCache::new(graph.kv_layers, graph.kv_width, graph.context_length)
}

pub const PROMPT: [u32; 9] = [1, 72, 301, 44, 260, 7, 415, 99, 3];

/// The reason of a verification error, or a panic naming what came instead.
pub fn verify_reason(r: Result<(), GraphError>) -> String {
    match r {
        Err(GraphError::Verify { reason, .. }) => reason,
        other => panic!("expected a verification error, got {other:?}"),
    }
}

pub fn node_of(g: &Graph, name: &str) -> usize {
    let v = g.find_value(name).unwrap_or_else(|| panic!("no value {name}"));
    g.nodes.iter().position(|n| n.output == v).unwrap_or_else(|| panic!("no node computes {name}"))
}
