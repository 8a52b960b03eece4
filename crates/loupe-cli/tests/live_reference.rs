//! Runs the live PyTorch reference (installed by .ci/run) on a prompt that is not among
//! the goldens and checks that `--precision f32` generates the same greedy tokens.

mod common;
use common::*;
use std::process::Command;

#[derive(serde::Deserialize, Debug, PartialEq)]
struct JsonOut {
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
}

#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn f32_matches_live_reference_on_unseen_prompt() {
    let model = real_model();
    require_python_reference();
    let prompt = "Explain why the sky is blue in two sentences.";
    let reference = Command::new("python3")
        .args(["-m", "loupe_reference", "generate", "--gguf"])
        .arg(&model)
        .args(["--prompt", prompt, "--chat", "--max-tokens", "64", "--json"])
        .output()
        .expect("python3");
    assert!(reference.status.success(), "reference failed: {}", stderr(&reference));
    let reference: JsonOut =
        serde_json::from_str(stdout(&reference).lines().last().unwrap_or("")).expect("reference json");

    let ours = run(loupe().arg("generate").arg("--model").arg(&model).args([
        "--precision",
        "f32",
        "--temperature",
        "0",
        "--json",
        "--max-tokens",
        "64",
        "--chat",
        prompt,
    ]));
    assert!(ours.status.success(), "{}", stderr(&ours));
    let ours: JsonOut = serde_json::from_str(stdout(&ours).trim()).expect("loupe json");
    assert_eq!(ours.prompt_tokens, reference.prompt_tokens);
    assert_eq!(ours.tokens, reference.tokens, "loupe: {:?}\nreference: {:?}", ours.text, reference.text);
    assert_eq!(ours.text, reference.text);
}
