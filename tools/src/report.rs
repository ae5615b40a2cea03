//! Output helpers shared by the subcommands: JSON reports and progress bars.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Prints `value` as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// A byte-progress bar on stderr, hidden when `quiet` or when stderr is not a terminal.
pub fn byte_bar(total: u64, what: &str, quiet: bool) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if quiet || !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Formats a byte count with binary units.
pub fn bytes(n: u64) -> String {
    indicatif::BinaryBytes(n).to_string()
}
