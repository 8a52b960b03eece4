//! `LOUPE_DEBUG` in the CLI: resolving the options once from their sources (through
//! `loupe_runtime::debug_config`), the crash handler of `stack-trace-on-crash`, and the
//! error report of `stack-trace-on-error` and `source-tracebacks`. The resolved options are
//! passed to each command explicitly; nothing is installed process-wide.

use std::path::{Path, PathBuf};

use loupe_graph::debug::DebugOptions;
use loupe_graph::GraphError;
use loupe_runtime::debug_config;
use loupe_runtime::RuntimeError;

use crate::UsageError;

/// Resolves the options (`--debug` > environment > `./loupe.toml`), prints warnings for
/// unknown ones and acts on the process-level ones (backtraces, crash handlers).
pub fn configure(flags: &[String]) -> anyhow::Result<DebugOptions> {
    let resolved = debug_config::resolve_sources(Path::new("."), flags, Vec::new(), true)
        .map_err(|e| UsageError(e.to_string()))?;
    for w in &resolved.warnings {
        eprintln!("{w}");
    }
    let opts = resolved.options;
    if opts.stack_trace_on_error {
        // anyhow captures a backtrace where each error is created when this is set; set
        // before any thread starts.
        std::env::set_var("RUST_LIB_BACKTRACE", "1");
    }
    if opts.stack_trace_on_crash {
        crash::install();
    }
    Ok(opts)
}

/// The error report: one line always; with `stack-trace-on-error` the whole chain and a
/// backtrace; with `source-tracebacks` the model code that built the failing op.
pub fn report_error(e: &anyhow::Error, one_line: &str, opts: &DebugOptions) {
    eprintln!("loupe: error: {one_line}");
    if opts.source_tracebacks {
        if let Some(loc) = graph_error(e).and_then(GraphError::location) {
            eprintln!("source traceback (model code that built the op):");
            eprintln!("  {loc}");
            if let Some(line) = source_line(loc) {
                eprintln!("    {line}");
            }
        }
    }
    if opts.stack_trace_on_error {
        eprintln!("error chain:");
        for (i, cause) in e.chain().enumerate() {
            eprintln!("  {i}: {cause}");
        }
        let bt = e.backtrace();
        if bt.status() == std::backtrace::BacktraceStatus::Captured {
            eprintln!("stack backtrace (where the error was created):\n{bt}");
        } else {
            eprintln!(
                "stack backtrace (where the error was reported):\n{}",
                std::backtrace::Backtrace::force_capture()
            );
        }
    }
}

fn graph_error(e: &anyhow::Error) -> Option<&GraphError> {
    e.chain().find_map(|c| {
        c.downcast_ref::<GraphError>().or_else(|| {
            c.downcast_ref::<RuntimeError>().and_then(|r| if let RuntimeError::Graph(g) = r { Some(g) } else { None })
        })
    })
}

/// The text of `file:line:col`, read from the working directory or the source tree loupe
/// was built from.
fn source_line(loc: &str) -> Option<String> {
    let mut parts = loc.rsplitn(3, ':');
    let (_col, line, file) = (parts.next()?, parts.next()?.parse::<usize>().ok()?, parts.next()?);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(file).or_else(|_| std::fs::read_to_string(root.join(file))).ok()?;
    text.lines().nth(line.checked_sub(1)?).map(|l| format!("{line} | {}", l.trim()))
}

/// `stack-trace-on-crash`: handlers for fatal signals that print the crashing thread's
/// backtrace and then die by the same signal.
pub mod crash {
    use std::sync::Once;

    const SIGNALS: [(libc::c_int, &str); 5] = [
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGABRT, "SIGABRT"),
    ];
    const MAX_FRAMES: usize = 64;
    static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    const ALT_STACK_BYTES: usize = 256 * 1024;

    /// Installs the handlers once, on an alternate stack (a stack overflow is a SIGSEGV
    /// with no stack left to run a handler on).
    pub fn install() {
        static ONCE: Once = Once::new();
        INSTALLED.store(true, std::sync::atomic::Ordering::SeqCst);
        ONCE.call_once(|| unsafe {
            // Leaked on purpose: the handler may run until the process ends.
            let stack = Box::leak(vec![0u8; ALT_STACK_BYTES].into_boxed_slice());
            let ss = libc::stack_t { ss_sp: stack.as_mut_ptr().cast(), ss_flags: 0, ss_size: ALT_STACK_BYTES };
            libc::sigaltstack(&ss, std::ptr::null_mut());
            for (sig, _) in SIGNALS {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = handler as *const () as usize;
                // RESETHAND: a second fault inside the handler kills the process with the
                // default action instead of looping; NODEFER lets the re-raise land at once.
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESETHAND | libc::SA_NODEFER;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        });
    }

    /// A fixed buffer for formatting without allocating.
    struct Buf {
        bytes: [u8; 512],
        len: usize,
    }

    impl std::fmt::Write for Buf {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let n = s.len().min(self.bytes.len() - self.len);
            self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
            self.len += n;
            Ok(())
        }
    }

    fn write_fd(bytes: &[u8]) {
        unsafe {
            libc::write(2, bytes.as_ptr().cast(), bytes.len());
        }
    }

    macro_rules! say {
        ($($arg:tt)*) => {{
            let mut b = Buf { bytes: [0; 512], len: 0 };
            let _ = std::fmt::Write::write_fmt(&mut b, format_args!($($arg)*));
            write_fd(&b.bytes[..b.len]);
        }};
    }

    extern "C" fn handler(sig: libc::c_int, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        let name = SIGNALS.iter().find(|(s, _)| *s == sig).map(|(_, n)| *n).unwrap_or("signal");
        // Part 1, async-signal-safe: write(2) and a frame walk into a stack array, no
        // allocation, no locks of ours.
        say!("loupe: fatal signal {name} ({sig}); backtrace of the crashing thread (stack-trace-on-crash):\n");
        let mut ips = [0usize; MAX_FRAMES];
        let mut n = 0;
        unsafe {
            backtrace::trace_unsynchronized(|frame| {
                ips[n] = frame.ip() as usize;
                n += 1;
                n < MAX_FRAMES
            });
        }
        for (i, ip) in ips[..n].iter().enumerate() {
            say!("  #{i:<2} {ip:#018x}\n");
        }
        // Part 2, NOT async-signal-safe (the symbolizer allocates and reads debug info):
        // usually fine for a crash in loupe's own code; it could hang if the crash happened
        // inside the allocator. The raw frames above are already out.
        say!("symbols (best effort):\n");
        for (i, ip) in ips[..n].iter().enumerate() {
            let mut found = false;
            unsafe {
                backtrace::resolve_unsynchronized(*ip as *mut libc::c_void, |sym| {
                    if found {
                        return;
                    }
                    found = true;
                    let name = sym.name().map(|s| s.to_string()).unwrap_or_else(|| "?".into());
                    match (sym.filename(), sym.lineno()) {
                        (Some(f), Some(l)) => say!("  #{i:<2} {name}\n             at {}:{l}\n", f.display()),
                        _ => say!("  #{i:<2} {name}\n"),
                    }
                });
            }
            if !found {
                say!("  #{i:<2} ?\n");
            }
        }
        // Die by the same signal, with its default action (core dump, exit status).
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    /// `loupe __crash KIND`: a deliberate crash, for testing the handler.
    pub fn crash(kind: &str) -> anyhow::Result<()> {
        match kind {
            "segv" => unsafe {
                let p = std::hint::black_box(0usize) as *mut u8;
                std::ptr::write_volatile(p, 1);
            },
            "abort" => std::process::abort(),
            #[cfg(target_arch = "x86_64")]
            "ill" => unsafe { std::arch::asm!("ud2") },
            #[cfg(target_arch = "x86_64")]
            "fpe" => unsafe {
                // Integer division by zero in the CPU (Rust's `/` would panic first).
                std::arch::asm!("xor edx, edx", "xor eax, eax", "xor ecx, ecx", "div ecx", out("eax") _, out("edx") _, out("ecx") _);
            },
            // A real SIGBUS needs a truncated mapping; raising it exercises the same handler.
            // Rust's runtime handles SIGBUS itself (stack-overflow detection) and ignores a
            // raised one, so without our handler the default action is restored first.
            "bus" => unsafe {
                if !INSTALLED.load(std::sync::atomic::Ordering::SeqCst) {
                    libc::signal(libc::SIGBUS, libc::SIG_DFL);
                }
                libc::raise(libc::SIGBUS);
            },
            other => {
                return Err(
                    crate::UsageError(format!("__crash: unknown kind '{other}' (segv, abort, ill, fpe, bus)")).into()
                )
            }
        }
        Err(anyhow::anyhow!("__crash {kind}: the process survived"))
    }
}
