use super::*;
use crate::buckets::Axis;
use crate::table::{Identity, TableGrid};

const LAYERS: u32 = 4;

/// Every prefill layer has `window_ns` of slack and room for `max_iocbs`; decode steps too.
fn table(window_ns: u64, max_iocbs: u32) -> SlackTable {
    let grid = TableGrid {
        input: Axis::new(vec![1, 1_000_000]).unwrap(),
        prefix: Axis::new(vec![0, 1_000_000]).unwrap(),
        decode_context: Axis::new(vec![0, 1_000_000]).unwrap(),
    };
    let e = SlackEntry { window_ns, sm_budget: 4, max_iocbs };
    let id = Identity { model: "m".into(), gpu: "g".into(), layers: LAYERS };
    SlackTable::from_fn(id, "test", grid, |_, _, _| e, |_| e).unwrap()
}

/// 1 IOCB = 1000 B; reads 1 B/ns, writes 0.5 B/ns: a read IOCB takes 1 µs, a write 2 µs, +1 µs latency.
fn config(drives: usize, capacity: u64) -> SchedulerConfig {
    SchedulerConfig {
        drives,
        rates: IoRates {
            read_bytes_per_sec: 1e9,
            write_bytes_per_sec: 5e8,
            command_latency_ns: 1000,
            iocb_bytes: 1000,
        },
        backlog_capacity_iocbs: capacity,
        write_guard: 0.0,
    }
}

fn shape() -> RequestShape {
    RequestShape::new(1000, 1000)
}

fn count(issue: &[Issue], kind: IoKind) -> u64 {
    issue.iter().filter(|i| i.kind == kind).map(|i| u64::from(i.iocbs)).sum()
}

#[test]
fn reads_go_first_and_writes_get_only_the_slack_left_after_them() {
    let mut s = Scheduler::new(table(100_000, 10_000), config(1, 1000)).unwrap();
    s.enqueue_reads(1, &[40]).unwrap();
    s.enqueue_writes(&[500]).unwrap();
    let plan = s.plan_prefill_layer(shape(), 0, 0).unwrap();
    assert_eq!(plan.reads, 40);
    assert_eq!(count(&plan.issue, IoKind::Read), 40);
    assert_eq!(count(&plan.issue, IoKind::Write), 0, "writes wait for the drive's reads");
    // 100 µs window − (1 + 40) µs of reads = 59 µs → (59 − 1) / 2 = 29 writes.
    assert_eq!(plan.writes, 29);
    assert_eq!(plan.deferred_writes, 471);
    assert_eq!(s.drive(0).unwrap().armed_writes, 29);
    let released = s.complete(0, IoKind::Read, 40, 41_000).unwrap();
    assert_eq!(released, vec![Issue { drive: 0, kind: IoKind::Write, iocbs: 29, layer: None }]);
    assert_eq!(s.drive(0).unwrap().writes_in_flight, 29);
}

#[test]
fn armed_writes_are_trimmed_when_reads_finish_late() {
    let mut s = Scheduler::new(table(100_000, 10_000), config(1, 1000)).unwrap();
    s.enqueue_reads(1, &[40]).unwrap();
    s.enqueue_writes(&[500]).unwrap();
    s.plan_prefill_layer(shape(), 0, 0).unwrap();
    // Reads took until 81 µs: 19 µs left → 9 writes; the other 20 go back to the backlog.
    let released = s.complete(0, IoKind::Read, 40, 81_000).unwrap();
    assert_eq!(count(&released, IoKind::Write), 9);
    assert_eq!(s.queued_writes(), 491);
    assert_eq!(s.outstanding_writes(), 500);
}

#[test]
fn without_slack_writes_are_deferred_to_decode() {
    let mut s = Scheduler::new(table(30_000, 10_000), config(2, 1000)).unwrap();
    s.enqueue_reads(1, &[30, 30]).unwrap();
    s.enqueue_writes(&[10, 10]).unwrap();
    let plan = s.plan_prefill_layer(shape(), 0, 0).unwrap();
    assert_eq!(plan.writes, 0);
    assert_eq!(plan.deferred_writes, 20);
    for d in 0..2 {
        assert!(s.complete(d, IoKind::Read, 30, 31_000).unwrap().is_empty());
    }
    let decode = s.plan_decode_step(2000, 40_000);
    // 30 µs per step: (30 − 1) / 2 = 14 per drive, capped by the 10 queued.
    assert_eq!(decode.writes, 20);
    assert_eq!(count(&decode.issue, IoKind::Write), 20);
    assert_eq!(decode.deferred_writes, 0);
}

#[test]
fn reads_are_held_behind_writes_already_in_flight_and_released_when_they_drain() {
    let mut s = Scheduler::new(table(30_000, 10_000), config(1, 1000)).unwrap();
    s.enqueue_writes(&[10]).unwrap();
    let decode = s.plan_decode_step(100, 0);
    assert_eq!(count(&decode.issue, IoKind::Write), 10);
    s.enqueue_reads(0, &[5]).unwrap();
    let plan = s.plan_prefill_layer(shape(), 0, 1000).unwrap();
    assert_eq!(plan.overdue_reads, 5);
    assert!(plan.issue.is_empty(), "no read may start while the drive writes");
    assert_eq!(s.drive(0).unwrap().gated_reads, 5);
    assert!(s.complete(0, IoKind::Write, 4, 5000).unwrap().is_empty());
    let released = s.complete(0, IoKind::Write, 6, 9000).unwrap();
    assert_eq!(released, vec![Issue { drive: 0, kind: IoKind::Read, iocbs: 5, layer: Some(0) }]);
}

#[test]
fn overdue_reads_are_issued_whatever_the_budget_and_next_reads_respect_it() {
    let mut s = Scheduler::new(table(1_000_000, 8), config(2, 1000)).unwrap();
    s.enqueue_reads(0, &[50, 50]).unwrap();
    s.enqueue_reads(1, &[10, 6]).unwrap();
    let plan = s.plan_prefill_layer(shape(), 0, 0).unwrap();
    assert_eq!(plan.overdue_reads, 100);
    assert_eq!(plan.reads, 8);
    assert_eq!(plan.writes, 0);
    assert_eq!(s.queued_reads(), 8, "the rest of layer 1 waits for the next plan");
    let next = s.plan_prefill_layer(shape(), 1, 10_000).unwrap();
    assert_eq!(next.overdue_reads, 8);
}

#[test]
fn backlog_bound_refuses_with_backpressure_and_takes_nothing() {
    let mut s = Scheduler::new(table(30_000, 10_000), config(2, 10)).unwrap();
    s.enqueue_writes(&[4, 4]).unwrap();
    let e = s.enqueue_writes(&[1, 2]).unwrap_err();
    assert_eq!(e.backpressure(), Some(&Backpressure { outstanding: 8, requested: 3, capacity: 10 }));
    assert!(e.to_string().contains("stall"), "{e}");
    assert_eq!(s.outstanding_writes(), 8);
    assert!(matches!(s.enqueue_writes(&[6, 6]), Err(SchedError::InvalidConfig(_))));
    // Issued-but-incomplete writes still hold HBM: relieve does not make room, completion does.
    let issued = s.relieve(u64::MAX);
    assert_eq!(count(&issued, IoKind::Write), 8);
    assert!(s.enqueue_writes(&[1, 2]).unwrap_err().backpressure().is_some());
    s.complete(0, IoKind::Write, 4, 0).unwrap();
    s.enqueue_writes(&[1, 2]).unwrap();
}

#[test]
fn bad_arguments_are_errors() {
    let mut s = Scheduler::new(table(30_000, 10_000), config(2, 10)).unwrap();
    assert!(matches!(s.enqueue_writes(&[1]), Err(SchedError::DriveCount { expected: 2, got: 1 })));
    assert!(matches!(s.enqueue_reads(LAYERS, &[1, 1]), Err(SchedError::LayerOutOfRange { .. })));
    assert!(matches!(s.plan_prefill_layer(shape(), LAYERS, 0), Err(SchedError::LayerOutOfRange { .. })));
    let e = s.complete(1, IoKind::Read, 1, 0).unwrap_err();
    assert!(e.to_string().contains("drive 1: completion of 1 read IOCBs but only 0 in flight"), "{e}");
    let e = s.complete(7, IoKind::Read, 0, 0).unwrap_err().to_string();
    assert_eq!(e, "no drive 7: the scheduler manages 2 drives");
    assert!(Scheduler::new(table(1, 1), SchedulerConfig { drives: 0, ..config(1, 1) }).is_err());
    assert!(Scheduler::new(table(1, 1), SchedulerConfig { write_guard: 1.0, ..config(1, 1) }).is_err());
}

#[test]
fn online_slack_shrinks_the_window_after_short_layers() {
    let mut s = Scheduler::new(table(100_000, 10_000), config(1, 1000))
        .unwrap()
        .with_online_slack(OnlineConfig::default())
        .unwrap();
    for layer in 0..LAYERS {
        s.observe_layer(shape(), layer, 50_000).unwrap();
    }
    let plan = s.plan_prefill_layer(shape(), 0, 0).unwrap();
    assert!(plan.slack.window_ns < 60_000 && plan.slack.window_ns >= 50_000, "{}", plan.slack.window_ns);
    // Without online correction the same observations change nothing.
    let mut fixed = Scheduler::new(table(100_000, 10_000), config(1, 1000)).unwrap();
    fixed.observe_layer(shape(), 0, 50_000).unwrap();
    assert_eq!(fixed.plan_prefill_layer(shape(), 0, 0).unwrap().slack.window_ns, 100_000);
}
