//! RoPE keys of a config.json: the rotated part of each head, and the scaling entry.

use loupe_tensor::ops::RopeScaling;
use serde_json::Value;

use crate::family::{Family, PartialRotary};

/// The rotated part of each head: `int(head_dim * partial_rotary_factor)` (transformers'
/// rope init, in f64 then truncated), the factor read from `rope_parameters` first, then the
/// top level (`convert_rope_params_to_dict`'s priority). Only families whose RoPE is
/// [`PartialRotary::Supported`] (Phi-3) rotate part of a head in loupe; others refuse a
/// factor below 1 by name.
pub(super) fn rotary_dim_of(
    v: &Value,
    params: Option<&Value>,
    head_dim: usize,
    family: Family,
) -> Result<usize, (String, String)> {
    let (key, factor) = match params.and_then(|p| p.get("partial_rotary_factor")).filter(|x| !x.is_null()) {
        Some(x) => ("rope_parameters.partial_rotary_factor", Some(x)),
        None => ("partial_rotary_factor", v.get("partial_rotary_factor").filter(|x| !x.is_null())),
    };
    let Some(x) = factor else { return Ok(head_dim) };
    let f = x
        .as_f64()
        .filter(|f| *f > 0.0 && *f <= 1.0)
        .ok_or_else(|| (key.to_string(), format!("{x} is not a number in (0, 1]")))?;
    let partial = match family.spec().rope.partial {
        PartialRotary::Supported => true,
        PartialRotary::Refused | PartialRotary::WholeOnly { .. } => false,
    };
    if f < 1.0 && !partial {
        return Err((
            key.into(),
            format!("partial rotary embedding is not supported for the {} family", family.name()),
        ));
    }
    let dim = (head_dim as f64 * f) as usize;
    if dim == 0 || !dim.is_multiple_of(2) {
        return Err((
            key.into(),
            format!("head_dim {head_dim} x {f} gives {dim} rotary dims (must be even and non-zero)"),
        ));
    }
    Ok(dim)
}

/// LongRoPE scaling ([`crate::family::RopeScalingRule::LongRope`]) as `Phi3Config` and
/// transformers' rope init read it: `default`, or
/// `longrope` (`su` and `yarn` are old names of it, `Phi3Config.convert_rope_params_to_dict`)
/// with `short_factor` and `long_factor` of rotary_dim / 2 numbers each
/// (`Phi3Config.validate_rope`); anything else is refused as transformers refuses it.
/// The switch length is the top-level `original_max_position_embeddings` (`default_original`,
/// Phi3Config's 4096, when absent,
/// even if the scaling entry has its own: `standardize_rope_params` prefers the config
/// attribute); the attention factor is the entry's `attention_factor`, else, with `factor`
/// (the entry's, else max_position_embeddings / original), 1 when factor <= 1 and
/// sqrt(1 + ln(factor) / ln(original)) above (`_compute_longrope_parameters`).
pub(super) fn longrope_scaling(
    v: &Value,
    p: &Value,
    rotary_dim: usize,
    max_positions: usize,
    default_original: usize,
) -> Result<RopeScaling, (String, String)> {
    let err = |k: &str, reason: String| (format!("rope_scaling.{k}"), reason);
    let rope_type = p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str).unwrap_or("default");
    match rope_type {
        "default" => return Ok(RopeScaling::None),
        "longrope" | "su" | "yarn" => {}
        other => {
            return Err(err(
                "rope_type",
                format!("'{other}' is not a Phi-3 RoPE type (default or longrope, as Phi3Config.validate_rope)"),
            ))
        }
    }
    let factors = |k: &str| -> Result<Vec<f32>, (String, String)> {
        let list = p.get(k).and_then(Value::as_array).ok_or_else(|| err(k, "missing or not a list".into()))?;
        let f: Vec<f32> = list
            .iter()
            .map(|x| x.as_f64().filter(|f| f.is_finite() && *f > 0.0).map(|f| f as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| err(k, "not a list of positive numbers".into()))?;
        if f.len() != rotary_dim / 2 {
            return Err(err(k, format!("{} entries, expected rotary_dim / 2 = {}", f.len(), rotary_dim / 2)));
        }
        Ok(f)
    };
    let (short_factor, long_factor) = (factors("short_factor")?, factors("long_factor")?);
    let original =
        match v.get("original_max_position_embeddings").filter(|x| !x.is_null()) {
            None => default_original,
            Some(x) => x.as_u64().filter(|n| *n >= 2).ok_or_else(|| {
                ("original_max_position_embeddings".to_string(), format!("{x} is not an integer >= 2"))
            })? as usize,
        };
    let number = |k: &str| -> Result<Option<f64>, (String, String)> {
        match p.get(k).filter(|x| !x.is_null()) {
            None => Ok(None),
            Some(x) => x
                .as_f64()
                .filter(|f| f.is_finite() && *f > 0.0)
                .map(Some)
                .ok_or_else(|| err(k, format!("{x} is not a positive number"))),
        }
    };
    let factor = number("factor")?.unwrap_or(max_positions as f64 / original as f64);
    let attention_factor = match number("attention_factor")? {
        Some(a) => a,
        None if factor <= 1.0 => 1.0,
        None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
    };
    Ok(RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings: original,
        attention_factor: attention_factor as f32,
    })
}

/// The RoPE scaling one `rope_parameters` (or legacy `rope_scaling`) entry describes; errors
/// name the offending key.
pub(super) fn rope_scaling_of(p: &Value) -> Result<RopeScaling, (String, String)> {
    let get = |k: &str| {
        p.get(k)
            .and_then(Value::as_f64)
            .map(|x| x as f32)
            .ok_or_else(|| (format!("rope_scaling.{k}"), "missing or not a number".to_string()))
    };
    Ok(match p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str).unwrap_or("default") {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: get("factor")? },
        "llama3" => RopeScaling::Llama3 {
            factor: get("factor")?,
            low_freq_factor: get("low_freq_factor")?,
            high_freq_factor: get("high_freq_factor")?,
            original_max_position_embeddings: get("original_max_position_embeddings")?,
        },
        other => return Err(("rope_scaling.rope_type".into(), format!("unsupported rope type '{other}'"))),
    })
}

/// Hunyuan's RoPE entry ([`crate::family::RopeScalingRule::NtkAlpha`]) as
/// `HunYuanMoEV1RotaryEmbedding` reads it: `dynamic` with an `alpha` is NTK-alpha, the default
/// rotation with a base of `rope_theta * alpha^(head_dim / (head_dim - 2))`, formed in f64 as
/// Python does (`compute_ntk_alpha_rope_parameters`); it does not depend on the sequence
/// length (transformers calls it `ntk_alpha` so `dynamic_rope_update` leaves it alone), and
/// the `factor` beside it is unused. Returns the scaling and the base. Any other entry is read
/// as [`rope_scaling_of`] reads it (`dynamic` without `alpha`, transformers' length-dependent
/// NTK, is refused there).
pub(super) fn ntk_alpha_rope(p: &Value, theta: f32, head_dim: usize) -> Result<(RopeScaling, f32), (String, String)> {
    let rope_type = p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str);
    // transformers tests `rope_parameters.get("alpha")` for truth: 0 and null are no alpha.
    let alpha = p.get("alpha").filter(|x| !x.is_null() && x.as_f64() != Some(0.0));
    let (Some("dynamic"), Some(x)) = (rope_type, alpha) else { return Ok((rope_scaling_of(p)?, theta)) };
    let key = "rope_parameters.alpha".to_string();
    let alpha = x
        .as_f64()
        .filter(|a| a.is_finite() && *a > 0.0)
        .ok_or_else(|| (key.clone(), format!("{x} is not a positive number")))?;
    if head_dim <= 2 {
        return Err((key, format!("head_dim {head_dim}: the exponent head_dim / (head_dim - 2) needs head_dim > 2")));
    }
    let theta = p.get("rope_theta").and_then(Value::as_f64).unwrap_or(theta as f64);
    let base = theta * alpha.powf(head_dim as f64 / (head_dim as f64 - 2.0));
    // torch raises the f64 base to an f32 tensor's powers in f32.
    let base32 = base as f32;
    if !(base32.is_finite() && base32 > 0.0) {
        return Err((key, format!("gives a RoPE base of {base}, not a positive f32")));
    }
    Ok((RopeScaling::None, base32))
}
