//! The decode loop allocates nothing once warm: a counting global allocator sees zero
//! allocations (on any thread, pool workers included) over 32 decode steps of the real
//! model, for the native and f32 paths.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use loupe_models::{load, LoadOptions, Precision};
use loupe_runtime::{argmax, Session};

struct CountingAllocator;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
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
fn decode_allocations(precision: Precision, lowered: bool) -> usize {
    let Some(path) = common::real_model() else { return 0 };
    loupe_tensor::pool::init_global(2).unwrap();
    let mut model = load(&path, LoadOptions { precision, ..Default::default() }).unwrap();
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
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..32 {
        next = argmax(session.forward(&[next], false, None).unwrap());
    }
    COUNTING.store(false, Ordering::SeqCst);
    ALLOCATIONS.load(Ordering::SeqCst)
}

// One test function: the counter is process-wide, so two tests running in parallel
// threads would count each other's allocations.
#[test]
fn decode_steps_allocate_nothing() {
    for precision in [Precision::Native, Precision::F32] {
        for lowered in [false, true] {
            let n = decode_allocations(precision, lowered);
            assert_eq!(n, 0, "{precision:?} (lowered: {lowered}): {n} heap allocations in 32 decode steps");
        }
    }
}
