//! What the verdict and the signature table both look at: the per-pair results in
//! execution order with their context ([`Evidence`]), and the false cliffs found in them.
//! [`crate::signatures`] reads these; [`crate::verdict`] reads these and the signatures
//! (so neither of the two modules depends on the other both ways).

use serde::Serialize;

use crate::result::{PairReport, Reason, Thresholds};

/// A dump bug that imitates a divergence (docs/parity-protocol.md, "False cliffs").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FalseCliff {
    /// `layer_offset`, `decode_mask` or `double_hook`.
    pub kind: &'static str,
    pub message: String,
    pub names: Vec<String>,
}

/// How a diverged target layer output compares with the reference's neighbours.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerShift {
    pub layer: usize,
    pub step: u32,
    pub own_cosine: f64,
    /// cos(target layer i, reference layer i+1).
    pub vs_next: Option<f64>,
    /// cos(target layer i, reference layer i-1, or the embedding for layer 0).
    pub vs_prev: Option<f64>,
}

/// Everything the verdict looks at.
#[derive(Debug, Clone, Default)]
pub struct Evidence<'a> {
    /// In execution order.
    pub pairs: &'a [PairReport],
    pub thresholds: Thresholds,
    pub prompt_tokens: Option<(Vec<i64>, Vec<i64>)>,
    pub layer_shifts: Vec<LayerShift>,
    /// Raw names of each side (for double-fired hooks).
    pub names_a: Vec<String>,
    pub names_b: Vec<String>,
}

impl Evidence<'_> {
    /// Index of the first failing pair.
    pub fn first(&self) -> Option<usize> {
        self.pairs.iter().position(|p| p.status.is_failure())
    }
}

/// Whether a pair's reasons are only about magnitude (cosine within tolerance).
pub fn magnitude_only(p: &PairReport) -> bool {
    !p.reasons.is_empty() && p.reasons.iter().all(|r| matches!(r, Reason::Nmse | Reason::NormRatio))
}
