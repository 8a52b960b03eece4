//! Runs the Python reference package's own unit tests (reference/tests) as part of the
//! one test command.

mod common;
use common::*;
use std::process::Command;

#[test]
#[ignore = "needs the Python reference stack (scripts/test installs it)"]
fn reference_package_unit_tests_pass() {
    require_python_reference();
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "reference/tests"])
        .current_dir(repo_root())
        .output()
        .expect("python3");
    assert!(out.status.success(), "python reference unit tests failed:\n{}\n{}", stdout(&out), stderr(&out));
}
