//! The task split the panel kernels share (`qpanel`, `prompt16`): weight rows in panels of
//! 16, panels spread over the compute pool, each task packing its panels one after another
//! into a 64-byte-aligned buffer of its thread.

use std::cell::RefCell;

use crate::pool;

/// Weight rows per panel: the 16 i32 lanes of an AVX-512 vector.
pub const PANEL: usize = 16;

/// Tasks per compute thread: enough that a thread finishing early takes another panel run.
const TASKS_PER_THREAD: usize = 4;

/// A 64-byte line, so a panel buffer is aligned for its vector loads.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u8; 64]);

thread_local! {
    /// The calling thread's packed panel.
    static PANEL_BUFFER: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// `bytes` of a `Line` buffer as bytes (a multiple of 64 long).
pub(crate) fn line_bytes(lines: &mut [Line]) -> &mut [u8] {
    // SAFETY: a slice of 64-byte lines is its bytes, contiguous, with no padding.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), lines.len() * 64) }
}

/// Runs `body(panel, j0, cols)` for every panel of `n` weight rows (rows `j0..j0 + cols`,
/// `cols <= PANEL`), over the pool; `panel` is `bytes` bytes (a multiple of 64), 64-aligned,
/// the task's own, with whatever the last panel left in it.
pub(crate) fn for_each_panel(n: usize, bytes: usize, body: &(dyn Fn(&mut [u8], usize, usize) + Sync)) {
    let panels = n.div_ceil(PANEL);
    let tasks = (pool::threads() * TASKS_PER_THREAD).min(panels).max(1);
    let per = panels.div_ceil(tasks);
    pool::run(tasks, &|t| {
        PANEL_BUFFER.with(|buf| {
            let buf = &mut *buf.borrow_mut();
            buf.resize(bytes.div_ceil(64), Line([0; 64]));
            let panel = &mut line_bytes(buf)[..bytes];
            for p in (t * per).min(panels)..((t + 1) * per).min(panels) {
                let j0 = p * PANEL;
                body(panel, j0, PANEL.min(n - j0));
            }
        })
    });
}
