//! Output helpers shared by the subcommands: JSON reports and byte counts (progress bars are
//! in `crate::progress`).

/// Prints `value` as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Formats a byte count with binary units.
pub fn bytes(n: u64) -> String {
    indicatif::BinaryBytes(n).to_string()
}
