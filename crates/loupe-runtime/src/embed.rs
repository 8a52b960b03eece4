//! Sentence embeddings from an encoder model, as sentence-transformers computes them: the
//! text tokenized with the model's specials and cut at `max_seq_length`, the encoder's last
//! hidden states, pooled (mean over tokens by default), then L2-normalized when the model's
//! pipeline ends in a `Normalize` module.
//!
//! The pipeline comes from the checkpoint directory's sentence-transformers files:
//! `modules.json` (which modules: `Pooling`, `Normalize`), the pooling module's
//! `config.json` (`pooling_mode_*`) and `sentence_bert_config.json` (`max_seq_length`). A
//! directory without them is a plain `BertModel`: mean pooling, no normalization, the
//! model's whole window.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{Engine, RuntimeError};

/// How token states become one vector (`sentence_transformers.models.Pooling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every token's state (`pooling_mode_mean_tokens`).
    Mean,
    /// The first token's state (`pooling_mode_cls_token`).
    Cls,
    /// The element-wise maximum over tokens (`pooling_mode_max_tokens`).
    Max,
}

impl Pooling {
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Max => "max",
        }
    }

    /// The pooling of a `--pooling` value.
    pub fn from_name(name: &str) -> Option<Pooling> {
        match name {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "max" => Some(Pooling::Max),
            _ => None,
        }
    }
}

/// The steps after the encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedConfig {
    pub pooling: Pooling,
    /// Divide the pooled vector by its L2 norm.
    pub normalize: bool,
    /// Inputs longer than this (specials included) are cut.
    pub max_tokens: usize,
}

/// A sentence-transformers file that could not be read or says something loupe does not do.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct EmbedConfigError {
    pub path: PathBuf,
    pub reason: String,
}

impl EmbedConfig {
    /// The pipeline the checkpoint directory `dir` describes, for a model whose window is
    /// `context_length` positions.
    pub fn from_dir(dir: &Path, context_length: usize) -> Result<EmbedConfig, EmbedConfigError> {
        let mut config = EmbedConfig { pooling: Pooling::Mean, normalize: false, max_tokens: context_length };
        let read = |path: PathBuf| -> Result<Option<Value>, EmbedConfigError> {
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    serde_json::from_str(&text).map(Some).map_err(|e| EmbedConfigError { path, reason: e.to_string() })
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(EmbedConfigError { path, reason: e.to_string() }),
            }
        };
        let Some(modules) = read(dir.join("modules.json"))? else { return Ok(config) };
        let modules_path = dir.join("modules.json");
        let bad = |reason: String| EmbedConfigError { path: modules_path.clone(), reason };
        let list = modules.as_array().ok_or_else(|| bad("not a list of modules".into()))?;
        for m in list {
            let ty = m.get("type").and_then(Value::as_str).ok_or_else(|| bad(format!("module without a type: {m}")))?;
            let sub = m.get("path").and_then(Value::as_str).unwrap_or("");
            match ty.rsplit('.').next().unwrap_or(ty) {
                "Transformer" => {
                    if let Some(st) = read(dir.join(sub).join("sentence_bert_config.json"))? {
                        if let Some(n) = st.get("max_seq_length").and_then(Value::as_u64) {
                            config.max_tokens = (n as usize).clamp(1, context_length);
                        }
                    }
                }
                "Pooling" => {
                    let path = dir.join(sub).join("config.json");
                    let p = read(path.clone())?.ok_or_else(|| EmbedConfigError { path: path.clone(), reason: "missing (modules.json names a Pooling module)".into() })?;
                    config.pooling = pooling_of(&p).map_err(|reason| EmbedConfigError { path, reason })?;
                }
                "Normalize" => config.normalize = true,
                other => return Err(bad(format!("module type '{ty}' is not supported (loupe runs Transformer, Pooling and Normalize; found {other})"))),
            }
        }
        Ok(config)
    }
}

/// The one pooling mode a `Pooling` config turns on.
fn pooling_of(p: &Value) -> Result<Pooling, String> {
    let on = |k: &str| p.get(k).and_then(Value::as_bool).unwrap_or(false);
    let modes = [
        ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
        ("pooling_mode_cls_token", Some(Pooling::Cls)),
        ("pooling_mode_max_tokens", Some(Pooling::Max)),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
        ("pooling_mode_lasttoken", None),
    ];
    let chosen: Vec<_> = modes.iter().filter(|(k, _)| on(k)).collect();
    match chosen.as_slice() {
        [(_, Some(p))] => Ok(*p),
        [(k, None)] => Err(format!("{k} is not supported (loupe pools by mean, cls or max)")),
        [] => Err("no pooling_mode_* is true".into()),
        _ => Err(format!(
            "several pooling modes are on ({}); loupe pools one way",
            chosen.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// One input's embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    pub vector: Vec<f32>,
    /// Tokens the encoder ran (specials included, after any cut).
    pub tokens: usize,
    /// Whether the input was cut at [`EmbedConfig::max_tokens`].
    pub truncated: bool,
}

/// Pools `states` (`[tokens, hidden]`, row-major) as `pooling` says. Sums run in f64 (a
/// mean over up to 512 rows), then round once.
pub fn pool(states: &[f32], hidden: usize, pooling: Pooling) -> Vec<f32> {
    let rows = states.len().checked_div(hidden).unwrap_or(0);
    if rows == 0 {
        return vec![0.0; hidden];
    }
    match pooling {
        Pooling::Cls => states[..hidden].to_vec(),
        Pooling::Max => {
            let mut out = states[..hidden].to_vec();
            for row in states.chunks_exact(hidden).skip(1) {
                out.iter_mut().zip(row).for_each(|(o, &v)| *o = o.max(v));
            }
            out
        }
        Pooling::Mean => {
            let mut sum = vec![0f64; hidden];
            for row in states.chunks_exact(hidden) {
                sum.iter_mut().zip(row).for_each(|(s, &v)| *s += v as f64);
            }
            sum.into_iter().map(|s| (s / rows as f64) as f32).collect()
        }
    }
}

/// `v / max(||v||, 1e-12)`, as `torch.nn.functional.normalize` (sentence-transformers'
/// `Normalize`) divides by the norm clamped at its default eps.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
}

impl Engine {
    /// Whether the model is an encoder (it embeds; it does not generate).
    pub fn is_encoder(&self) -> bool {
        self.graph().encoder
    }

    /// The sentence-embedding pipeline of this model's checkpoint directory.
    pub fn embed_config(&self) -> Result<EmbedConfig, RuntimeError> {
        if !self.is_encoder() {
            return Err(RuntimeError::InvalidRequest(format!(
                "{} is a {} decoder; embeddings need an encoder model (BERT)",
                self.path().display(),
                self.config().family().name()
            )));
        }
        let dir = if self.path().is_dir() {
            self.path().to_path_buf()
        } else {
            self.path().parent().map(Path::to_path_buf).unwrap_or_default()
        };
        EmbedConfig::from_dir(&dir, self.context_length()).map_err(|e| RuntimeError::InvalidRequest(e.to_string()))
    }

    /// The embedding of `text` under `config`: one encoder run (its own session), pooled,
    /// normalized if asked.
    pub fn embed(&self, text: &str, config: &EmbedConfig) -> Result<Embedding, RuntimeError> {
        self.embed_all(&[text], config).map(|mut v| v.remove(0))
    }

    /// [`Engine::embed`] for every text, in order, through one session (its executor's
    /// buffers and cache are reused; each input still runs alone from an empty cache, so
    /// every vector is the one `embed` gives).
    pub fn embed_all<S: AsRef<str>>(&self, texts: &[S], config: &EmbedConfig) -> Result<Vec<Embedding>, RuntimeError> {
        if !self.is_encoder() {
            return Err(RuntimeError::InvalidRequest(format!("{} is not an encoder model", self.path().display())));
        }
        let mut session = self.session(config.max_tokens);
        texts.iter().map(|text| self.embed_in(&mut session, text.as_ref(), config)).collect()
    }

    fn embed_in(
        &self,
        session: &mut crate::Session<'_>,
        text: &str,
        config: &EmbedConfig,
    ) -> Result<Embedding, RuntimeError> {
        let (ids, full) = self.tokenizer().encode_truncated(text, config.max_tokens)?;
        if ids.is_empty() {
            return Err(RuntimeError::InvalidRequest("the input encodes to no tokens".into()));
        }
        session.reset();
        let states = session.forward(&ids, true, None)?;
        let hidden = self.config().hidden_size();
        let mut vector = pool(states, hidden, config.pooling);
        if config.normalize {
            l2_normalize(&mut vector);
        }
        Ok(Embedding { vector, tokens: ids.len(), truncated: full > ids.len() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_each_way() {
        let states = [1.0f32, -2.0, 3.0, 4.0, 5.0, -6.0];
        assert_eq!(pool(&states, 2, Pooling::Mean), vec![3.0, -4.0 / 3.0]);
        assert_eq!(pool(&states, 2, Pooling::Cls), vec![1.0, -2.0]);
        assert_eq!(pool(&states, 2, Pooling::Max), vec![5.0, 4.0]);
    }

    #[test]
    fn normalizes_to_unit_length_and_leaves_zero_alone() {
        let mut v = [3.0f32, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = [0.0f32; 3];
        l2_normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
    }

    #[test]
    fn reads_the_sentence_transformers_pipeline() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // A plain BertModel directory: mean pooling over the whole window.
        assert_eq!(
            EmbedConfig::from_dir(d, 512).unwrap(),
            EmbedConfig { pooling: Pooling::Mean, normalize: false, max_tokens: 512 }
        );
        std::fs::write(d.join("modules.json"), r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},{"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},{"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#).unwrap();
        std::fs::write(d.join("sentence_bert_config.json"), r#"{"max_seq_length": 256}"#).unwrap();
        std::fs::create_dir(d.join("1_Pooling")).unwrap();
        std::fs::write(
            d.join("1_Pooling/config.json"),
            r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#,
        )
        .unwrap();
        assert_eq!(
            EmbedConfig::from_dir(d, 512).unwrap(),
            EmbedConfig { pooling: Pooling::Cls, normalize: true, max_tokens: 256 }
        );
        // The window caps max_seq_length.
        assert_eq!(EmbedConfig::from_dir(d, 128).unwrap().max_tokens, 128);
        // Unsupported or contradictory pooling is an error naming the file.
        std::fs::write(d.join("1_Pooling/config.json"), r#"{"pooling_mode_mean_sqrt_len_tokens": true}"#).unwrap();
        let e = EmbedConfig::from_dir(d, 512).unwrap_err();
        assert!(e.to_string().contains("1_Pooling/config.json") && e.to_string().contains("mean_sqrt_len"), "{e}");
        std::fs::write(
            d.join("1_Pooling/config.json"),
            r#"{"pooling_mode_cls_token": true, "pooling_mode_max_tokens": true}"#,
        )
        .unwrap();
        assert!(EmbedConfig::from_dir(d, 512).unwrap_err().to_string().contains("several pooling modes"));
        std::fs::write(d.join("modules.json"), r#"[{"type":"sentence_transformers.models.Dense","path":"2_Dense"}]"#)
            .unwrap();
        assert!(EmbedConfig::from_dir(d, 512).unwrap_err().to_string().contains("Dense"));
        std::fs::write(d.join("modules.json"), "{not json").unwrap();
        assert!(EmbedConfig::from_dir(d, 512).unwrap_err().to_string().contains("modules.json"));
    }
}
