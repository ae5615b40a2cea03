//! The one way a test skips for a missing prerequisite (a tool, a library, a
//! kernel feature). Test crates include this file by path:
//!
//! ```ignore
//! #[path = "../../tests/support/skip.rs"]
//! mod skip;
//! ...
//! if !have("cc") {
//!     return skip::skip("no system C compiler (cc)");
//! }
//! ```
//!
//! Outside CI the test returns after one line on standard output,
//! `SKIP: <crate>::<test>: <reason>`, which `scripts/test` counts and lists
//! (libtest itself reports the test as passed). Under `CI=true` (or `CI=1`)
//! a missing prerequisite is a failure: the call panics with the reason.

// Each including crate uses a subset of these functions.
#![allow(dead_code)]

use std::fmt::Display;
use std::io::Write;

/// Whether this run is CI, where nothing may skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The running test as `crate::module::test` (libtest names each test's thread after it).
pub fn test_name() -> String {
    let thread = std::thread::current();
    format!("{}::{}", env!("CARGO_CRATE_NAME"), thread.name().unwrap_or("<unnamed test>"))
}

/// Skips the calling test for `reason`, or fails it under CI. The caller
/// returns right after (`return skip::skip(..)`).
pub fn skip(reason: impl Display) {
    let test = test_name();
    if in_ci() {
        panic!("{test}: a prerequisite is missing and CI=true forbids skipping: {reason}");
    }
    // Straight to the file descriptor, past libtest's output capture, so the
    // line shows without --nocapture too. One write keeps the line whole.
    let line = format!("SKIP: {test}: {reason}\n");
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}
