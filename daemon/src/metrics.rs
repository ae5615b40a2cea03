//! What tuttid counts for its metrics, and the snapshot it hands `tutti serve --metrics`.
//!
//! Two sources, kept apart in names and in the snapshot:
//! - **the daemon's own view** of the control path, which it serves for every client: requests
//!   by name and error replies by kind, lookups with the blocks they found and missed, the
//!   pool's index (files, pins, evictions), leases, its metadata holds on the arbitration board,
//!   and, for emulated drives, every command the drives executed (the controllers run in it);
//! - **the clients' data path**, which the daemon never sees (each client moves its own bytes on
//!   its own queue pairs): each client reports its cumulative counters with the calls that end
//!   its loads and stores ([`tutti_objstore::report`]); the daemon keeps each connected client's
//!   latest report and adds to a total what the clients that left reported last.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::proto::StatusReport;
use tutti_objstore::report::DataPathReport;
use tutti_objstore::Geometry;

/// Counters of the control path and the clients' reports.
#[derive(Default)]
pub(crate) struct Counters {
    requests: Mutex<BTreeMap<&'static str, u64>>,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    pub lookups: AtomicU64,
    pub lookup_hits: AtomicU64,
    pub lookup_misses: AtomicU64,
    pub load_references: AtomicU64,
    reports: Mutex<Reports>,
}

#[derive(Default)]
struct Reports {
    /// The latest report of each connected client that sent one.
    live: HashMap<u64, DataPathReport>,
    /// What the clients that left reported last (counters only), and counts of connected
    /// clients whose counters went back (their earlier report was folded in here).
    settled: DataPathReport,
    refused: u64,
    restarted: u64,
}

/// A snapshot for `tutti serve --metrics` (see `docs/operating.md` for what each number covers).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct MetricsReport {
    pub status: StatusReport,
    pub geometry: Option<Geometry>,
    /// Bytes of one object (a K or V slice of one block in one layer).
    pub object_bytes: u64,
    /// Control requests served, by request name.
    pub requests: Vec<(String, u64)>,
    /// Error replies, by kind (invalid, busy, io, protocol).
    pub request_errors: Vec<(String, u64)>,
    /// Lookups served, and the blocks they found (the hit prefix) and did not.
    pub lookups: u64,
    pub lookup_hit_blocks: u64,
    pub lookup_miss_blocks: u64,
    /// Files clients took load references on (the files their loads read).
    pub load_references: u64,
    /// The clients' data path: the sum of their latest reports.
    pub clients: DataPathReport,
    /// Connected clients that have reported.
    pub reporting_clients: u64,
    /// Reports refused as malformed, and reports whose counters went back (the client's earlier
    /// report was kept in the total).
    pub reports_refused: u64,
    pub reports_restarted: u64,
    /// The pool's drives in pool order: (controller name, namespace id).
    pub drives: Vec<(String, u32)>,
}

impl Counters {
    pub fn request(&self, name: &'static str) {
        *self.requests.lock().unwrap_or_else(|p| p.into_inner()).entry(name).or_default() += 1;
    }

    pub fn error(&self, kind: &'static str) {
        *self.errors.lock().unwrap_or_else(|p| p.into_inner()).entry(kind).or_default() += 1;
    }

    pub fn lookup(&self, asked: usize, found: usize) {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        self.lookup_hits.fetch_add(found as u64, Ordering::Relaxed);
        self.lookup_misses.fetch_add(asked.saturating_sub(found) as u64, Ordering::Relaxed);
    }

    /// A client's report, checked against the pool's `drives`. A report whose counters went
    /// back (a client that reopened its store on the same connection, or one that lies) starts
    /// over: its earlier report stays in the total, so the total never goes down.
    pub fn report(&self, client: u64, report: DataPathReport, drives: usize) {
        let mut r = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(why) = report.check(drives) {
            r.refused += 1;
            tracing::warn!(client, %why, "ignoring a client's data-path report");
            return;
        }
        if let Some(before) = r.live.get(&client) {
            if !report.not_below(before) {
                let kept = before.counters_only();
                r.settled.add(&kept);
                r.restarted += 1;
                tracing::info!(
                    client,
                    "a client's data-path counters went back; its earlier report stays counted"
                );
            }
        }
        r.live.insert(client, report);
    }

    /// The client left: its last report's counters stay in the total, its gauges go.
    pub fn departed(&self, client: u64) {
        let mut r = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(last) = r.live.remove(&client) {
            let kept = last.counters_only();
            r.settled.add(&kept);
        }
    }

    pub fn snapshot(
        &self,
        status: StatusReport,
        geometry: Option<Geometry>,
        drives: Vec<(String, u32)>,
    ) -> MetricsReport {
        let list = |m: &Mutex<BTreeMap<&'static str, u64>>| {
            m.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (k.to_string(), *v)).collect()
        };
        let r = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        let mut clients = r.settled.clone();
        for rep in r.live.values() {
            clients.add(rep);
        }
        if clients.drives.len() < drives.len() {
            clients.drives.resize(drives.len(), Default::default());
        }
        MetricsReport {
            status,
            object_bytes: geometry.map_or(0, |g| g.object_bytes()),
            geometry,
            requests: list(&self.requests),
            request_errors: list(&self.errors),
            lookups: self.lookups.load(Ordering::Relaxed),
            lookup_hit_blocks: self.lookup_hits.load(Ordering::Relaxed),
            lookup_miss_blocks: self.lookup_misses.load(Ordering::Relaxed),
            load_references: self.load_references.load(Ordering::Relaxed),
            clients,
            reporting_clients: r.live.len() as u64,
            reports_refused: r.refused,
            reports_restarted: r.restarted,
            drives,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tutti_objstore::report::StagingNow;

    fn rep(bytes: u64, in_use: u64) -> DataPathReport {
        DataPathReport {
            bytes_loaded: bytes,
            staging: Some(StagingNow { slots: 4, in_use, withheld: 0, waits: bytes }),
            ..Default::default()
        }
    }

    #[test]
    fn totals_keep_what_departed_clients_reported_and_never_go_down() {
        let c = Counters::default();
        c.report(1, rep(10, 2), 2);
        c.report(2, rep(5, 1), 2);
        let s = c.snapshot(StatusReport::default(), None, vec![]);
        assert_eq!((s.clients.bytes_loaded, s.reporting_clients), (15, 2));
        assert_eq!(s.clients.staging.map(|s| s.in_use), Some(3));
        c.report(1, rep(20, 0), 2);
        c.departed(2);
        let s = c.snapshot(StatusReport::default(), None, vec![]);
        assert_eq!(s.clients.bytes_loaded, 25, "client 2's last report stays counted");
        assert_eq!(
            s.clients.staging.map(|s| (s.slots, s.in_use, s.waits)),
            Some((4, 0, 25)),
            "its gauges go"
        );
        // Client 1's counters go back: its earlier report stays in the total.
        c.report(1, rep(3, 0), 2);
        let s = c.snapshot(StatusReport::default(), None, vec![]);
        assert_eq!((s.clients.bytes_loaded, s.reports_restarted), (28, 1));
        // A malformed report is refused and changes nothing.
        let bad = DataPathReport { drives: vec![Default::default(); 3], ..rep(100, 0) };
        c.report(1, bad, 2);
        let s = c.snapshot(StatusReport::default(), None, vec![]);
        assert_eq!((s.clients.bytes_loaded, s.reports_refused), (28, 1));
    }
}
