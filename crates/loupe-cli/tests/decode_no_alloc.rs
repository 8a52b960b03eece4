//! The decode loop allocates nothing once warm: a counting global allocator sees zero
//! allocations (on any thread, pool workers included) over 32 decode steps, for the native
//! and f32 paths, on the tiny random-weight model (always) and on the real model.
//!
//! The counter is process-wide, so every other thread must be quiet while it counts. CI once
//! counted 2 allocations in a decode loop that made none; the recorded backtraces showed the
//! culprit: rayon's global pool, started by the loader's parallel dequantization, whose
//! threads set themselves up whenever the OS first runs them. The measurement now waits
//! for every rayon thread to have run a job first. For the same reason this binary has its
//! own `main` (`harness = false` in Cargo.toml): libtest's threads allocate when they please
//! (formatting a finished test's result line, sending a result), so the tests run one after
//! the other on the main thread. The command line follows libtest's where scripts and cargo
//! use it: name filters, `--exact`, `--ignored`, `--include-ignored`, `--list`; other flags
//! are accepted and ignored. A failure prints the thread and backtrace of the first
//! allocations counted.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use loupe_models::{load, LoadOptions, Precision};
use loupe_runtime::{argmax, Session};

struct CountingAllocator;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
/// Where the first counted allocations came from (thread and backtrace), so a failure
/// says what allocated. Capturing allocates too; `RECORDING` keeps that out of the count.
static TRACES: Mutex<Vec<String>> = Mutex::new(Vec::new());
const MAX_TRACES: usize = 4;
/// Recordings under way (a pool worker may still be capturing when counting stops).
static RECORDINGS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static RECORDING: Cell<bool> = const { Cell::new(false) };
}

fn count(size: usize) {
    if !COUNTING.load(Ordering::Relaxed) || RECORDING.with(|r| r.replace(true)) {
        return;
    }
    RECORDINGS_IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let n = ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    if n < MAX_TRACES {
        let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
        let trace =
            format!("allocation of {size} bytes on thread {thread}:\n{}", std::backtrace::Backtrace::force_capture());
        TRACES.lock().unwrap_or_else(|e| e.into_inner()).push(trace);
    }
    RECORDINGS_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    RECORDING.with(|r| r.set(false));
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Allocations made by 32 greedy decode steps after a prompt and two warm-up steps, on
/// the graph as built and as lowered (fused, memory-planned: what the CLI runs).
fn decode_allocations(path: &Path, precision: Precision, lowered: bool) -> usize {
    loupe_tensor::pool::init_global(2).unwrap();
    let mut model = load(path, LoadOptions { precision, ..Default::default() }).unwrap();
    if lowered {
        model.graph = loupe_graph::passes::lower(model.graph, &Default::default()).unwrap().graph;
    }
    let prompt = model.tokenizer.encode("The lighthouse keeper climbed the stairs", true).unwrap();
    let mut session = Session::new(&model.graph, 256, &Default::default());
    session.reserve(256);
    let mut next = argmax(session.forward(&prompt, false, None).unwrap());
    for _ in 0..2 {
        next = argmax(session.forward(&[next], false, None).unwrap());
    }
    // Loading starts rayon's global pool (parallel dequantization), whose threads set
    // themselves up (allocating) whenever the OS runs them, possibly mid-count: wait until
    // every one has run a job.
    rayon::broadcast(|_| ());
    ALLOCATIONS.store(0, Ordering::SeqCst);
    TRACES.lock().unwrap_or_else(|e| e.into_inner()).clear();
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..32 {
        next = argmax(session.forward(&[next], false, None).unwrap());
    }
    COUNTING.store(false, Ordering::SeqCst);
    while RECORDINGS_IN_FLIGHT.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
    ALLOCATIONS.load(Ordering::SeqCst)
}

fn check(path: PathBuf) {
    for precision in [Precision::Native, Precision::F32] {
        for lowered in [false, true] {
            let n = decode_allocations(&path, precision, lowered);
            let traces = std::mem::take(&mut *TRACES.lock().unwrap_or_else(|e| e.into_inner()));
            assert_eq!(
                n,
                0,
                "{precision:?} (lowered: {lowered}): {n} heap allocations in 32 decode steps; the first:\n{}",
                traces.join("\n")
            );
        }
    }
    // The counter counts: the same measurement around code that allocates sees it.
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let v: Vec<u64> = std::hint::black_box((0..100).collect());
    COUNTING.store(false, Ordering::SeqCst);
    drop(v);
    assert!(ALLOCATIONS.load(Ordering::SeqCst) >= 1, "the counting allocator missed an allocation");
}

struct Case {
    name: &'static str,
    /// Why plain `cargo test` skips it (libtest's `#[ignore = ...]`).
    ignored: Option<&'static str>,
    model: fn() -> PathBuf,
}

const CASES: [Case; 2] = [
    Case { name: "decode_steps_allocate_nothing", ignored: None, model: common::tiny_model },
    Case {
        name: "decode_steps_allocate_nothing_on_the_real_model",
        ignored: Some("needs the real model (scripts/test fetches it)"),
        model: common::real_model,
    },
];

fn main() {
    let (mut exact, mut only_ignored, mut include_ignored, mut list) = (false, false, false, false);
    let mut filters = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--exact" => exact = true,
            "--ignored" => only_ignored = true,
            "--include-ignored" => include_ignored = true,
            "--list" => list = true,
            // libtest flags that take a value: skip it.
            "--test-threads" | "--format" | "--color" | "--logfile" | "--skip" | "-Z" => {
                args.next();
            }
            f if f.starts_with('-') => {}
            name => filters.push(name.to_string()),
        }
    }
    let selected: Vec<&Case> = CASES
        .iter()
        .filter(|c| {
            filters.is_empty() || filters.iter().any(|f| if exact { c.name == f } else { c.name.contains(f.as_str()) })
        })
        .collect();
    if list {
        for c in &selected {
            println!("{}: test", c.name);
        }
        return;
    }
    let filtered_out = CASES.len() - selected.len();
    println!("\nrunning {} tests", selected.len());
    let (mut passed, mut failed, mut ignored) = (Vec::new(), Vec::new(), 0);
    for c in selected {
        let run = match c.ignored {
            Some(_) => only_ignored || include_ignored,
            None => !only_ignored,
        };
        if !run {
            println!("test {} ... ignored{}", c.name, c.ignored.map(|r| format!(", {r}")).unwrap_or_default());
            ignored += 1;
            continue;
        }
        match catch_unwind(AssertUnwindSafe(|| check((c.model)()))) {
            Ok(()) => {
                println!("test {} ... ok", c.name);
                passed.push(c.name);
            }
            Err(_) => {
                println!("test {} ... FAILED", c.name);
                failed.push(c.name);
            }
        }
    }
    if !failed.is_empty() {
        println!("\nfailures:");
        for name in &failed {
            println!("    {name}");
        }
    }
    let verdict = if failed.is_empty() { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {} passed; {} failed; {ignored} ignored; 0 measured; {filtered_out} filtered out\n",
        passed.len(),
        failed.len()
    );
    if !failed.is_empty() {
        std::process::exit(101);
    }
}
