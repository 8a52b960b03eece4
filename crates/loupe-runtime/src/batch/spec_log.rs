//! What speculation did, step by step: a JSON-lines log of each speculating sequence's
//! sampling in each step ([`crate::BatchConfig::speculation_log`], `--speculation-log FILE`),
//! and, under a profiler, the split of the engine's time between drafting, steps that verify
//! drafts and steps without any (the "by phase" rows of `--profile`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use loupe_graph::Profiler;
use loupe_text::Tokenizer;

use crate::RuntimeError;

/// The drafter's calls (one per generating sequence and step that may draft).
pub const PHASE_DRAFT: &str = "speculation: drafting";
/// Steps in which at least one sequence verified drafts (forward pass and sampling).
pub const PHASE_VERIFY: &str = "speculation: steps that verify drafts";
/// Steps of generating sequences only, none with a draft.
pub const PHASE_DECODE: &str = "speculation: decode steps without drafts";
/// Steps with prompt rows and no draft (prefill, recomputation).
pub const PHASE_PROMPT: &str = "speculation: steps with prompt rows";

/// One sequence's sampling in one step, as the log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecRecord<'a> {
    /// The engine's step count, from 1.
    pub step: u64,
    /// The sequence's id (a `SeqId`).
    pub seq: u64,
    /// Tokens (prompt and output) before this step's: the position of the first produced one.
    pub position: usize,
    /// What the drafter proposed (empty: nothing, e.g. no n-gram matched).
    pub proposed: &'a [u32],
    /// How many of `proposed` were accepted.
    pub accepted: usize,
    /// The tokens the step gave the sequence: the accepted drafts, then the target's own.
    pub produced: &'a [u32],
}

impl SpecRecord<'_> {
    /// The record as one JSON object, with the proposed and produced tokens also as text.
    pub fn to_json(&self, tokenizer: &Tokenizer) -> serde_json::Value {
        let text = |ids: &[u32]| tokenizer.decode(ids, false).unwrap_or_else(|e| format!("<{e}>"));
        serde_json::json!({
            "step": self.step,
            "seq": self.seq,
            "position": self.position,
            "proposed": self.proposed,
            "proposed_text": text(self.proposed),
            "accepted": self.accepted,
            "produced": self.produced,
            "produced_text": text(self.produced),
        })
    }
}

/// The open log file.
pub(crate) struct SpecLog {
    path: PathBuf,
    out: BufWriter<File>,
}

impl SpecLog {
    /// Creates (truncates) the log at `path`.
    pub(crate) fn create(path: &Path) -> Result<SpecLog, RuntimeError> {
        let file = File::create(path).map_err(|source| RuntimeError::SpeculationLog { path: path.into(), source })?;
        Ok(SpecLog { path: path.into(), out: BufWriter::new(file) })
    }

    /// Appends one line.
    pub(crate) fn write(&mut self, record: &SpecRecord<'_>, tokenizer: &Tokenizer) -> std::io::Result<()> {
        writeln!(self.out, "{}", record.to_json(tokenizer))
    }

    /// Writes out what the step logged; on failure warns once and turns the log off by
    /// setting `log` to `None` (a debug aid must not stop a server).
    pub(crate) fn flush_or_close(log: &mut Option<SpecLog>, result: std::io::Result<()>) {
        let Some(l) = log.as_mut() else { return };
        if let Err(e) = result.and_then(|()| l.out.flush()) {
            eprintln!("loupe: warning: the speculation log {} is off from now on: {e}", l.path.display());
            *log = None;
        }
    }
}

/// A step's time under a profiler with speculation on: the drafter's share, then the rest
/// of the step by what it ran.
pub(crate) struct StepClock {
    start: Instant,
    draft_nanos: u64,
    drafts: u64,
}

impl StepClock {
    pub(crate) fn start() -> StepClock {
        StepClock { start: Instant::now(), draft_nanos: 0, drafts: 0 }
    }

    /// Counts one call of the drafter that began at `since`.
    pub(crate) fn drafted(&mut self, since: Instant) {
        self.draft_nanos += since.elapsed().as_nanos() as u64;
        self.drafts += 1;
    }

    /// Adds the step to `profiler`: its drafting, and the remainder under the phase its
    /// rows make it (a draft anywhere makes it a verifying step).
    pub(crate) fn finish(self, profiler: &Profiler, verified: bool, prompt_rows: bool) {
        let total = self.start.elapsed().as_nanos() as u64;
        if self.drafts > 0 {
            profiler.add_phase(PHASE_DRAFT, self.drafts, self.draft_nanos);
        }
        let phase = match (verified, prompt_rows) {
            (true, _) => PHASE_VERIFY,
            (false, false) => PHASE_DECODE,
            (false, true) => PHASE_PROMPT,
        };
        profiler.add_phase(phase, 1, total.saturating_sub(self.draft_nanos));
    }
}
