//! `loupe serve` — WORK IN PROGRESS (issue 11), not yet wired into the CLI or tested.
//!
//! Design: the batched engine runs on one dedicated OS thread ([`EngineHandle`]), never on
//! the async runtime; HTTP handlers send it commands over a channel and receive each
//! sequence's events on a per-request channel. A client that goes away is noticed when its
//! event channel is closed, and its sequence is cancelled (blocks released at once).

use std::sync::mpsc;
use std::thread::JoinHandle;

use loupe_runtime::{BatchConfig, BatchEngine, Engine, SeqEvent, SeqRequest};
use tokio::sync::mpsc::UnboundedSender;

/// What a request's channel receives.
#[derive(Debug)]
pub enum Reply {
    /// The request was queued as this sequence.
    Queued(u64),
    Event(SeqEvent),
    /// The engine refused the request or failed a step.
    Error(String),
}

enum Command {
    Add { request: SeqRequest, replies: UnboundedSender<Reply> },
    Cancel(u64),
    Shutdown,
}

/// The engine thread: owns the [`Engine`] and its [`BatchEngine`].
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    pub fn spawn(engine: Engine, config: BatchConfig) -> EngineHandle {
        let (tx, rx) = mpsc::channel::<Command>();
        let thread = std::thread::Builder::new()
            .name("loupe-engine".into())
            .spawn(move || engine_loop(engine, config, rx))
            .expect("spawning the engine thread");
        EngineHandle { commands: tx, thread: Some(thread) }
    }

    /// Queues a request; its replies arrive on `replies`.
    pub fn submit(&self, request: SeqRequest, replies: UnboundedSender<Reply>) -> bool {
        self.commands.send(Command::Add { request, replies }).is_ok()
    }

    pub fn cancel(&self, id: u64) {
        let _ = self.commands.send(Command::Cancel(id));
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn engine_loop(engine: Engine, config: BatchConfig, rx: mpsc::Receiver<Command>) {
    let mut batch = match BatchEngine::new(&engine, config) {
        Ok(b) => b,
        Err(e) => {
            // Every request gets the error.
            for cmd in rx {
                if let Command::Add { replies, .. } = cmd {
                    let _ = replies.send(Reply::Error(e.to_string()));
                }
            }
            return;
        }
    };
    let mut routes: std::collections::HashMap<u64, UnboundedSender<Reply>> = std::collections::HashMap::new();
    loop {
        // Block while idle; otherwise take what arrived and step.
        let first = if batch.has_work() { rx.try_recv().ok() } else { rx.recv().ok().or(Some(Command::Shutdown)) };
        let mut pending: Vec<Command> = first.into_iter().collect();
        pending.extend(rx.try_iter());
        for cmd in pending {
            match cmd {
                Command::Add { request, replies } => match batch.add(request) {
                    Ok(id) => {
                        let _ = replies.send(Reply::Queued(id));
                        routes.insert(id, replies);
                    }
                    Err(e) => {
                        let _ = replies.send(Reply::Error(e.to_string()));
                    }
                },
                Command::Cancel(id) => {
                    batch.cancel(id);
                    routes.remove(&id);
                }
                Command::Shutdown => return,
            }
        }
        if !batch.has_work() {
            continue;
        }
        match batch.step() {
            Ok(events) => {
                for event in events {
                    let id = match &event {
                        SeqEvent::Token { id, .. } | SeqEvent::Finished { id, .. } => *id,
                    };
                    let finished = matches!(event, SeqEvent::Finished { .. });
                    let gone = routes.get(&id).is_none_or(|tx| tx.send(Reply::Event(event)).is_err());
                    if gone && !finished {
                        // The client went away: stop its sequence now.
                        batch.cancel(id);
                    }
                    if finished || gone {
                        routes.remove(&id);
                    }
                }
            }
            Err(e) => {
                for (id, tx) in routes.drain() {
                    let _ = tx.send(Reply::Error(e.to_string()));
                    batch.cancel(id);
                }
            }
        }
    }
}
