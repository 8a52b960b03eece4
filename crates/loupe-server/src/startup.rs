//! Start-up and shutdown: bind first (so `/health` answers 503 while loading), load the model
//! on a blocking thread, start the engine thread, log one line per phase, then serve until
//! SIGTERM/SIGINT and drain in-flight requests within `shutdown_timeout`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use loupe_runtime::Engine;
use loupe_text::SectionMarkers;

use crate::metrics::Metrics;
use crate::options::{ServeError, ServeOptions};
use crate::routes::router;
use crate::state::{log, unix_now, AppState, Ready};
use crate::worker::EngineHandle;

/// Runs the server until SIGTERM or SIGINT. `load` builds the engine (on a blocking
/// thread, while `/health` answers 503); `on_listening` is told the bound address.
pub fn serve(
    options: ServeOptions,
    load: impl FnOnce() -> Result<Engine, String> + Send + 'static,
) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("loupe-http")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    runtime.block_on(run(options, load))
}

pub(crate) async fn run(
    options: ServeOptions,
    load: impl FnOnce() -> Result<Engine, String> + Send + 'static,
) -> Result<(), ServeError> {
    let start = Instant::now();
    let addr = format!("{}:{}", options.host, options.port);
    let listener =
        tokio::net::TcpListener::bind(&addr).await.map_err(|source| ServeError::Bind { addr: addr.clone(), source })?;
    let local: SocketAddr = listener.local_addr().map_err(|source| ServeError::Bind { addr, source })?;
    log(format!("listening on http://{local} (GET /health answers 503 until the model is loaded)"));

    let metrics = Arc::new(Metrics::default());
    let state = Arc::new(AppState {
        options: options.clone(),
        ready: OnceLock::new(),
        embed_lock: Arc::new(Mutex::new(())),
        metrics: metrics.clone(),
        in_flight: AtomicUsize::new(0),
        next_key: AtomicU64::new(1),
        shutting_down: AtomicBool::new(false),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let failed: Arc<Mutex<Option<ServeError>>> = Arc::new(Mutex::new(None));

    // Load in the background; a failure stops the server with the error.
    {
        let state = state.clone();
        let failed = failed.clone();
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            let (batch, metrics) = (state.options.batch.clone(), state.metrics.clone());
            let loaded = tokio::task::spawn_blocking(move || {
                let t = Instant::now();
                let engine = load().map_err(ServeError::Load)?;
                let embed = if engine.is_encoder() {
                    Some(engine.embed_config().map_err(|e| ServeError::Load(e.to_string()))?)
                } else {
                    None
                };
                let load_time = t.elapsed();
                log(format!(
                    "phase load: {:.2} s ({}, {:?} precision, {} threads)",
                    load_time.as_secs_f64(),
                    engine.path().display(),
                    engine.precision(),
                    engine.threads()
                ));
                let engine = Arc::new(engine);
                let t = Instant::now();
                let handle = EngineHandle::spawn(engine.clone(), batch, metrics).map_err(ServeError::Engine)?;
                let kv_time = t.elapsed();
                Ok::<_, ServeError>((engine, handle, embed, load_time, kv_time))
            })
            .await;
            match loaded {
                Ok(Ok((engine, handle, embed, load_time, kv_time))) => {
                    let model_context = engine.context_length();
                    let context = state.options.max_context.map_or(model_context, |c| c.min(model_context));
                    let model_id = state.options.served_model_name.clone().unwrap_or_else(|| {
                        engine
                            .path()
                            .file_stem()
                            .map(|s| s.to_string_lossy().into_owned())
                            .unwrap_or_else(|| "model".into())
                    });
                    let m = &state.metrics;
                    m.model_load_time[0].observe(load_time.as_secs_f64() * 1e3);
                    m.model_load_time[1].observe(kv_time.as_secs_f64() * 1e3);
                    m.model_load_time[2].observe(start.elapsed().as_secs_f64() * 1e3);
                    let b = &state.options.batch;
                    log(format!(
                        "phase kv_cache: {:.2} s ({} {} blocks of {} positions, up to {} sequences, {} tokens per step, prefix cache {})",
                        kv_time.as_secs_f64(),
                        m.kv_blocks_total.get(),
                        b.kv_dtype.unwrap_or(engine.graph().kv_dtype),
                        b.block_size,
                        b.max_seqs,
                        b.max_batch_tokens,
                        if b.prefix_cache { "on" } else { "off" }
                    ));
                    let parser = state
                        .options
                        .reasoning_parser
                        .clone()
                        .unwrap_or_else(|| engine.config().family().default_reasoning_parser().into());
                    // Tool calls are not served yet, so only reasoning markers split the text.
                    let reasoning = SectionMarkers::for_reasoning_parser(&parser)
                        .filter(|m| m.reasoning.is_some())
                        .map(|m| SectionMarkers { tool_call: None, ..m });
                    log(format!("reasoning parser: {parser}"));
                    if let Some(e) = &embed {
                        log(format!(
                            "encoder: serving /v1/embeddings only ({} pooling{}, inputs cut at {} tokens)",
                            e.pooling.name(),
                            if e.normalize { ", L2-normalized" } else { "" },
                            e.max_tokens
                        ));
                    }
                    let _ = state.ready.set(Ready {
                        reasoning,
                        engine,
                        handle,
                        embed,
                        model_id: model_id.clone(),
                        context,
                        created: unix_now(),
                    });
                    log(format!(
                        "ready in {:.2} s: model '{model_id}', context {context} tokens, at most {} requests in flight",
                        start.elapsed().as_secs_f64(),
                        state.limit()
                    ));
                }
                Ok(Err(e)) => {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    let _ = stop_tx.send(true);
                }
                Err(join) => {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(ServeError::Load(format!("the loading thread failed: {join}")));
                    let _ = stop_tx.send(true);
                }
            }
        });
    }

    // Signals: stop accepting; after the grace period, cancel what is still running.
    {
        let state = state.clone();
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            state.shutting_down.store(true, Ordering::Relaxed);
            let grace = state.options.shutdown_timeout;
            log(format!(
                "shutting down: no new requests; {} in flight get up to {:.0} s to finish",
                state.in_flight.load(Ordering::Relaxed),
                grace.as_secs_f64()
            ));
            let _ = stop_tx.send(true);
            tokio::time::sleep(grace).await;
            if let Some(ready) = state.ready.get() {
                let left = state.in_flight.load(Ordering::Relaxed);
                if left > 0 {
                    log(format!("shutdown timeout: cancelling {left} requests"));
                }
                ready.handle.cancel_all();
            }
            // Connections that still do not close are not waited for.
            tokio::time::sleep(Duration::from_secs(5)).await;
            log("shutdown: connections still open after the timeout are dropped");
            std::process::exit(0);
        });
    }

    let app = router(state.clone());
    let mut stop_rx2 = stop_rx.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop_rx2.wait_for(|&s| s).await;
        })
        .await
        .map_err(ServeError::Http)?;
    drop(stop_rx);
    if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    log("stopped");
    Ok(())
}

pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
