//! Progress callbacks of the long comparisons (the CLI draws a bar; the library draws nothing).

/// Progress callbacks (the CLI draws a bar; the library draws nothing).
pub trait Progress {
    fn start(&mut self, _pairs: usize, _bytes: u64) {}
    fn tick(&mut self, _name: &str, _bytes: u64) {}
    fn finish(&mut self) {}
}

/// No progress display.
pub struct NoProgress;

impl Progress for NoProgress {}
