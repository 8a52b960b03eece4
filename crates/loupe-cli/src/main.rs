//! `loupe`: run, inspect and debug LLMs, and check them against a reference. The command
//! line lives in the `loupe_cli` library; see its docs.

fn main() -> std::process::ExitCode {
    loupe_cli::main()
}
