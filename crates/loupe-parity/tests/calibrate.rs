//! Calibrated comparisons (`--calibrate HIGH LOW`) on synthetic dumps whose "reference at
//! low precision" carries noise that grows with depth, as a real model's does: a target
//! with noise of its floor's size passes with no hand-set threshold, a 3% scale that every
//! default threshold lets through is flagged at its tensor, and each tensor is held to its
//! own floor.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use loupe_parity::calibrate::{Calibration, DEFAULT_FACTOR};
use loupe_parity::report::{render, to_json, RenderOptions};
use loupe_parity::result::{Reason, Status};
use loupe_parity::{compare, CompareOptions, NoProgress};

/// Relative noise of the low-precision run at layer `l` (embedding: layer 0).
fn noise_at(name: &str) -> f32 {
    let layer =
        name.strip_prefix("model.layers.").and_then(|s| s.split('.').next()).and_then(|s| s.parse::<f32>().ok());
    match (name, layer) {
        (_, Some(l)) => 1e-4 * (1.0 + 3.0 * l),
        ("model.embed_tokens", None) => 1e-5,
        _ => 1.3e-3,
    }
}

/// `base` with independent noise of each tensor's size (`seed` picks the draw).
fn noisy(base: &[Named], seed: u64) -> Vec<Named> {
    let mut out = base.to_vec();
    for (i, t) in out.iter_mut().enumerate() {
        let rows = t.shape[0];
        perturb_rows(t, 0..rows, noise_at(&t.name), seed * 1000 + i as u64);
    }
    out
}

struct Dumps {
    _dir: tempfile::TempDir,
    high: std::path::PathBuf,
    low: std::path::PathBuf,
    dir: std::path::PathBuf,
}

fn dumps(high: &[Named], low: &[Named]) -> Dumps {
    let dir = tempfile::tempdir().expect("temp dir");
    let h = write(&dir.path().join("high"), "transformers", high, Some(vec![1, 2, 3]));
    let l = write(&dir.path().join("low"), "transformers", low, Some(vec![1, 2, 3]));
    Dumps { high: h, low: l, dir: dir.path().to_path_buf(), _dir: dir }
}

fn calibrated(d: &Dumps, target: &[Named]) -> loupe_parity::Report {
    static TARGETS: AtomicUsize = AtomicUsize::new(0);
    let n = TARGETS.fetch_add(1, Ordering::Relaxed);
    let t = write(&d.dir.join(format!("target-{n}")), "loupe", target, Some(vec![1, 2, 3]));
    let cal = Calibration::from_paths(&d.high, &d.low, DEFAULT_FACTOR, &mut NoProgress).expect("calibration");
    let opts = CompareOptions { calibration: Some(cal), ..CompareOptions::default() };
    compare(&d.high, &t, &opts, &mut NoProgress).expect("compare")
}

#[test]
fn a_clean_target_passes_and_a_three_percent_scale_is_flagged_where_it_is() {
    let high = model(1, 0);
    let d = dumps(&high, &noisy(&high, 1));
    let clean = noisy(&high, 2);
    let r = calibrated(&d, &clean);
    assert_eq!(r.verdict.verdict, "match", "{}", render(&r, RenderOptions::default()));
    assert!(r.pairs.iter().all(|p| p.floor.is_some()), "every tensor has a floor");
    let worst = r.pairs.iter().map(|p| p.floor.as_ref().unwrap().error_over_floor).fold(0.0, f64::max);
    assert!(worst < 3.0, "noise of the floor's size sits near 1x its floor, worst {worst}");

    let mut scaled = clean.clone();
    for v in &mut get(&mut scaled, "model.layers.2.self_attn.o_proj").data {
        *v *= 1.03;
    }
    // Every default threshold lets it through...
    assert_eq!(run(&high, &scaled).verdict.verdict, "match");
    // ... its floor does not.
    let r = calibrated(&d, &scaled);
    assert_eq!(
        r.verdict.first_divergence.as_deref(),
        Some("model.layers.2.self_attn.o_proj"),
        "{}",
        render(&r, RenderOptions::default())
    );
    assert_eq!(signature(&r), "scale");
    let p = r.pairs.iter().find(|p| p.name == "model.layers.2.self_attn.o_proj").unwrap();
    assert!(
        p.reasons.contains(&Reason::Nmse)
            && p.reasons.contains(&Reason::NormRatio)
            && !p.reasons.contains(&Reason::Cosine),
        "{:?}",
        p.reasons
    );
    assert!(p.floor.as_ref().unwrap().error_over_floor > 20.0);
    assert_eq!(
        r.pairs.iter().filter(|p| p.status == Status::Diverged).count(),
        1,
        "only the scaled tensor (the synthetic model does not propagate)"
    );

    // The report shows each floor beside the metric, and the rule.
    let text = render(&r, RenderOptions::default());
    assert!(text.contains("nmse [error / floor]") && text.contains("calibrated: a tensor diverges when"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&to_json(&r)).unwrap();
    assert_eq!(json["calibration"]["factor"], DEFAULT_FACTOR);
    assert_eq!(json["calibration"]["floors"], high.len());
    let pj = json["pairs"].as_array().unwrap().iter().find(|p| p["name"] == "model.layers.2.self_attn.o_proj").unwrap();
    assert!(
        pj["floor"]["nmse"].as_f64().unwrap() > 0.0 && pj["floor"]["error_over_floor"].as_f64().unwrap() > 20.0,
        "{pj}"
    );
}

#[test]
fn each_tensor_is_held_to_its_own_floor() {
    // Noise of layer 3's size: fine at layer 3 (its own floor), far outside the embedding's.
    let high = model(1, 0);
    let d = dumps(&high, &noisy(&high, 1));
    let mut target = noisy(&high, 2);
    let layer3 = noise_at("model.layers.3.mlp.down_proj");
    for name in ["model.embed_tokens", "model.layers.3.mlp.down_proj"] {
        let t = get(&mut target, name);
        *t = high.iter().find(|x| x.name == name).unwrap().clone();
        let rows = t.shape[0];
        perturb_rows(t, 0..rows, layer3, 77);
    }
    let r = calibrated(&d, &target);
    let status = |n: &str| r.pairs.iter().find(|p| p.name == n).unwrap().status;
    assert_eq!(status("model.layers.3.mlp.down_proj"), Status::Match);
    assert_eq!(status("model.embed_tokens"), Status::Diverged);
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.embed_tokens"));
}

#[test]
fn tensors_without_a_floor_keep_the_thresholds_and_the_report_says_so() {
    let high = model(1, 0);
    let low: Vec<Named> = noisy(&high, 1).into_iter().filter(|t| t.name != "lm_head").collect();
    let d = dumps(&high, &low);
    let r = calibrated(&d, &noisy(&high, 2));
    let lm = r.pairs.iter().find(|p| p.name == "lm_head").unwrap();
    assert!(lm.floor.is_none() && lm.status == Status::Match);
    let text = render(&r, RenderOptions::default());
    assert!(text.contains("[no floor]") && text.contains("1 compared tensors have no floor"), "{text}");
}

#[test]
fn calibration_runs_must_share_their_input_and_their_names() {
    let high = model(1, 0);
    let dir = tempfile::tempdir().unwrap();
    let h = write(&dir.path().join("h"), "transformers", &high, Some(vec![1, 2, 3]));
    let other = write(&dir.path().join("o"), "transformers", &noisy(&high, 1), Some(vec![1, 2, 4]));
    let err = Calibration::from_paths(&h, &other, DEFAULT_FACTOR, &mut NoProgress).unwrap_err().to_string();
    assert!(err.contains("prompt tokens differ") && err.contains("same input"), "{err}");
    let renamed: Vec<Named> = high.iter().map(|t| Named { name: format!("x.{}", t.name), ..t.clone() }).collect();
    let unrelated = write(&dir.path().join("u"), "transformers", &renamed, Some(vec![1, 2, 3]));
    let err = Calibration::from_paths(&h, &unrelated, DEFAULT_FACTOR, &mut NoProgress).unwrap_err().to_string();
    assert!(err.contains("no tensor pairs"), "{err}");
    let err = Calibration::from_paths(&h, &h, 0.5, &mut NoProgress).unwrap_err().to_string();
    assert!(err.contains("must be a number >= 1"), "{err}");
}

#[test]
fn the_html_page_embeds_the_report_and_no_name_can_close_its_script() {
    let mut high = model(1, 0);
    high[3].name = "evil</script><script>alert(1)</script><!--".into();
    let d = dumps(&high, &noisy(&high, 1));
    let r = calibrated(&d, &noisy(&high, 2));
    let page = loupe_parity::html::to_html(&r);
    let template_scripts = include_str!("../src/report.html").matches("</script>").count();
    assert_eq!(page.matches("</script>").count(), template_scripts, "the data cannot end a <script> element");
    assert!(!page.contains("<!--"), "nor open a comment");
    // The embedded JSON is the report (with '<' escaped), so the page shows what compare found.
    let start = page.find("id=\"report-data\">").unwrap() + "id=\"report-data\">".len();
    let end = start + page[start..].find("</script>").unwrap();
    let v: serde_json::Value = serde_json::from_str(&page[start..end]).unwrap();
    assert_eq!(v["verdict"], "match");
    assert_eq!(v["pairs"].as_array().unwrap().len(), high.len());
    assert!(v["pairs"][3]["name"].as_str().unwrap().starts_with("evil</script>"));
    assert!(v["pairs"][3]["token_cosines"].is_null(), "per-token cosines only when the comparison kept them");
}
