//! The `LOUPE_DEBUG` checks the executor runs around each kernel call: `op-log-level`'s
//! LAUNCH/COMPLETE lines, `assert-level`'s input lengths, `uninitialized-read-check`'s
//! poisoned inputs and `nan-check`'s outputs.

use std::time::Instant;

use super::slots::Slots;
use crate::debug::{AssertLevel, DebugOptions, UninitMode};
use crate::ir::{Graph, Node, ValueInfo};
use crate::verify::row_width;
use crate::GraphError;

/// The poison that `uninitialized-read-check` fills fresh buffers with: all bytes 0xFF, as
/// MAX does on the host (a NaN no kernel produces from real inputs).
pub(crate) const POISON_BITS: u32 = 0xFFFF_FFFF;

/// The `LOUPE_DEBUG` options the executor acts on, copied into plain fields once, so an
/// option that is off costs one branch per node (`any`) and nothing else; and their state.
#[derive(Debug, Clone, Default)]
pub(crate) struct ExecDebug {
    pub(crate) any: bool,
    nan_check: bool,
    nan_stride: u64,
    pub(crate) uninit: bool,
    uninit_abort: bool,
    op_log: bool,
    source: bool,
    asserts: AssertLevel,
    /// Nodes run so far (all runs): `nan-check-stride` counts kernel outputs across calls.
    ops_run: u64,
    /// `uninitialized-read-mode=report`: values computed from poison in this run. NaN
    /// arithmetic carries the poison's bit pattern on, so their own reads are not reported
    /// again: each report names a value that really was left unwritten.
    tainted: Vec<bool>,
}

impl ExecDebug {
    pub(crate) fn from_options(o: &DebugOptions) -> ExecDebug {
        let asserts = o.assert_level;
        let op_log = o.op_log_level.logs_ops();
        ExecDebug {
            any: o.nan_check || o.uninitialized_read_check || op_log || asserts != AssertLevel::None,
            nan_check: o.nan_check,
            nan_stride: u64::from(o.nan_check_stride.max(1)),
            uninit: o.uninitialized_read_check,
            uninit_abort: o.uninitialized_read_mode == UninitMode::Abort,
            op_log,
            source: o.source_tracebacks,
            asserts,
            ops_run: 0,
            tainted: Vec::new(),
        }
    }

    /// Called at the start of a run of a graph of `values` values.
    pub(crate) fn start_run(&mut self, values: usize) {
        if self.uninit {
            self.tainted.clear();
            self.tainted.resize(values, false);
        }
    }

    /// Checks before a kernel: `op-log-level`'s LAUNCH line, `assert-level`'s input
    /// lengths, `uninitialized-read-check`'s poisoned inputs. Returns the launch time.
    pub(crate) fn before_node(
        &mut self,
        graph: &Graph,
        i: usize,
        node: &Node,
        n_tokens: usize,
        slots: &Slots,
    ) -> Result<Option<Instant>, GraphError> {
        let info = graph.value(node.output);
        if self.op_log {
            let at = if self.source { format!(" @ {}", info.location) } else { String::new() };
            eprintln!("[OP] LAUNCH {} [id={i}] target=cpu op={}{at}", info.name, node.op.name());
        }
        if self.asserts != AssertLevel::None {
            for inp in &node.inputs {
                let v = graph.value(*inp);
                let have = slots.value(*inp).len();
                let want = row_width(v).map(|w| w * n_tokens);
                if want != Some(have) {
                    let msg =
                        format!("input '{}' holds {have} values, its shape [T={n_tokens}, ...] needs {want:?}", v.name);
                    self.assert_failed(node, info, msg)?;
                }
            }
        }
        if self.uninit {
            for inp in &node.inputs {
                if self.tainted[inp.0 as usize] {
                    self.tainted[node.output.0 as usize] = true;
                    continue;
                }
                let data = slots.value(*inp);
                let poisoned = data.iter().filter(|x| x.to_bits() == POISON_BITS).count();
                if poisoned > 0 {
                    let input = graph.value(*inp);
                    let first = data.iter().position(|x| x.to_bits() == POISON_BITS).unwrap_or(0);
                    let err = GraphError::UninitializedRead {
                        op: node.op.name(),
                        name: info.name.clone(),
                        location: info.location.to_string(),
                        input: format!("'{}' (built at {})", input.name, input.location),
                        poisoned,
                        len: data.len(),
                        first,
                    };
                    if self.uninit_abort {
                        return Err(err);
                    }
                    eprintln!("loupe: warning: {err}");
                    self.tainted[node.output.0 as usize] = true;
                }
            }
        }
        Ok(self.op_log.then(Instant::now))
    }

    /// Checks after a kernel: `nan-check` (every stride-th op), `op-log-level`'s COMPLETE
    /// line.
    pub(crate) fn after_node(
        &mut self,
        i: usize,
        node: &Node,
        info: &ValueInfo,
        out: &[f32],
        started: Option<Instant>,
    ) -> Result<(), GraphError> {
        if let Some(t) = started {
            let at = if self.source { format!(" @ {}", info.location) } else { String::new() };
            eprintln!(
                "[OP] COMPLETE {} [id={i}] target=cpu op={} ({:.1} us){at}",
                info.name,
                node.op.name(),
                t.elapsed().as_secs_f64() * 1e6
            );
        }
        if self.nan_check {
            self.ops_run += 1;
            if self.ops_run.is_multiple_of(self.nan_stride) {
                let (mut nans, mut infs, mut first) = (0usize, 0usize, None);
                for (k, x) in out.iter().enumerate() {
                    if !x.is_finite() {
                        if x.is_nan() {
                            nans += 1;
                        } else {
                            infs += 1;
                        }
                        first.get_or_insert(k);
                    }
                }
                if let Some(first) = first {
                    let width = row_width(info).unwrap_or(1).max(1);
                    return Err(GraphError::NanCheck {
                        op: node.op.name(),
                        name: info.name.clone(),
                        location: info.location.to_string(),
                        nans,
                        infs,
                        len: out.len(),
                        first: (first / width, first % width),
                    });
                }
            }
        }
        Ok(())
    }

    fn assert_failed(&self, node: &Node, info: &ValueInfo, detail: String) -> Result<(), GraphError> {
        let err = GraphError::Assert {
            op: node.op.name(),
            name: info.name.clone(),
            location: info.location.to_string(),
            detail,
        };
        if self.asserts == AssertLevel::Warn {
            eprintln!("loupe: warning: {err}");
            Ok(())
        } else {
            Err(err)
        }
    }
}
