//! The disk tier's writer thread: block files are written (checksummed, into a temporary
//! name, then renamed, so a file under its final name is always whole) and deleted off the
//! engine thread, in the order the engine asked.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use super::error::DiskError;
use super::format;

pub(super) enum Job {
    /// `buf` holds the header, tokens and payload; the writer appends the checksum.
    Write {
        key: u64,
        path: PathBuf,
        buf: Vec<u8>,
    },
    Delete {
        path: PathBuf,
    },
}

pub(super) enum Done {
    Written { key: u64, bytes: u64, buf: Vec<u8> },
    Failed { error: DiskError },
}

/// The thread and its two channels; dropping it lets the queued jobs finish, then joins.
pub(super) struct Writer {
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
}

fn write_file(path: &Path, buf: &[u8]) -> Result<(), DiskError> {
    let tmp = path.with_extension("kvb.tmp");
    let io = |op: &'static str, source| DiskError::Io { path: tmp.clone(), op, source };
    let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", e))?;
    f.write_all(buf).map_err(|e| io("write", e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|source| DiskError::Io { path: path.to_path_buf(), op: "rename", source })
}

fn run(jobs: Receiver<Job>, done: Sender<Done>) {
    for job in jobs {
        let reply = match job {
            Job::Write { key, path, mut buf } => {
                format::finish(&mut buf);
                match write_file(&path, &buf) {
                    Ok(()) => Done::Written { key, bytes: buf.len() as u64, buf },
                    Err(error) => {
                        let _ = std::fs::remove_file(path.with_extension("kvb.tmp"));
                        Done::Failed { error }
                    }
                }
            }
            Job::Delete { path } => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Done::Failed { error: DiskError::Io { path, op: "delete", source: e } }
                }
                _ => continue,
            },
        };
        if done.send(reply).is_err() {
            return;
        }
    }
}

impl Writer {
    pub(super) fn start(dir: &Path) -> Result<Writer, DiskError> {
        let (jobs, rx) = channel();
        let (tx, done) = channel();
        let thread = std::thread::Builder::new()
            .name("loupe-kv-disk".into())
            .spawn(move || run(rx, tx))
            .map_err(|source| DiskError::Io { path: dir.to_path_buf(), op: "start the writer thread", source })?;
        Ok(Writer { jobs: Some(jobs), done, thread: Some(thread) })
    }

    /// Queues a job; false if the thread is gone.
    pub(super) fn send(&self, job: Job) -> bool {
        self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok())
    }

    pub(super) fn try_done(&self) -> Option<Done> {
        self.done.try_recv().ok()
    }

    /// The next finished job, waiting for it; `None` if the thread is gone.
    pub(super) fn wait_done(&self) -> Option<Done> {
        self.done.recv().ok()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
