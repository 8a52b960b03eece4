//! The compute thread pool: `threads - 1` persistent workers plus the calling thread.
//!
//! Why not rayon: a decode step of SmolLM2 runs ~300 small parallel ops of 5-50 µs
//! each. rayon's idle workers spin with `sched_yield` and then sleep on a futex; in
//! `perf` that showed as ~20% of decode time in the scheduler on the 2-core machine.
//! Here a job is published through one atomic generation counter; workers that have
//! run a job recently spin on it (no syscalls) for [`SPIN`], then sleep on a condvar,
//! so the pool costs nothing while the program is idle and a fork-join costs well
//! under a microsecond while it is busy. The caller takes part in its own job, so
//! `threads` compute threads never oversubscribe `threads` cores.
//!
//! Tasks are claimed one index at a time, so uneven tasks balance; callers choose task
//! sizes (a band of weight rows, a head) big enough that the claim (one compare-and-swap)
//! is noise. Each compute thread owns a contiguous share of the task indices and claims
//! its own from the front; a thread whose share is empty steals from the back of
//! another's. So when all threads run, each walks one contiguous stretch of a matrix's
//! rows, and its hardware and software prefetch run on from one task into the next; with
//! a single shared counter, the two threads took alternate bands and every band began
//! cold; streaming cold matrices measured faster with shares (BENCHMARKS.md,
//! "Measurements once in doc comments").
//!
//! Re-entrancy: a `run` from inside a task, or while another thread's job holds the
//! pool, runs its tasks serially on the calling thread instead of waiting, so tests
//! that run in parallel and nested calls never deadlock.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker polls for the next job before sleeping. Decode's gaps
/// between parallel ops (norms, RoPE, sampling on the caller) are 1-30 µs; a token
/// of SmolLM2 takes ~10 ms, so 2 ms keeps workers hot through a whole generation and
/// still lets them sleep soon after it ends.
const SPIN: Duration = Duration::from_millis(2);

/// A job as the workers see it: the task body with its lifetime erased. Valid only
/// while the publishing `run` call is on the stack, which waits for every worker to
/// finish with it before returning.
#[derive(Clone, Copy)]
struct JobRef {
    body: *const (dyn Fn(usize) + Sync),
}
// SAFETY: the pointee is `Sync` and outlives every use (see `JobRef`).
unsafe impl Send for JobRef {}

struct Shared {
    /// `generation << 1 | closed`: bumped (under `job`'s lock) when a job is published;
    /// the low bit is set once every task of the job has been claimed, after which
    /// workers that wake late must not touch it.
    state: AtomicU64,
    job: Mutex<Option<JobRef>>,
    wake: Condvar,
    /// Each compute thread's share of the current job's tasks (index 0: the publishing
    /// thread, `i`: worker `i`), see [`Share`].
    shares: Box<[Share]>,
    /// Workers inside the current job (registered and not yet done).
    active_workers: AtomicUsize,
    /// A task panicked; the caller re-raises after the job.
    panicked: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    shutdown: AtomicBool,
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Held by the thread whose job is running.
    running: Mutex<()>,
}

thread_local! {
    /// Set while this thread runs pool tasks (nested `run` goes serial).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// Spins of a waiting caller before it starts yielding its core (a worker it waits for
/// may have been preempted by another process).
const CALLER_SPINS_BEFORE_YIELD: u32 = 1 << 12;

impl ThreadPool {
    /// A pool of `threads` compute threads (the caller and `threads - 1` workers).
    pub fn new(threads: usize) -> std::io::Result<ThreadPool> {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: Mutex::new(None),
            wake: Condvar::new(),
            shares: (0..threads.max(1)).map(|_| Share::default()).collect(),
            active_workers: AtomicUsize::new(0),
            panicked: Mutex::new(None),
            shutdown: AtomicBool::new(false),
        });
        let mut workers = Vec::new();
        for i in 1..threads.max(1) {
            let s = Arc::clone(&shared);
            let index = i as u32;
            workers.push(
                std::thread::Builder::new().name(format!("loupe-worker-{i}")).spawn(move || worker_loop(&s, index))?,
            );
        }
        Ok(ThreadPool { shared, workers, running: Mutex::new(()) })
    }

    /// Compute threads, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `body(i)` for every `i` in `0..n_tasks`, spread over the pool, and returns
    /// when all have finished. A panic in a task is re-raised here.
    ///
    /// The caller claims tasks too and never waits for a worker that has not started:
    /// once every task is claimed the job is closed, and a worker that wakes after
    /// that skips it. So a machine busy with other processes slows a job down to the
    /// caller's own speed, never to a scheduler tick per job.
    pub fn run(&self, n_tasks: usize, body: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if n_tasks > MAX_TASKS {
            for start in (0..n_tasks).step_by(MAX_TASKS) {
                let len = MAX_TASKS.min(n_tasks - start);
                self.run(len, &|i| body(start + i));
            }
            return;
        }
        let serial = n_tasks == 1 || self.workers.is_empty() || IN_TASK.with(Cell::get);
        let guard = if serial { None } else { self.running.try_lock().ok() };
        let Some(_guard) = guard else {
            (0..n_tasks).for_each(body);
            return;
        };
        let s = &*self.shared;
        // SAFETY: erases the borrow's lifetime; the job is closed and every worker that
        // entered it has left (active_workers == 0) before this call returns.
        let body_static: *const (dyn Fn(usize) + Sync) =
            unsafe { std::mem::transmute(body as *const (dyn Fn(usize) + Sync)) };
        let t = s.shares.len();
        for (i, share) in s.shares.iter().enumerate() {
            share.set(i * n_tasks / t, (i + 1) * n_tasks / t);
        }
        let open_state = {
            let mut job = s.job.lock().unwrap_or_else(|e| e.into_inner());
            *job = Some(JobRef { body: body_static });
            let open = (s.state.load(Ordering::SeqCst) | 1) + 1;
            s.state.store(open, Ordering::SeqCst);
            open
        };
        s.wake.notify_all();
        IN_TASK.with(|t| t.set(true));
        let mine = catch_unwind(AssertUnwindSafe(|| claim_tasks(s, body, 0)));
        IN_TASK.with(|t| t.set(false));
        s.state.store(open_state | 1, Ordering::SeqCst);
        let mut spins = 0u32;
        while s.active_workers.load(Ordering::SeqCst) != 0 {
            spins = spins.saturating_add(1);
            if spins < CALLER_SPINS_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if let Some(p) = s.panicked.lock().unwrap_or_else(|e| e.into_inner()).take() {
            resume_unwind(p);
        }
    }

    /// [`ThreadPool::run`] for fallible tasks: the first error found is returned;
    /// tasks already started still run to completion.
    pub fn try_run<E: Send>(&self, n_tasks: usize, body: &(dyn Fn(usize) -> Result<(), E> + Sync)) -> Result<(), E> {
        let first_error: Mutex<Option<E>> = Mutex::new(None);
        self.run(n_tasks, &|i| {
            if let Err(e) = body(i) {
                let mut slot = first_error.lock().unwrap_or_else(|e| e.into_inner());
                if slot.is_none() {
                    *slot = Some(e);
                }
            }
        });
        match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _job = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
            let next = (self.shared.state.load(Ordering::SeqCst) | 1) + 2;
            self.shared.state.store(next, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// One thread's share of a job: the unclaimed task indices `front..back`, packed in one
/// word (`front` low, `back` high) so the owner (taking `front`) and a thief (taking
/// `back - 1`) race through one compare-and-swap.
#[derive(Default)]
struct Share(AtomicU64);

impl Share {
    /// Only while no job is open (the publisher, before publishing).
    fn set(&self, front: usize, back: usize) {
        self.0.store(pack(front, back), Ordering::SeqCst);
    }

    /// Takes the first unclaimed task (`steal`: the last one), if any is left.
    fn take(&self, steal: bool) -> Option<usize> {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let (front, back) = (cur & 0xFFFF_FFFF, cur >> 32);
            if front >= back {
                return None;
            }
            let (next, task) = if steal {
                (pack(front as usize, back as usize - 1), back - 1)
            } else {
                (pack(front as usize + 1, back as usize), front)
            };
            match self.0.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(task as usize),
                Err(now) => cur = now,
            }
        }
    }
}

/// Task indices fit 32 bits: `run` splits larger jobs (see [`MAX_TASKS`]).
fn pack(front: usize, back: usize) -> u64 {
    front as u64 | (back as u64) << 32
}

/// Most tasks of one published job; [`ThreadPool::run`] runs a larger job as several.
const MAX_TASKS: usize = u32::MAX as usize;

/// Runs the tasks of thread `me`'s share from its front, then steals the others' from
/// their backs until every share is empty.
fn claim_tasks(s: &Shared, body: &(dyn Fn(usize) + Sync), me: usize) {
    let t = s.shares.len();
    let me = me % t;
    while let Some(i) = s.shares[me].take(false) {
        body(i);
    }
    for k in 1..t {
        let victim = &s.shares[(me + k) % t];
        while let Some(i) = victim.take(true) {
            body(i);
        }
    }
}

fn worker_loop(s: &Shared, index: u32) {
    IN_TASK.with(|t| t.set(true));
    // Generation 0 is the state before any job: a worker that starts after jobs (or
    // the shutdown) were published still sees them as new.
    let mut seen = 0u64;
    loop {
        // Poll for a new generation, then sleep.
        let spin_until = Instant::now() + SPIN;
        let mut polls = 0u32;
        let mut state = s.state.load(Ordering::Acquire);
        while state >> 1 == seen {
            std::hint::spin_loop();
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(256) && Instant::now() >= spin_until {
                let mut job = s.job.lock().unwrap_or_else(|e| e.into_inner());
                while s.state.load(Ordering::SeqCst) >> 1 == seen {
                    job = s.wake.wait(job).unwrap_or_else(|e| e.into_inner());
                }
                drop(job);
            }
            state = s.state.load(Ordering::Acquire);
        }
        seen = state >> 1;
        if s.shutdown.load(Ordering::SeqCst) {
            return;
        }
        if state & 1 == 1 {
            continue; // every task was claimed before this worker woke
        }
        // Register, then confirm the job is still open: the caller closes it before it
        // reads active_workers, so either it sees this worker or this worker sees the
        // close (both sides use SeqCst).
        s.active_workers.fetch_add(1, Ordering::SeqCst);
        if s.state.load(Ordering::SeqCst) == state {
            let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(job) = job {
                // SAFETY: the publisher keeps `body` alive until active_workers is 0,
                // and this worker is counted until the fetch_sub below.
                let body = unsafe { &*job.body };
                let traced =
                    TRACING.load(Ordering::Relaxed).then(|| (trace_now(), TRACE_LABEL.load(Ordering::Relaxed)));
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| claim_tasks(s, body, index as usize))) {
                    let mut slot = s.panicked.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(p);
                }
                if let Some((start_ns, label)) = traced {
                    record_span(TaskSpan { thread: index, label, start_ns, end_ns: trace_now() });
                }
            }
        }
        s.active_workers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Job tracing for the op profiler (`loupe_graph::profile`): while on, each worker records
/// the span of its share of each job, labelled with what the publisher set. Off, it costs a
/// worker one relaxed load per job.
static TRACING: AtomicBool = AtomicBool::new(false);
static TRACE_LABEL: AtomicU32 = AtomicU32::new(u32::MAX);
static SPANS: Mutex<Vec<TaskSpan>> = Mutex::new(Vec::new());
/// Most spans kept between two [`take_spans`] calls (the profiler drains them every step).
const MAX_SPANS: usize = 1 << 20;

/// One worker's share of one job, in nanoseconds since [`trace_epoch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSpan {
    /// The worker (1 ..= threads - 1; the publishing thread is 0 and times itself).
    pub thread: u32,
    /// The label set with [`set_trace_label`] when the job ran.
    pub label: u32,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The zero of trace times: the first call.
pub fn trace_epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since [`trace_epoch`].
pub fn trace_now() -> u64 {
    trace_epoch().elapsed().as_nanos() as u64
}

/// Turns job tracing on or off (process-wide: the pool is).
pub fn set_tracing(on: bool) {
    trace_epoch();
    TRACING.store(on, Ordering::Relaxed);
}

/// Labels the jobs published from now on (the profiler uses node indices).
pub fn set_trace_label(label: u32) {
    TRACE_LABEL.store(label, Ordering::Relaxed);
}

fn record_span(span: TaskSpan) {
    let mut v = SPANS.lock().unwrap_or_else(|e| e.into_inner());
    if v.len() < MAX_SPANS {
        v.push(span);
    }
}

/// The spans recorded since the last call.
pub fn take_spans() -> Vec<TaskSpan> {
    std::mem::take(&mut *SPANS.lock().unwrap_or_else(|e| e.into_inner()))
}

static GLOBAL: OnceLock<ThreadPool> = OnceLock::new();

/// Error from [`init_global`].
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("the compute pool is already running with {running} threads; it cannot be resized to {requested}")]
    AlreadyStarted { running: usize, requested: usize },
    #[error("cannot start {threads} compute threads: {source}")]
    Spawn { threads: usize, source: std::io::Error },
}

/// Starts the process-wide pool with `threads` compute threads. Call once, before the
/// first kernel runs; later calls with the same size are no-ops.
pub fn init_global(threads: usize) -> Result<(), PoolError> {
    let threads = threads.max(1);
    if let Some(p) = GLOBAL.get() {
        return if p.threads() == threads {
            Ok(())
        } else {
            Err(PoolError::AlreadyStarted { running: p.threads(), requested: threads })
        };
    }
    let pool = ThreadPool::new(threads).map_err(|source| PoolError::Spawn { threads, source })?;
    let _ = GLOBAL.set(pool);
    match GLOBAL.get() {
        Some(p) if p.threads() == threads => Ok(()),
        Some(p) => Err(PoolError::AlreadyStarted { running: p.threads(), requested: threads }),
        None => Ok(()),
    }
}

/// The process-wide pool; started with one thread per available core if
/// [`init_global`] was not called first.
pub fn global() -> &'static ThreadPool {
    GLOBAL.get_or_init(|| {
        let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        ThreadPool::new(n).unwrap_or_else(|_| ThreadPool::new(1).expect("a pool without workers spawns nothing"))
    })
}

/// Compute threads of the global pool.
pub fn threads() -> usize {
    global().threads()
}

/// Runs `f` with every pool job it starts executed serially on this thread (tests
/// comparing threaded and single-threaded results, bisecting a threading bug).
pub fn run_serially<R>(f: impl FnOnce() -> R) -> R {
    let was = IN_TASK.with(|t| t.replace(true));
    let r = f();
    IN_TASK.with(|t| t.set(was));
    r
}

/// Runs `body(i)` for `i` in `0..n_tasks` on the global pool.
pub fn run(n_tasks: usize, body: &(dyn Fn(usize) + Sync)) {
    global().run(n_tasks, body)
}

/// [`run`] for fallible tasks.
pub fn try_run<E: Send>(n_tasks: usize, body: &(dyn Fn(usize) -> Result<(), E> + Sync)) -> Result<(), E> {
    global().try_run(n_tasks, body)
}

/// An output pointer shared by pool tasks that write disjoint elements (see `run`,
/// `linear::matmul_wq`, attention).
pub(crate) struct OutPtr<T = f32>(pub(crate) *mut T);

impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for OutPtr<T> {}
// SAFETY: tasks write disjoint elements through it (see `run`).
unsafe impl<T: Send> Send for OutPtr<T> {}
unsafe impl<T: Send> Sync for OutPtr<T> {}

impl<T> OutPtr<T> {
    // A method (not field access) so closures capture the whole `Sync` wrapper.
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_exactly_once() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads).unwrap();
            for n in [0, 1, 2, 7, 1000] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "threads {threads} n {n}");
            }
        }
    }

    /// A thread takes its own share front to back (so it walks contiguous rows) and then
    /// steals from the back of the others'; whoever runs which task, each runs once.
    #[test]
    fn each_thread_walks_its_own_share_in_order_then_steals_from_the_back() {
        let pool = ThreadPool::new(2).unwrap();
        let n = 64;
        for _ in 0..200 {
            let order: Mutex<Vec<(std::thread::ThreadId, usize)>> = Mutex::new(Vec::new());
            pool.run(n, &|i| {
                order.lock().unwrap().push((std::thread::current().id(), i));
                std::hint::black_box((0..200).sum::<u64>());
            });
            let order = order.into_inner().unwrap();
            let mut seen = vec![0u8; n];
            for &(_, i) in &order {
                seen[i] += 1;
            }
            assert!(seen.iter().all(|&c| c == 1), "a task ran twice or never: {seen:?}");
            let caller = std::thread::current().id();
            let mine: Vec<usize> = order.iter().filter(|(t, _)| *t == caller).map(|&(_, i)| i).collect();
            // The caller's share is 0..n/2: taken in order from 0, then any steals from n - 1 down.
            let own = mine.iter().take_while(|&&i| i < n / 2).count();
            assert!(mine[..own].iter().copied().eq(0..own), "caller's own tasks out of order: {mine:?}");
            assert!(
                mine[own..].windows(2).all(|w| w[0] > w[1]) && mine[own..].iter().all(|&i| i >= n / 2),
                "caller's steals not from the back: {mine:?}"
            );
            let theirs: Vec<usize> = order.iter().filter(|(t, _)| *t != caller).map(|&(_, i)| i).collect();
            let own = theirs.iter().take_while(|&&i| i >= n / 2).count();
            assert!(
                theirs[..own].iter().copied().eq(n / 2..n / 2 + own),
                "worker's own tasks out of order: {theirs:?}"
            );
            assert!(theirs[own..].windows(2).all(|w| w[0] > w[1]), "worker's steals not from the back: {theirs:?}");
        }
    }

    #[test]
    fn a_share_hands_out_each_index_once_under_contention() {
        let share = Share::default();
        share.set(0, 100_000);
        let taken: Vec<Vec<usize>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|t| {
                    sc.spawn({
                        let share = &share;
                        move || std::iter::from_fn(|| share.take(t % 2 == 1)).collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<usize> = taken.concat();
        all.sort_unstable();
        assert!(all.iter().copied().eq(0..100_000));
        assert_eq!(share.take(false), None);
        assert_eq!(share.take(true), None);
    }

    #[test]
    fn tracing_records_each_workers_share_under_the_label_set() {
        // Tracing and the label are process-wide: while this test runs, the workers of other
        // tests' pools record spans under this label too (short ones, and with thread
        // indices of pools of any size). Ours is the share of this 2-thread pool's only
        // worker (thread 1) that slept 2 ms.
        const LABEL: u32 = 0x7ACE;
        let pool = ThreadPool::new(2).unwrap();
        set_tracing(true);
        set_trace_label(LABEL);
        let ours = |s: &TaskSpan| s.label == LABEL && s.thread == 1 && s.end_ns >= s.start_ns + 1_000_000;
        let mut found = None;
        // A worker that wakes after the caller claimed both tasks skips the job: retry.
        for _ in 0..200 {
            pool.run(2, &|_| std::thread::sleep(Duration::from_millis(2)));
            found = take_spans().into_iter().find(ours);
            if found.is_some() {
                break;
            }
        }
        set_tracing(false);
        found.expect("no span of this pool's worker (thread 1, at least 1 ms of its 2 ms share) in 200 jobs");
    }

    #[test]
    fn many_short_jobs_back_to_back() {
        let pool = ThreadPool::new(2).unwrap();
        let total = AtomicUsize::new(0);
        for _ in 0..20_000 {
            pool.run(4, &|i| {
                total.fetch_add(i, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 20_000 * 6);
    }

    #[test]
    fn workers_sleep_then_wake() {
        let pool = ThreadPool::new(2).unwrap();
        pool.run(2, &|_| {});
        std::thread::sleep(SPIN * 3);
        let count = AtomicUsize::new(0);
        pool.run(8, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn nested_and_concurrent_calls_do_not_deadlock() {
        let pool = Arc::new(ThreadPool::new(2).unwrap());
        let total = AtomicUsize::new(0);
        pool.run(4, &|_| {
            pool.run(3, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 12);
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let p = Arc::clone(&pool);
                std::thread::spawn(move || {
                    let c = AtomicUsize::new(0);
                    for _ in 0..500 {
                        p.run(5, &|_| {
                            c.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                    c.load(Ordering::Relaxed)
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), 2500);
        }
    }

    #[test]
    fn errors_and_panics_reach_the_caller() {
        let pool = ThreadPool::new(2).unwrap();
        let r = pool.try_run(10, &|i| if i == 7 { Err(i) } else { Ok(()) });
        assert_eq!(r, Err(7));
        let caught = catch_unwind(AssertUnwindSafe(|| {
            pool.run(10, &|i| {
                if i == 3 {
                    panic!("task 3");
                }
            })
        }));
        assert!(caught.is_err());
        // The pool still works afterwards.
        let count = AtomicUsize::new(0);
        pool.run(6, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 6);
    }
}
