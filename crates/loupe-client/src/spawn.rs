//! Starting a `loupe serve` child and waiting until it answers, written once for every caller
//! (`loupe bisect`'s served rung, `loupe bench-serve` without `--url`, the CLI's server
//! tests).
//!
//! The child listens on 127.0.0.1 with `--port 0`; its address comes from the log line
//! `loupe serve: listening on http://ADDR`, and it is ready at the line `...: ready in ...`
//! (docs/serving.md, "Lifecycle"). A `loupe: error` line, the child's exit or the ready
//! timeout ends the wait with an error naming it. The log (stderr) is read on a thread for
//! the child's whole life, so the server never blocks on a full pipe, and kept (its last
//! [`MAX_LOG_LINES`] lines) for [`ServeProcess::stop`].
//!
//! Shutdown is one rule: SIGTERM (the server's graceful shutdown), then SIGKILL if it has not
//! exited after [`SpawnOptions::stop_grace`]. Dropping a [`ServeProcess`] does the same.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::http::HttpClient;

/// Log lines kept for [`ServeProcess::stop`] (the oldest are dropped beyond it).
pub const MAX_LOG_LINES: usize = 10_000;

/// Why no ready server came up, or the child could not be stopped.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot start {exe}: {source}")]
    Start { exe: PathBuf, source: std::io::Error },
    #[error("loupe serve failed to start: {line}")]
    Failed { line: String },
    #[error("loupe serve exited before it was ready ({status}); its log ends: {tail}")]
    Exited { status: String, tail: String },
    #[error("loupe serve was not ready after {0:?}")]
    Timeout(Duration),
    #[error("loupe serve was ready without printing its address")]
    NoAddress,
    #[error("waiting for loupe serve: {0}")]
    Wait(std::io::Error),
}

/// How to start and stop the child.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    /// The `loupe` binary.
    pub exe: PathBuf,
    /// Flags after `serve --host 127.0.0.1 --port 0` (`--model`, `--precision`, ...).
    pub args: Vec<OsString>,
    /// How long loading may take before the start fails.
    pub ready_timeout: Duration,
    /// How long after SIGTERM before SIGKILL.
    pub stop_grace: Duration,
}

impl SpawnOptions {
    /// `exe serve --host 127.0.0.1 --port 0 ARGS`, ready within 300 s, SIGKILL 60 s after
    /// SIGTERM (past the server's default 30 s `--shutdown-timeout`).
    pub fn new(exe: impl Into<PathBuf>, args: impl IntoIterator<Item = impl Into<OsString>>) -> SpawnOptions {
        SpawnOptions {
            exe: exe.into(),
            args: args.into_iter().map(Into::into).collect(),
            ready_timeout: Duration::from_secs(300),
            stop_grace: Duration::from_secs(60),
        }
    }
}

/// How the child ended: its exit code (`None`: killed by a signal), whether SIGKILL was
/// needed, and its log.
#[derive(Debug)]
pub struct Stopped {
    pub code: Option<i32>,
    pub killed: bool,
    pub log: Vec<String>,
}

/// A ready `loupe serve` child. Stopped (SIGTERM, then SIGKILL) on [`ServeProcess::stop`] or
/// drop.
pub struct ServeProcess {
    child: Option<Child>,
    addr: String,
    log: Arc<Mutex<VecDeque<String>>>,
    reader: Option<JoinHandle<()>>,
    stop_grace: Duration,
}

impl ServeProcess {
    /// Starts the child and waits until it is ready.
    pub fn spawn(options: &SpawnOptions) -> Result<ServeProcess, SpawnError> {
        let mut child = Command::new(&options.exe)
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(&options.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| SpawnError::Start { exe: options.exe.clone(), source })?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, lines) = mpsc::channel::<String>();
        let reader = child.stderr.take().map(|stderr| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    push_line(&log, line.clone());
                    // Nobody listens once the server is ready; the log keeps the line.
                    let _ = tx.send(line);
                }
            })
        });
        let mut server =
            ServeProcess { child: Some(child), addr: String::new(), log, reader, stop_grace: options.stop_grace };
        server.addr = server.wait_ready(&lines, options.ready_timeout)?;
        Ok(server)
    }

    /// Reads start-up lines until `ready in`; the address from `listening on http://`.
    fn wait_ready(&mut self, lines: &mpsc::Receiver<String>, timeout: Duration) -> Result<String, SpawnError> {
        let deadline = Instant::now() + timeout;
        let mut addr = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => return Err(SpawnError::Timeout(timeout)),
                Err(RecvTimeoutError::Disconnected) => {
                    // The pipe closed: the child is gone (or closed stderr, which it never does).
                    let status = self.wait_exit().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                    let tail = self.log_lines().into_iter().rev().take(3).rev().collect::<Vec<_>>().join(" | ");
                    return Err(SpawnError::Exited { status, tail });
                }
            };
            if let Some(rest) = line.split("listening on http://").nth(1) {
                addr = rest.split_whitespace().next().map(str::to_string);
            }
            if line.contains(": ready in ") {
                return addr.ok_or(SpawnError::NoAddress);
            }
            if line.starts_with("loupe: error") {
                return Err(SpawnError::Failed { line });
            }
        }
    }

    fn wait_exit(&mut self) -> std::io::Result<ExitStatus> {
        match &mut self.child {
            Some(c) => c.wait(),
            None => Err(std::io::Error::other("already stopped")),
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// An HTTP client of this server.
    pub fn client(&self) -> HttpClient {
        HttpClient::new(self.addr.clone())
    }

    /// The log so far (its last [`MAX_LOG_LINES`] lines).
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().map(|l| l.iter().cloned().collect()).unwrap_or_default()
    }

    /// SIGTERM, SIGKILL after the grace period; the exit code and the whole log.
    pub fn stop(mut self) -> Result<Stopped, SpawnError> {
        let (code, killed) = self.terminate().map_err(SpawnError::Wait)?;
        // The pipe closed with the process, which ends the reader.
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        Ok(Stopped { code, killed, log: self.log_lines() })
    }

    /// Stops the child if it is still held: its exit code and whether SIGKILL was sent.
    fn terminate(&mut self) -> std::io::Result<(Option<i32>, bool)> {
        let Some(mut child) = self.child.take() else { return Ok((None, false)) };
        if let Some(status) = child.try_wait()? {
            return Ok((status.code(), false));
        }
        let pid = libc::pid_t::try_from(child.id()).map_err(std::io::Error::other)?;
        // SAFETY: kill(2) on our own child, which has not been reaped (try_wait saw it
        // running), so the pid is still ours; no memory is touched.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + self.stop_grace;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait()? {
                return Ok((status.code(), false));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill()?;
        Ok((child.wait()?.code(), true))
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.terminate();
    }
}

fn push_line(log: &Mutex<VecDeque<String>>, line: String) {
    if let Ok(mut log) = log.lock() {
        if log.len() == MAX_LOG_LINES {
            log.pop_front();
        }
        log.push_back(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_exits_early_is_an_error_naming_its_log() {
        // `sh -c` stands in for loupe: it prints an error line, as loupe does, and exits 2.
        let options =
            SpawnOptions { ready_timeout: Duration::from_secs(10), ..SpawnOptions::new("sh", Vec::<OsString>::new()) };
        // `sh serve ...` fails to open a script named "serve": it exits without a ready line.
        match ServeProcess::spawn(&options) {
            Err(SpawnError::Exited { .. }) | Err(SpawnError::Failed { .. }) => {}
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("sh became a server"),
        }
    }

    #[test]
    fn the_log_keeps_its_last_lines() {
        let log = Mutex::new(VecDeque::new());
        for i in 0..MAX_LOG_LINES + 2 {
            push_line(&log, i.to_string());
        }
        let log = log.into_inner().unwrap();
        assert_eq!((log.len(), log.front().map(String::as_str)), (MAX_LOG_LINES, Some("2")));
    }
}
