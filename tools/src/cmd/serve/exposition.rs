//! tuttid's numbers in the Prometheus text format: a `prometheus-client` [`Collector`] over the
//! daemon's [`MetricsReport`] taken at each scrape. Which side counts what (the daemon's control
//! path, or the clients' reports of their data path) is in `docs/operating.md`; every help text
//! here says it too. `metrics.rs` serves it over HTTP.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use tutti_daemon::metrics::MetricsReport;
use tutti_objstore::report::{LatencyHistogram, LATENCY_BOUNDS_S};

/// The text of one scrape.
pub fn exposition(m: &MetricsReport) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix_and_labels(
        "tutti",
        [("pool".into(), m.status.pool.clone().into())].into_iter(),
    );
    registry.register_collector(Box::new(Snapshot(m.clone())));
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?;
    Ok(out)
}

/// One scrape's numbers.
#[derive(Debug)]
struct Snapshot(MetricsReport);

type Labels = Vec<(&'static str, String)>;

fn counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: u64,
) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, unit, c.metric_type())?)
}

fn counter_f(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: f64,
) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, unit, c.metric_type())?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<&Unit>, v: i64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, unit, g.metric_type())?)
}

fn counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: &[(Labels, u64)],
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauges(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: &[(Labels, i64)],
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn histogram(e: &mut DescriptorEncoder, name: &str, help: &str, h: &LatencyHistogram) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    // Per upper bound, +Inf last, the count in that bucket alone (the encoder makes them cumulative).
    let buckets: Vec<(f64, u64)> = LATENCY_BOUNDS_S
        .iter()
        .chain([f64::INFINITY].iter())
        .enumerate()
        .map(|(i, bound)| (*bound, h.buckets.get(i).copied().unwrap_or(0)))
        .collect();
    let total = h.count();
    m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
        h.sum_ns as f64 * 1e-9,
        total,
        &buckets,
        None,
    )
}

fn g(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = &self.0;
        let s = &m.status;
        let ix = &s.stats.index;
        let bytes = Some(&Unit::Bytes);
        let secs = Some(&Unit::Seconds);

        // ---- the daemon's own view: the pool and the control path ----
        if let Some(geo) = m.geometry {
            let labels: Labels = vec![
                ("version", env!("CARGO_PKG_VERSION").to_string()),
                ("layers", geo.layers.to_string()),
                ("kv_heads", geo.kv_heads.to_string()),
                ("head_dim", geo.head_dim.to_string()),
                ("block_tokens", geo.tokens_per_block.to_string()),
                ("dtype", geo.dtype.to_string()),
            ];
            let mut enc = e.encode_descriptor(
                "pool",
                "The pool tuttid serves and its KV geometry (tuttid).",
                None,
                MetricType::Info,
            )?;
            enc.encode_info(&labels)?;
        }
        gauge(&mut e, "uptime", "Time since tuttid started serving (tuttid).", secs, g(s.uptime_s))?;
        gauge(
            &mut e,
            "object",
            "Size of one object: a K or V slice of one block in one layer.",
            bytes,
            g(m.object_bytes),
        )?;
        gauge(&mut e, "clients", "Clients connected now (tuttid).", None, s.clients.len() as i64)?;
        gauge(
            &mut e,
            "connections_waiting_for_hello",
            "Connections that have not said hello yet (tuttid).",
            None,
            s.waiting_for_hello as i64,
        )?;
        counter(
            &mut e,
            "clients_connected",
            "Clients connected since tuttid started (tuttid).",
            None,
            s.clients_served,
        )?;
        let rows: Vec<(Labels, u64)> =
            m.requests.iter().map(|(k, v)| (vec![("request", k.clone())], *v)).collect();
        counters(&mut e, "requests", "Control requests tuttid served, by request (tuttid).", None, &rows)?;
        let rows: Vec<(Labels, u64)> =
            m.request_errors.iter().map(|(k, v)| (vec![("kind", k.clone())], *v)).collect();
        counters(
            &mut e,
            "request_errors",
            "Control requests tuttid answered with an error, by kind (tuttid).",
            None,
            &rows,
        )?;
        counter(&mut e, "lookups", "Lookups tuttid served (tuttid).", None, m.lookups)?;
        counter(
            &mut e,
            "lookup_hit_blocks",
            "Blocks lookups found stored: the hit prefixes (tuttid).",
            None,
            m.lookup_hit_blocks,
        )?;
        counter(
            &mut e,
            "lookup_miss_blocks",
            "Blocks lookups asked for beyond their hit prefix (tuttid).",
            None,
            m.lookup_miss_blocks,
        )?;
        counter(
            &mut e,
            "evictions",
            "Stored files evicted to make room (tuttid's index).",
            None,
            ix.evictions,
        )?;
        counter(
            &mut e,
            "files_committed",
            "Files made durable and visible by commits (tuttid).",
            None,
            s.stats.files_committed,
        )?;
        counter(
            &mut e,
            "journal_appends",
            "Records appended to the pool's journals (tuttid).",
            None,
            s.stats.journal_appends,
        )?;
        counter(
            &mut e,
            "files_quarantined",
            "Files taken out of service since tuttid opened the pool: a write into them had an unknown outcome (tuttid).",
            None,
            s.stats.quarantined_files,
        )?;
        counter(
            &mut e,
            "load_references",
            "Files clients took load references on: the files their loads read (tuttid).",
            None,
            m.load_references,
        )?;
        gauge(&mut e, "files", "Files in the pool (tuttid's index).", None, ix.files as i64)?;
        let rows: Vec<(Labels, i64)> = [
            ("valid", ix.valid),
            ("free", ix.free),
            ("being_written", ix.reserved),
            ("pinned", ix.pinned),
            ("busy", ix.busy),
            ("quarantined", ix.quarantined),
        ]
        .into_iter()
        .map(|(k, v)| (vec![("state", k.to_string())], v as i64))
        .collect();
        gauges(
            &mut e,
            "files_by_state",
            "Files by state now (tuttid's index); pinned and busy overlap valid.",
            None,
            &rows,
        )?;
        let sum = |f: fn(&tutti_daemon::proto::ClientStatus) -> usize| {
            s.clients.iter().map(f).sum::<usize>() as i64
        };
        gauge(&mut e, "pins", "Lookup pins clients hold now (tuttid).", None, sum(|c| c.pins))?;
        gauge(
            &mut e,
            "stores_in_flight",
            "Store reservations clients hold now (tuttid).",
            None,
            sum(|c| c.reservations),
        )?;
        gauge(
            &mut e,
            "loading_files",
            "Files with a client's load in flight now (tuttid).",
            None,
            sum(|c| c.loading_files),
        )?;
        gauge(
            &mut e,
            "leased_queue_pairs",
            "I/O queue pairs leased to clients now (tuttid).",
            None,
            sum(|c| c.queues.len()),
        )?;
        gauge(
            &mut e,
            "proxied_clients",
            "Clients whose layers tuttid moves itself (no queue pair left to lease).",
            None,
            s.clients.iter().filter(|c| c.proxied).count() as i64,
        )?;
        let rows: Vec<(Labels, i64)> = s
            .controllers
            .iter()
            .flat_map(|c| {
                [("granted", c.granted_pairs), ("free", c.free_pairs)].map(|(st, n)| {
                    (vec![("controller", c.name.clone()), ("state", st.to_string())], n as i64)
                })
            })
            .collect();
        gauges(
            &mut e,
            "controller_queue_pairs",
            "I/O queue pairs each controller granted, and those nobody holds (tuttid).",
            None,
            &rows,
        )?;
        let rows: Vec<(Labels, i64)> = s
            .controllers
            .iter()
            .map(|c| (vec![("controller", c.name.clone())], g(c.client_mappings)))
            .collect();
        gauges(
            &mut e,
            "controller_client_mappings",
            "Ranges of client memory mapped for each controller (tuttid).",
            None,
            &rows,
        )?;
        let a = &s.arbitration;
        counter(
            &mut e,
            "arbitration_metadata_holds",
            "Metadata writes of tuttid that held the drives on the arbitration board (tuttid).",
            None,
            a.holds,
        )?;
        counter(
            &mut e,
            "arbitration_metadata_waits",
            "Metadata holds that waited for clients' reads in flight (tuttid).",
            None,
            a.waits,
        )?;
        counter_f(
            &mut e,
            "arbitration_metadata_wait",
            "Time metadata holds waited for clients' reads (tuttid).",
            secs,
            a.wait_ns as f64 * 1e-9,
        )?;
        counter(
            &mut e,
            "arbitration_stale_marks",
            "Clients a metadata hold waited out and marked stale (tuttid).",
            None,
            a.stale_marks,
        )?;
        counter(
            &mut e,
            "arbitration_stale_skips",
            "Metadata holds that skipped a client marked stale (tuttid).",
            None,
            a.stale_skips,
        )?;
        gauge(
            &mut e,
            "stale_clients",
            "Clients whose arbitration row holds I/O unchanged past the stale deadline now (tuttid).",
            None,
            s.clients.iter().filter(|c| c.stale.is_some()).count() as i64,
        )?;
        let emu = |f: fn(&tutti_daemon::proto::EmulatedIo) -> u64| -> Vec<(Labels, u64)> {
            s.emulated_io.iter().map(|c| (vec![("controller", c.name.clone())], f(c))).collect()
        };
        counters(
            &mut e,
            "emulated_commands",
            "I/O commands each emulated controller executed, every client's and tuttid's (tuttid runs them).",
            None,
            &emu(|c| c.commands),
        )?;
        counters(
            &mut e,
            "emulated_command_errors",
            "Emulated I/O commands completed with an error status (tuttid).",
            None,
            &emu(|c| c.errors),
        )?;
        counters(
            &mut e,
            "emulated_read",
            "Bytes read from each emulated controller's media (tuttid).",
            bytes,
            &emu(|c| c.bytes_read),
        )?;
        counters(
            &mut e,
            "emulated_written",
            "Bytes written to each emulated controller's media (tuttid).",
            bytes,
            &emu(|c| c.bytes_written),
        )?;
        counters(
            &mut e,
            "emulated_mixed_commands",
            "Emulated commands run with reads and writes on the drive together (tuttid).",
            None,
            &emu(|c| c.mixed_commands),
        )?;

        // ---- the clients' data path, as they reported it ----
        let c = &m.clients;
        gauge(
            &mut e,
            "reporting_clients",
            "Connected clients that reported their data path.",
            None,
            g(m.reporting_clients),
        )?;
        counter(
            &mut e,
            "client_reports_refused",
            "Client reports tuttid refused as malformed.",
            None,
            m.reports_refused,
        )?;
        counter(
            &mut e,
            "client_reports_restarted",
            "Client reports whose counters went back; the client's earlier report stays counted.",
            None,
            m.reports_restarted,
        )?;
        counter(
            &mut e,
            "loaded",
            "KV bytes clients loaded successfully (clients' reports).",
            bytes,
            c.bytes_loaded,
        )?;
        counter(
            &mut e,
            "stored",
            "KV bytes clients stored successfully (clients' reports).",
            bytes,
            c.bytes_stored,
        )?;
        let rows: Vec<(Labels, u64)> = vec![
            (vec![("direction", "load".into())], c.layers_loaded),
            (vec![("direction", "store".into())], c.layers_stored),
        ];
        counters(&mut e, "layers", "Layer transfers clients finished (clients' reports).", None, &rows)?;
        counter(
            &mut e,
            "commands",
            "NVMe commands the clients' layers took (clients' reports).",
            None,
            c.commands,
        )?;
        counter(
            &mut e,
            "failed_blocks",
            "Block-layer transfers of clients that failed (clients' reports).",
            None,
            c.failed_blocks,
        )?;
        counter(&mut e, "queue_recoveries", "Drives clients recovered (queue pairs deleted and created again) after commands of unknown outcome (clients' reports).", None, c.queue_recoveries)?;
        counter(
            &mut e,
            "queue_recovery_failures",
            "Drive recoveries of clients that failed or could not run (clients' reports).",
            None,
            c.queue_recovery_failures,
        )?;
        histogram(
            &mut e,
            "layer_load",
            "Layer load time, from submission to the poll that saw it end (clients' reports).",
            &c.load_latency,
        )?;
        histogram(
            &mut e,
            "layer_store",
            "Layer store time, from submission to the poll that saw it end (clients' reports).",
            &c.store_latency,
        )?;
        let w = &c.gate;
        let rows: Vec<(Labels, u64)> = [
            ("read_for_writes", w.reads_for_writes),
            ("write_for_reads", w.writes_for_reads),
            ("write_for_slack", w.writes_for_slack),
            ("cross_process", w.cross_process),
        ]
        .into_iter()
        .map(|(k, v)| (vec![("reason", k.to_string())], v))
        .collect();
        counters(
            &mut e,
            "arbitration_waits",
            "Times the clients' schedulers held a layer back, by reason (clients' reports).",
            None,
            &rows,
        )?;
        counter(
            &mut e,
            "arbitration_client_stale_marks",
            "Other clients a client marked stale on the arbitration board (clients' reports).",
            None,
            w.stale_marks,
        )?;
        counter(
            &mut e,
            "arbitration_client_stale_skips",
            "Checks of clients that skipped a client marked stale (clients' reports).",
            None,
            w.stale_skips,
        )?;
        let st = c.staging.unwrap_or_default();
        let rows: Vec<(Labels, i64)> =
            [("total", st.slots), ("in_use", st.in_use), ("withheld", st.withheld)]
                .into_iter()
                .map(|(k, v)| (vec![("state", k.to_string())], g(v)))
                .collect();
        gauges(&mut e, "staging_slots", "Staging slots of connected clients now: all, held by a lane, withheld for an unknown outcome (clients' reports).", None, &rows)?;
        counter(
            &mut e,
            "staging_waits",
            "Times a lane found no free staging slot (clients' reports).",
            None,
            st.waits,
        )?;
        let drive = |i: usize| -> Labels {
            let (dev, ns) = m.drives.get(i).cloned().unwrap_or_else(|| ("?".into(), 0));
            vec![("drive", i.to_string()), ("device", dev), ("nsid", ns.to_string())]
        };
        let per = |f: fn(&tutti_objstore::report::DriveIo) -> u64| -> Vec<(Labels, u64)> {
            c.drives.iter().enumerate().map(|(i, d)| (drive(i), f(d))).collect()
        };
        counters(
            &mut e,
            "drive_loaded",
            "KV bytes clients loaded from each pool drive (clients' reports).",
            bytes,
            &per(|d| d.bytes_loaded),
        )?;
        counters(
            &mut e,
            "drive_stored",
            "KV bytes clients stored on each pool drive (clients' reports).",
            bytes,
            &per(|d| d.bytes_stored),
        )?;
        counters(&mut e, "drive_commands", "NVMe commands completed on the clients' queue pairs of each drive (clients' reports; gio_uring path).", None, &per(|d| d.commands))?;
        let rows: Vec<(Labels, u64)> = c
            .drives
            .iter()
            .enumerate()
            .flat_map(|(i, d)| {
                [("status", d.status_errors), ("timeout", d.timeouts)].map(|(k, v)| {
                    let mut l = drive(i);
                    l.push(("kind", k.to_string()));
                    (l, v)
                })
            })
            .collect();
        counters(&mut e, "drive_command_errors", "NVMe commands of clients on each drive that failed, by kind: an error status, or no completion by the deadline (clients' reports).", None, &rows)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_is_cumulative_and_ends_at_inf_with_the_count() {
        let mut m = MetricsReport::default();
        m.status.pool = "p".into();
        let mut buckets = vec![0; tutti_objstore::report::LATENCY_BUCKETS];
        buckets[0] = 2;
        buckets[3] = 1;
        *buckets.last_mut().unwrap() = 1;
        m.clients.load_latency = LatencyHistogram { buckets, sum_ns: 1_500_000_000 };
        m.requests = vec![("lookup".into(), 7)];
        let text = exposition(&m).unwrap();
        assert!(text.contains("tutti_layer_load_seconds_bucket{pool=\"p\",le=\"5e-05\"} 2"), "{text}");
        assert!(text.contains("tutti_layer_load_seconds_bucket{pool=\"p\",le=\"0.0005\"} 3"), "{text}");
        assert!(text.contains("tutti_layer_load_seconds_bucket{pool=\"p\",le=\"+Inf\"} 4"), "{text}");
        assert!(text.contains("tutti_layer_load_seconds_count{pool=\"p\"} 4"), "{text}");
        assert!(text.contains("tutti_layer_load_seconds_sum{pool=\"p\"} 1.5"), "{text}");
        assert!(text.contains("tutti_requests_total{pool=\"p\",request=\"lookup\"} 7"), "{text}");
    }
}
