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
            FaultClass::Nan => "nan",
            FaultClass::Uninit => "uninit",
        }
    }

    /// Parses [`FaultClass::name`]; `activation` is accepted for `gelu-tanh`.
    pub fn from_name(s: &str) -> Option<FaultClass> {
        if s == "activation" {
            return Some(FaultClass::GeluTanh);
        }
        FaultClass::ALL.into_iter().chain(FaultClass::TEST_ONLY).find(|c| c.name() == s)
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
            FaultClass::Nan => "o_proj's output holds one NaN and one +Inf (tests nan-check)",
            FaultClass::Uninit => "o_proj's output is half unwritten (tests uninitialized-read-check)",
        }
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
        let (class, layer) = s.split_once('@').ok_or_else(|| err("expected CLASS@LAYER, e.g. rope-interleaved@1".into()))?;
        let class = FaultClass::from_name(class.trim()).ok_or_else(|| {
            let names: Vec<&str> = FaultClass::ALL.iter().map(|c| c.name()).collect();
            err(format!("unknown class '{class}' (known: {})", names.join(", ")))
        })?;
        let layer = layer.trim().parse::<usize>().map_err(|_| err(format!("layer '{layer}' is not a non-negative integer")))?;
        Ok(Fault { class, layer })
    }
}

/// The classes planted at `layer`, in the order given.
pub fn at_layer(faults: &[Fault], layer: usize) -> impl Iterator<Item = FaultClass> + '_ {
    faults.iter().filter(move |f| f.layer == layer).map(|f| f.class)
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
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in ["rope-interleaved", "nope@1", "mask@-1", "mask@x", "@1"] {
            let e = bad.parse::<Fault>().unwrap_err();
            assert_eq!(e.spec, bad);
        }
        assert!("nope@1".parse::<Fault>().unwrap_err().to_string().contains("known: rope-interleaved"));
    }
}
