//! `tutti serve`: run tuttid, the process that owns the drives and the pool
//! and serves engine processes (clients) on a Unix socket.
//!
//! As a service: `--config FILE` takes the flags from a TOML file ([`config`]), `--metrics ADDR`
//! serves Prometheus metrics ([`metrics`]), readiness and stopping are told to systemd
//! ([`notify`]), and SIGTERM stops it cleanly (see [`run`]).

pub mod config;
mod exposition;
pub mod metrics;
mod notify;

use crate::emu::PoolDriveArgs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_daemon::{Daemon, DaemonConfig, DriveSource, SocketMode};
use tutti_objstore::{OpenMode, PoolOptions};

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum OpenFlag {
    /// Format the drives as a new, empty pool.
    Create,
    /// Open the pool the drives hold; anything else is an error.
    Open,
    /// Open the pool, or format the drives if every one is blank.
    OpenOrCreate,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Take the flags from this TOML file (see docs/operating.md); a flag given on the
    /// command line, or through its environment variable, wins over the file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Check the flags (and the --config file), print the settings they make as JSON, and
    /// exit without starting.
    #[arg(long)]
    pub check_config: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464; port 0 picks one,
    /// printed at start).
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// The Unix socket clients connect to.
    #[arg(long, default_value = "/run/tutti/tuttid.sock", env = "TUTTI_SOCKET")]
    pub socket: PathBuf,
    /// Let members of this group (name or gid) connect too: the socket is 0660 with
    /// that group. Without it the socket is 0600: only this user (and root) may connect.
    #[arg(long)]
    pub group: Option<String>,
    #[command(flatten)]
    pub pool_drives: PoolDriveArgs,
    #[arg(long, value_enum, default_value_t = OpenFlag::OpenOrCreate)]
    pub open: OpenFlag,
    #[command(flatten)]
    pub geometry: crate::geometry_flags::GeometryArgs,
    /// Deadline of every admin and metadata command, in milliseconds.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub io_timeout_ms: u64,
    /// Print one JSON line when serving (socket, pid, pool) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit cleanly (socket removed) once the daemon has had at least one client and then
    /// none for this many seconds; if no client ever comes, after max(this, 30) seconds.
    /// For daemons started on demand (the vLLM connector's `daemon: "auto"`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub idle_exit_s: Option<u64>,
}

/// When an idle daemon should exit (`--idle-exit-s`).
#[derive(Debug)]
struct IdleExit {
    after: Duration,
    /// Grace for a daemon no client ever reached.
    first: Duration,
    had_client: bool,
    idle_since: Instant,
    /// Clients served as of the last tick: a client that came and went
    /// between two ticks still counts as activity.
    served: u64,
}

impl IdleExit {
    fn new(secs: u64, now: Instant) -> IdleExit {
        let after = Duration::from_secs(secs);
        IdleExit {
            after,
            first: after.max(Duration::from_secs(30)),
            had_client: false,
            idle_since: now,
            served: 0,
        }
    }

    /// Feeds the current client count and how many clients were served so
    /// far; true when the daemon should exit.
    fn tick(&mut self, clients: usize, served: u64, now: Instant) -> bool {
        if clients > 0 || served != self.served {
            self.had_client |= clients > 0 || served > 0;
            self.served = served;
            self.idle_since = now;
            return false;
        }
        let limit = if self.had_client { self.after } else { self.first };
        now.duration_since(self.idle_since) >= limit
    }
}

fn group_id(name: &str) -> anyhow::Result<u32> {
    if let Ok(n) = name.parse::<u32>() {
        return Ok(n);
    }
    let groups = std::fs::read_to_string("/etc/group")
        .map_err(|e| anyhow::anyhow!("--group {name}: cannot read /etc/group: {e}"))?;
    groups
        .lines()
        .find_map(|l| {
            let mut f = l.split(':');
            (f.next() == Some(name)).then(|| f.nth(1).and_then(|g| g.parse().ok())).flatten()
        })
        .ok_or_else(|| anyhow::anyhow!("--group {name}: no such group"))
}

/// `--check-config`: the settings the flags make, checked as far as it goes without touching
/// a drive, a file or the socket.
fn check_config(
    args: &Args,
    geometry: &tutti_objstore::Geometry,
    vfio: &[(tutti_driver::pci::Bdf, Vec<u32>)],
) -> anyhow::Result<()> {
    let drives = if vfio.is_empty() {
        let e = &args.pool_drives.emu;
        e.cost_model()?;
        serde_json::json!({
            "emulated": args.pool_drives.emulated,
            "dir": e.dir,
            "capacity_mib": e.capacity_mib,
            "lba_size": e.lba_size,
        })
    } else {
        let list: Vec<String> = vfio
            .iter()
            .flat_map(|(b, ns)| {
                if ns.is_empty() {
                    vec![b.to_string()]
                } else {
                    ns.iter().map(|n| format!("{b}/{n}")).collect()
                }
            })
            .collect();
        serde_json::json!({ "vfio": list, "noiommu": args.pool_drives.noiommu })
    };
    let out = serde_json::json!({
        "socket": args.socket,
        "group": args.group,
        "metrics": args.metrics,
        "drives": drives,
        "open": format!("{:?}", args.open),
        "geometry": geometry,
        "serve_flags": geometry.serve_flags(),
        "io_timeout_ms": args.io_timeout_ms,
        "idle_exit_s": args.idle_exit_s,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let geometry = args.geometry.geometry()?;
    let mode = match &args.group {
        Some(g) => SocketMode::Group(group_id(g)?),
        None => SocketMode::Owner,
    };
    if args.check_config {
        return check_config(args, &geometry, &super::identify::group_drives(&args.pool_drives.drives)?);
    }
    let drives = if args.pool_drives.drives.is_empty() {
        let list = (0..args.pool_drives.emulated as usize)
            .map(|i| args.pool_drives.emu.config(i))
            .collect::<anyhow::Result<Vec<_>>>()?;
        DriveSource::Emulated(list)
    } else {
        DriveSource::Vfio {
            drives: super::identify::group_drives(&args.pool_drives.drives)?,
            noiommu: args.pool_drives.noiommu,
        }
    };
    let open = match args.open {
        OpenFlag::Create => OpenMode::Create,
        OpenFlag::Open => OpenMode::Open,
        OpenFlag::OpenOrCreate => OpenMode::OpenOrCreate,
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGINT, libc::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| anyhow::anyhow!("installing the handler of signal {sig}: {e}"))?;
    }
    let daemon = Daemon::start(DaemonConfig {
        socket: args.socket.clone(),
        mode,
        drives,
        pool: PoolOptions::new(geometry, open),
        io_timeout: Duration::from_millis(args.io_timeout_ms),
    })?;
    let metrics = match args.metrics {
        Some(addr) => Some(metrics::MetricsServer::start(addr, daemon.metrics_source())?),
        None => None,
    };
    let status = daemon.status();
    // The pool's own geometry (what its drives were formatted for; the flags' when created).
    let geometry = status.geometry.unwrap_or(geometry);
    let metrics_url = metrics.as_ref().map(|m| format!("http://{}/metrics", m.addr()));
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "serving": status.socket, "pid": status.pid, "pool": status.pool, "geometry": geometry,
                "serve_flags": geometry.serve_flags(), "metrics": metrics_url,
            })
        );
    } else {
        println!(
            "tuttid {} serving pool {} on {} (pid {})",
            env!("CARGO_PKG_VERSION"),
            status.pool,
            status.socket,
            status.pid
        );
        println!("geometry: {geometry} (tutti serve {})", geometry.serve_flags());
        if let Some(url) = &metrics_url {
            println!("metrics: {url}");
        }
    }
    notify::notify(&format!("READY=1\nSTATUS=serving pool {} on {}", status.pool, status.socket));
    let mut idle = args.idle_exit_s.map(|s| IdleExit::new(s, Instant::now()));
    // Bounded waits: the loop checks the stop flag and the accept thread every 100 ms,
    // the client count (--idle-exit-s) every 500 ms.
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if daemon.is_finished() {
            break;
        }
        round += 1;
        if let Some(idle) = idle.as_mut().filter(|_| round.is_multiple_of(5)) {
            let status = daemon.status();
            if idle.tick(status.clients.len(), status.clients_served, Instant::now()) {
                tracing::info!(idle_s = idle.after.as_secs(), "tuttid: no clients; exiting (--idle-exit-s)");
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    notify::notify("STOPPING=1");
    tracing::info!("tuttid stopping: clients are disconnected, their uncommitted stores given up");
    // Scrapes hold the daemon's state: they stop first.
    if let Some(m) = metrics {
        m.stop();
    }
    daemon.stop()?;
    tracing::info!("tuttid stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_exit_waits_for_a_first_client_then_for_the_quiet_period() {
        let t0 = Instant::now();
        let s = |n| t0 + Duration::from_secs(n);
        let mut idle = IdleExit::new(5, t0);
        assert!(!idle.tick(0, 0, s(10)), "no client yet: the 30 s grace applies");
        assert!(!idle.tick(2, 2, s(11)));
        assert!(!idle.tick(0, 2, s(12)));
        assert!(!idle.tick(1, 3, s(15)), "a client came back: the clock restarts");
        assert!(!idle.tick(0, 3, s(19)));
        assert!(idle.tick(0, 3, s(20)));
        let mut never = IdleExit::new(5, t0);
        assert!(!never.tick(0, 0, s(29)));
        assert!(never.tick(0, 0, s(30)));
        // A client that came and went between two ticks counts: the short limit applies after it.
        let mut brief = IdleExit::new(5, t0);
        assert!(!brief.tick(0, 1, s(1)), "a client was served since the last tick");
        assert!(!brief.tick(0, 1, s(5)));
        assert!(brief.tick(0, 1, s(6)), "then 5 s without clients is enough");
    }
}
