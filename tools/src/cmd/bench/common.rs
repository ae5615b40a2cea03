//! What every `tutti bench` shares: the output flags, the host a run measured, sizes as
//! flags and labels, and the process CPU clock the CPU-per-GB columns come from.

use anyhow::bail;
use std::path::PathBuf;

/// Output flags every benchmark takes: `#[command(flatten)] pub out: Output`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Output {
    /// Print the report as JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write an SVG plot of the main curve to this path.
    #[arg(long, value_name = "PATH")]
    pub svg: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

impl Output {
    /// Prints `report` as JSON when `--json`, else `text`; writes `svg()` to `--svg` if given.
    pub fn emit<T: serde::Serialize>(
        &self,
        report: &T,
        text: &str,
        svg: impl FnOnce() -> String,
    ) -> anyhow::Result<()> {
        if let Some(path) = &self.svg {
            std::fs::write(path, svg()).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
        }
        if self.json {
            crate::report::print_json(report)
        } else {
            print!("{text}");
            if let Some(path) = &self.svg {
                println!("plot written to {}", path.display());
            }
            Ok(())
        }
    }
}

/// Process CPU seconds per decimal gigabyte moved (0 when nothing moved): the column
/// every `tutti bench` report carries, so methods compare by their whole cost.
pub fn cpu_s_per_gb(cpu_s: f64, bytes: u64) -> f64 {
    if bytes == 0 {
        0.0
    } else {
        cpu_s / (bytes as f64 / 1e9)
    }
}

/// Parses a byte count with an optional binary unit: `4096`, `32K`, `32KiB`, `2M`, `60G`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size (e.g. 4096, 32K, 2M, 60G)"))?;
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (K, M, G, T: powers of 1024)")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("{s:?} is too large"))
}

/// A byte count as the benches print it: `4K`, `32K`, `2M`, `60G`, or bytes when not a whole unit.
pub fn size_label(n: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// The machine a run measured: figures from a loaded host are not comparable to a quiet one's.
#[derive(serde::Serialize, Clone, Debug)]
pub struct Host {
    pub cpus: usize,
    /// 1-minute load average when the run started (None where /proc/loadavg is absent).
    pub load_average: Option<f64>,
}

impl Host {
    pub fn now() -> Host {
        let load_average = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()));
        Host { cpus: std::thread::available_parallelism().map_or(1, |n| n.get()), load_average }
    }

    pub fn describe(&self) -> String {
        match self.load_average {
            Some(l) => format!("{} CPUs, load average {l:.1} at the start", self.cpus),
            None => format!("{} CPUs", self.cpus),
        }
    }
}

/// CPU time of the whole process, user and system, in nanoseconds (`getrusage(RUSAGE_SELF)`):
/// every thread, live or exited, so tutti's executor lanes and emulated controllers count.
pub fn process_cpu_ns() -> anyhow::Result<u64> {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        bail!("getrusage(RUSAGE_SELF): {}", std::io::Error::last_os_error());
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    Ok(ns(ru.ru_utime) + ns(ru.ru_stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units_and_print_back() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("32K"), Ok(32 << 10));
        assert_eq!(parse_size("32KiB"), Ok(32 << 10));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert_eq!(parse_size("60G"), Ok(60 << 30));
        assert!(parse_size("3X").unwrap_err().contains("unknown unit"));
        assert!(parse_size("K").is_err());
        assert!(parse_size("99999999999T").unwrap_err().contains("too large"));
        assert_eq!(size_label(32 << 10), "32K");
        assert_eq!(size_label(60 << 30), "60G");
        assert_eq!(size_label(1536), "1536");
    }
}
