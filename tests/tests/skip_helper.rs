//! tests/support/skip.rs: outside CI a skip prints the line scripts/test
//! counts and lets the test return; under CI=true it fails the test.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/skip.rs"]
mod skip;

use std::process::Command;

const CHILD: &str = "TUTTI_SKIP_HELPER_CHILD";
const TEST: &str = "a_skip_prints_its_line_outside_ci_and_fails_under_ci";

/// Runs this very test again in a child process, as the child, with `CI` as given.
fn child(ci: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", TEST, "--test-threads=2"]).env(CHILD, "1");
    match ci {
        Some(v) => cmd.env("CI", v),
        None => cmd.env_remove("CI"),
    };
    cmd.output().unwrap()
}

#[test]
fn a_skip_prints_its_line_outside_ci_and_fails_under_ci() {
    if std::env::var_os(CHILD).is_some() {
        return skip::skip("the prerequisite of this child run is missing");
    }
    // Not CI: the child passes, and its SKIP line gets past libtest's capture.
    for ci in [None, Some("false"), Some("")] {
        let out = child(ci);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "CI={ci:?}: {stdout}");
        let want = format!("SKIP: skip_helper::{TEST}: the prerequisite of this child run is missing\n");
        assert!(stdout.contains(&want), "CI={ci:?}: no SKIP line in {stdout}");
    }
    // CI: the same skip is a failure naming the reason, and prints no SKIP line.
    for ci in ["true", "1"] {
        let out = child(Some(ci));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "CI={ci}: a skip must fail: {stdout}");
        assert!(
            stdout.contains("CI=true forbids skipping: the prerequisite of this child run is missing"),
            "{stdout}"
        );
        assert!(!stdout.contains("SKIP: "), "{stdout}");
    }
}
