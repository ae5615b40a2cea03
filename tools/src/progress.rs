//! The progress bars of every subcommand: on stderr, hidden when the caller asks for quiet
//! (or JSON) output or when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

fn bar(total: u64, what: &str, quiet: bool, template: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if quiet || !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// A bar counting bytes, with the rate and the time left.
pub fn byte_bar(total: u64, what: &str, quiet: bool) -> ProgressBar {
    bar(total, what, quiet, "{msg:>12} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
}

/// A bar counting steps of work (runs, command batches).
pub fn count_bar(total: u64, what: &str, quiet: bool) -> ProgressBar {
    bar(total, what, quiet, "{msg:>12} [{bar:40}] {pos}/{len} ({elapsed}, {eta})")
}
