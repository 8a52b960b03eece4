//! Planted faults: named, deliberate bugs that a model builder puts into one decoder layer
//! of loupe's own graph (`loupe dump --inject rope-interleaved@1`).
//!
//! Each class is one of the porting bugs that docs/parity-protocol.md's signatures and
//! hypotheses are about. Planting them in a graph that is otherwise right gives the parity
//! tools (compare, explain) a known answer to be tested against: the first divergence must
//! land on the planted node, and the hypothesis that names the class must reproduce it.
//! A faulty node keeps its value's name (dumps still pair with the reference) and carries
//! the class in [`crate::Node::fault`], which the IR text shows.

use std::fmt;
use std::str::FromStr;

/// What is planted. The per-class docs say what the faulty node computes instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultClass {
    /// q and k RoPE pair adjacent elements `(2i, 2i+1)` instead of `(i, i + hd/2)`.
    RopeInterleaved,
    /// `o_proj` multiplies by its weight transposed (square weights only).
    TransposedWeight,
    /// `input_layernorm` uses eps = 0.1 instead of the config's.
    NormEps,
    /// `input_layernorm` uses 100 times the config's eps (1e-3 for 1e-5): each token row is
    /// scaled by a hair (relative change ≈ Δeps / 2·mean(x²)), its direction unchanged. (A
    /// tenth of the config's, the classic hard-coded 1e-6, moves SmolLM2's layers by less
    /// than f32 rounding: no tool could see it, and it changes nothing.)
    NormEpsSubtle,
    /// `o_proj`'s output is multiplied by 33/32: a stray constant multiplier (a residual or
    /// attention multiplier applied twice); the direction is unchanged.
    OProjScale,
    /// `mlp.act_fn` is GELU (tanh approximation) instead of SiLU.
    GeluTanh,
    /// Attention scores scaled by `1/head_dim` instead of `1/sqrt(head_dim)`.
    SoftmaxScale,
    /// Query head `h` reads kv head `h % n_kv` instead of `h / (n_heads / n_kv)`.
    GqaMapping,
    /// `attn_residual` is the attention output alone, without adding the layer input.
    MissingResidual,
    /// `o_proj`'s output is rounded to bfloat16.
    Bf16,
    /// Keys land in the cache one position late: row `p` holds the key of `p - 1`.
    KvWrite,
    /// As `KvWrite`, but only from the second forward call on (decode steps): one pass over
    /// the whole sequence (teacher forcing) is right, incremental decode is not.
    KvWriteDecode,
    /// No causal mask within a call: queries see later tokens of the same forward.
    Mask,
    /// Batched engine only: layer `L`'s attention reads its keys and values through the
    /// sequence's block table indexed one entry late (logical block `j > 0` reads the block
    /// of `j - 1`), so every position past the first block sees older keys. Writes go to
    /// the right blocks; the single-sequence path has no block table and is untouched.
    BlockTable,
    /// Batched engine only: layer `L`'s `input_layernorm` takes its mean square over the
    /// step's rows (per feature, across every sequence in the step) instead of over each
    /// row's features: a reduction over the wrong axis, so a sequence's numbers depend on
    /// the rows batched beside it.
    BatchReduction,
    /// Batched engine, speculative verify steps only: layer `L`'s attention lets every row of
    /// a sequence that verifies drafts see all of that step's rows (its later drafts too), a
    /// verify mask that is not causal. Steps without drafts are untouched, so the batched
    /// engine is right until speculation is on.
    SpecMask,
    /// Server only: a streamed response drops its last text delta before the finish chunk
    /// (text held back, for stop strings, and never flushed). Plain responses are right.
    StreamDropLast,
    /// Test-only (for `LOUPE_DEBUG=nan-check`): `o_proj`'s output gets one NaN and one +Inf.
    Nan,
    /// Test-only (for `LOUPE_DEBUG=uninitialized-read-check`): `o_proj`'s output is
    /// written only in its first half; the rest is whatever the buffer held.
    Uninit,
}

impl FaultClass {
    pub const ALL: [FaultClass; 13] = [
        FaultClass::RopeInterleaved,
        FaultClass::TransposedWeight,
        FaultClass::NormEps,
        FaultClass::NormEpsSubtle,
        FaultClass::OProjScale,
        FaultClass::GeluTanh,
        FaultClass::SoftmaxScale,
        FaultClass::GqaMapping,
        FaultClass::MissingResidual,
        FaultClass::Bf16,
        FaultClass::KvWrite,
        FaultClass::KvWriteDecode,
        FaultClass::Mask,
    ];

    /// Faults planted outside the graph's single-sequence arithmetic, each in the subsystem
    /// that [`FaultClass::subsystem`] names: `loupe bisect` localizes them to its rungs.
    pub const SUBSYSTEM: [FaultClass; 4] =
        [FaultClass::BlockTable, FaultClass::BatchReduction, FaultClass::SpecMask, FaultClass::StreamDropLast];

    /// Classes that exist to test the debugging options, not the parity tools; accepted by
    /// `--inject` but not listed in its help nor in [`FaultClass::ALL`].
    pub const TEST_ONLY: [FaultClass; 2] = [FaultClass::Nan, FaultClass::Uninit];

    /// The name used on the command line and in IR text.
    pub fn name(self) -> &'static str {
        match self {
            FaultClass::RopeInterleaved => "rope-interleaved",
            FaultClass::TransposedWeight => "transposed-weight",
            FaultClass::NormEps => "norm-eps",
            FaultClass::NormEpsSubtle => "norm-eps-subtle",
            FaultClass::OProjScale => "o-proj-scale",
            FaultClass::GeluTanh => "gelu-tanh",
            FaultClass::SoftmaxScale => "softmax-scale",
            FaultClass::GqaMapping => "gqa-mapping",
            FaultClass::MissingResidual => "missing-residual",
            FaultClass::Bf16 => "bf16",
            FaultClass::KvWrite => "kv-write",
            FaultClass::KvWriteDecode => "kv-write-decode",
            FaultClass::Mask => "mask",
            FaultClass::BlockTable => "block-table",
            FaultClass::BatchReduction => "batch-reduction",
            FaultClass::SpecMask => "spec-mask",
            FaultClass::StreamDropLast => "stream-drop-last",
            FaultClass::Nan => "nan",
            FaultClass::Uninit => "uninit",
        }
    }

    /// Parses [`FaultClass::name`]; `activation` is accepted for `gelu-tanh`.
    pub fn from_name(s: &str) -> Option<FaultClass> {
        if s == "activation" {
            return Some(FaultClass::GeluTanh);
        }
        FaultClass::ALL.into_iter().chain(FaultClass::SUBSYSTEM).chain(FaultClass::TEST_ONLY).find(|c| c.name() == s)
    }

    /// One line on what the faulty node does.
    pub fn description(self) -> &'static str {
        match self {
            FaultClass::RopeInterleaved => "q/k RoPE pairs adjacent elements (2i, 2i+1) instead of (i, i+hd/2)",
            FaultClass::TransposedWeight => "o_proj uses its weight transposed",
            FaultClass::NormEps => "input_layernorm eps = 1e-1 instead of the config's",
            FaultClass::NormEpsSubtle => "input_layernorm eps = 100x the config's (scale only)",
            FaultClass::OProjScale => "o_proj's output x 33/32 (a stray multiplier; scale only)",
            FaultClass::GeluTanh => "mlp.act_fn is GELU (tanh) instead of SiLU",
            FaultClass::SoftmaxScale => "attention scale 1/head_dim instead of 1/sqrt(head_dim)",
            FaultClass::GqaMapping => "query head h reads kv head h % n_kv instead of h / group",
            FaultClass::MissingResidual => "attn_residual is o_proj's output without the residual add",
            FaultClass::Bf16 => "o_proj's output rounded to bf16",
            FaultClass::KvWrite => "keys written to the cache one position late",
            FaultClass::KvWriteDecode => "keys written one position late at decode steps only",
            FaultClass::Mask => "no causal mask within a forward call",
            FaultClass::BlockTable => "batched engine: attention reads the block table one entry late",
            FaultClass::BatchReduction => {
                "batched engine: input_layernorm's mean square over the step's rows, not each row"
            }
            FaultClass::SpecMask => "batched engine: a verify step's draft rows see the later drafts (no causal mask)",
            FaultClass::StreamDropLast => "server: a stream drops its last text delta",
            FaultClass::Nan => "o_proj's output holds one NaN and one +Inf (tests nan-check)",
            FaultClass::Uninit => "o_proj's output is half unwritten (tests uninitialized-read-check)",
        }
    }
}

/// Where a fault is planted: what runs it, so which commands can show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subsystem {
    /// The graph's arithmetic: every run of the graph (dump, generate, parity, ...).
    Graph,
    /// The batched engine's steps only ([`crate::Executor::run_batch`]).
    BatchedEngine,
    /// The HTTP server's responses only.
    Server,
}

impl FaultClass {
    /// Which subsystem plants this class.
    pub fn subsystem(self) -> Subsystem {
        match self {
            FaultClass::BlockTable | FaultClass::BatchReduction | FaultClass::SpecMask => Subsystem::BatchedEngine,
            FaultClass::StreamDropLast => Subsystem::Server,
            _ => Subsystem::Graph,
        }
    }

    /// Classes with no layer: written without `@LAYER`.
    pub fn layerless(self) -> bool {
        self.subsystem() == Subsystem::Server
    }
}

impl fmt::Display for FaultClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A fault class planted at one decoder layer: `CLASS@LAYER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fault {
    pub class: FaultClass,
    pub layer: usize,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.class.layerless() {
            return f.write_str(self.class.name());
        }
        write!(f, "{}@{}", self.class.name(), self.layer)
    }
}

/// A `CLASS@LAYER` string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fault '{spec}': {reason}")]
pub struct FaultParseError {
    pub spec: String,
    pub reason: String,
}

impl FromStr for Fault {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Fault, FaultParseError> {
        let err = |reason: String| FaultParseError { spec: s.to_string(), reason };
        let (class, layer) = s.split_once('@').unwrap_or((s, ""));
        let class = FaultClass::from_name(class.trim()).ok_or_else(|| {
            let names: Vec<&str> = FaultClass::ALL.iter().chain(&FaultClass::SUBSYSTEM).map(|c| c.name()).collect();
            err(format!("unknown class '{class}' (known: {})", names.join(", ")))
        })?;
        if class.layerless() {
            return match s.contains('@') {
                true => Err(err(format!("{class} has no layer: write it without @LAYER"))),
                false => Ok(Fault { class, layer: 0 }),
            };
        }
        if !s.contains('@') {
            return Err(err("expected CLASS@LAYER, e.g. rope-interleaved@1".into()));
        }
        let layer =
            layer.trim().parse::<usize>().map_err(|_| err(format!("layer '{layer}' is not a non-negative integer")))?;
        Ok(Fault { class, layer })
    }
}

/// What an [`crate::Op::Plant`] node does to its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    /// Element 0 becomes NaN and element 1 +Inf.
    NanInf,
    /// Only the first half of the elements is written.
    HalfUnwritten,
}

impl Plant {
    /// Runs the plant: `out` from its input `x` (the same length) with the defect.
    pub(crate) fn apply(self, x: &[f32], out: &mut [f32]) {
        match self {
            Plant::NanInf => {
                out.copy_from_slice(x);
                if let Some(v) = out.get_mut(0) {
                    *v = f32::NAN;
                }
                if let Some(v) = out.get_mut(1) {
                    *v = f32::INFINITY;
                }
            }
            Plant::HalfUnwritten => {
                let half = out.len() / 2;
                out[..half].copy_from_slice(&x[..half]);
            }
        }
    }
}

/// The classes planted at `layer`, in the order given.
pub fn at_layer(faults: &[Fault], layer: usize) -> impl Iterator<Item = FaultClass> + '_ {
    faults.iter().filter(move |f| f.layer == layer).map(|f| f.class)
}

/// Fault `batch-reduction`: RMSNorm whose mean square is taken over the step's rows (the
/// token axis, per feature) instead of over each row's features: `mean(x², axis=0)` where
/// `axis=-1` was meant.
pub(crate) fn rms_norm_over_step(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    let rows = x.len() / dim.max(1);
    let mut mean_sq = vec![0f64; dim];
    for row in x.chunks_exact(dim) {
        for (m, &v) in mean_sq.iter_mut().zip(row) {
            *m += f64::from(v) * f64::from(v) / rows as f64;
        }
    }
    for (out_row, row) in out.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
        for (((o, &v), &w), &m) in out_row.iter_mut().zip(row).zip(weight).zip(&mean_sq) {
            *o = w * (v / (m as f32 + eps).sqrt());
        }
    }
}

/// Fault `block-table`: the block tables attention reads, indexed one entry late: logical
/// block `j > 0` reads the block of `j - 1`.
pub(crate) fn stale_block_tables(tables: &[&[u32]]) -> Vec<Vec<u32>> {
    tables
        .iter()
        .map(|t| {
            let mut late = t.to_vec();
            if t.len() >= 2 {
                late[1..].copy_from_slice(&t[..t.len() - 1]);
            }
            late
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_every_class() {
        for c in FaultClass::ALL {
            let f: Fault = format!("{}@3", c.name()).parse().unwrap();
            assert_eq!(f, Fault { class: c, layer: 3 });
            assert_eq!(f.to_string(), format!("{}@3", c.name()));
        }
        assert_eq!("activation@0".parse::<Fault>().unwrap().class, FaultClass::GeluTanh);
        for c in FaultClass::SUBSYSTEM {
            let spec = if c.layerless() { c.name().to_string() } else { format!("{}@2", c.name()) };
            let f: Fault = spec.parse().unwrap();
            assert_eq!((f.class, f.to_string()), (c, spec));
            assert_ne!(c.subsystem(), Subsystem::Graph);
        }
        assert!(FaultClass::ALL.iter().all(|c| c.subsystem() == Subsystem::Graph));
    }

    #[test]
    fn the_batched_engine_faults_do_what_they_say() {
        // Rows [3, 4] and [0, 2]: feature 0's mean square is 9/2, feature 1's (16 + 4)/2.
        let (x, w) = ([3.0f32, 4.0, 0.0, 2.0], [1.0f32, 2.0]);
        let mut out = [0.0; 4];
        rms_norm_over_step(&x, &w, 0.0, &mut out);
        let (s0, s1) = (4.5f32.sqrt(), 10.0f32.sqrt());
        assert_eq!(out, [3.0 / s0, 2.0 * (4.0 / s1), 0.0, 2.0 * (2.0 / s1)]);
        let tables = stale_block_tables(&[&[7, 9, 4], &[5]]);
        assert_eq!(tables, vec![vec![7, 7, 9], vec![5]]);
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in ["rope-interleaved", "nope@1", "mask@-1", "mask@x", "@1", "block-table", "stream-drop-last@1"] {
            let e = bad.parse::<Fault>().unwrap_err();
            assert_eq!(e.spec, bad);
        }
        assert!("nope@1".parse::<Fault>().unwrap_err().to_string().contains("known: rope-interleaved"));
    }
}
