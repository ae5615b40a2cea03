//! `tutti status`: what a running tuttid serves — its clients, their leases,
//! the pool's usage and what is in flight.

use std::path::PathBuf;
use std::time::Duration;
use tutti_daemon::remote::Client;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The daemon's Unix socket.
    #[arg(long, default_value = "/run/tutti/tuttid.sock", env = "TUTTI_SOCKET")]
    pub socket: PathBuf,
    /// How long to wait for the daemon, in milliseconds.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub timeout_ms: u64,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let client = Client::connect(&args.socket, "tutti status", Duration::from_millis(args.timeout_ms))?;
    let s = client.status()?;
    if args.json {
        return crate::report::print_json(&s);
    }
    let ix = &s.stats.index;
    println!("tuttid pid {} on {}, up {} s", s.pid, s.socket, s.uptime_s);
    println!(
        "pool {}: {} files, {} valid, {} free, {} being written, {} pinned, {} quarantined",
        s.pool, ix.files, ix.valid, ix.free, ix.reserved, ix.pinned, ix.quarantined
    );
    if let Some(g) = &s.geometry {
        println!("geometry: {g} (tutti serve {})", g.serve_flags());
    }
    println!("commits {}, journal appends {}", s.stats.files_committed, s.stats.journal_appends);
    let a = &s.arbitration;
    println!(
        "arbitration: {} metadata writes held the drives; {} stuck clients waited out, then skipped by {} of them",
        a.holds, a.stale_marks, a.stale_skips
    );
    if s.waiting_for_hello > 0 {
        println!(
            "{} connections have not said hello yet (closed at their hello deadline)",
            s.waiting_for_hello
        );
    }
    for c in &s.controllers {
        println!(
            "controller {}: {} I/O queue pairs granted, {} free; {} ranges of client memory mapped",
            c.name, c.granted_pairs, c.free_pairs, c.client_mappings
        );
    }
    // This command is a client too; it is left out of the list.
    let others: Vec<_> = s.clients.iter().filter(|c| c.id != client.id()).collect();
    println!("{} clients", others.len());
    for c in others {
        let queues: Vec<String> = c.queues.iter().map(|(d, q)| format!("{d}/q{q}")).collect();
        println!(
            "  #{} {} pid {} uid {}: {} s, {} requests, queues [{}], {} mappings ({} of device memory), {} pins, {} stores in flight, {} files loading",
            c.id,
            c.name,
            c.pid,
            c.uid,
            c.connected_s,
            c.requests,
            queues.join(" "),
            c.mappings,
            c.device_mappings,
            c.pins,
            c.reservations,
            c.loading_files
        );
        if let Some(st) = &c.stale {
            let since = std::time::SystemTime::now()
                .checked_sub(Duration::from_millis(st.unchanged_ms))
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            println!(
                "    STALE: its arbitration row has held I/O unchanged for {:.1} s (since unix time {since}); \
                 the other clients skip it{}",
                st.unchanged_ms as f64 / 1000.0,
                if st.skipped_by_holds { ", and so do tuttid's metadata writes" } else { "" }
            );
        }
    }
    Ok(())
}
