//! The served rung: the same prompt ids through a running `loupe serve`'s `/v1/completions`,
//! plain and streamed; both texts must equal the engine's. Starting the server is the
//! caller's ([`loupe_client::spawn`]), so this rung only speaks HTTP.

use loupe_client::HttpClient;

use super::rung::Rung;

/// Both texts must equal `want` (the incremental or batched rung's text).
pub fn served_rung(http: &HttpClient, prompt: &[u32], k: usize, want: &str) -> Rung {
    let mut rung = Rung::new("served", "serving layer (detokenizer, stream)");
    let result = (|| -> Result<(String, String), Box<dyn std::error::Error>> {
        let models: serde_json::Value = serde_json::from_str(&http.ok("GET", "/v1/models", None)?)?;
        let id = models["data"][0]["id"].as_str().unwrap_or("").to_string();
        let req = |stream: bool| serde_json::json!({"model": id, "prompt": prompt, "max_tokens": k, "temperature": 0, "ignore_eos": true, "stream": stream});
        let plain: serde_json::Value = serde_json::from_str(&http.ok("POST", "/v1/completions", Some(&req(false)))?)?;
        let text = plain["choices"][0]["text"].as_str().unwrap_or("").to_string();
        let events =
            loupe_client::Response { status: 200, body: http.ok("POST", "/v1/completions", Some(&req(true)))? };
        let mut streamed = String::new();
        for data in events.sse_data().filter(|d| *d != "[DONE]") {
            let v: serde_json::Value = serde_json::from_str(data)?;
            streamed.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
        }
        Ok((text, streamed))
    })();
    match result {
        Err(e) => rung.skipped(format!("the server did not answer: {e}")),
        Ok((text, streamed)) => {
            if text != want {
                rung.status = "diverged";
                rung.detail = format!("the served text differs from the engine's: {text:?} vs {want:?}");
            } else if streamed != text {
                rung.status = "diverged";
                rung.detail = format!("the streamed text differs from the plain response: {streamed:?} vs {text:?}");
            } else {
                rung.detail = "plain and streamed text identical to the engine's".into();
            }
            rung
        }
    }
}
