//! Property tests of the slack-aware policy against random sequences of engine calls.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use tutti_scheduler::buckets::Axis;
use tutti_scheduler::table::Identity;
use tutti_scheduler::{
    IoKind, IoRates, Issue, RequestShape, SchedError, Scheduler, SchedulerConfig, SlackEntry, SlackTable,
    TableGrid,
};

const LAYERS: u32 = 6;

#[derive(Debug, Clone)]
enum Op {
    EnqueueReads { layer: u32, counts: Vec<u32> },
    EnqueueWrites { counts: Vec<u32> },
    PlanPrefill { layer: u32, advance_ns: u64 },
    PlanDecode { advance_ns: u64 },
    Complete { pick: usize, fraction: f64, advance_ns: u64 },
    Relieve { needed: u64 },
}

fn op(drives: usize) -> impl Strategy<Value = Op> {
    let counts = proptest::collection::vec(0u32..40, drives);
    prop_oneof![
        (0..LAYERS, counts.clone()).prop_map(|(layer, counts)| Op::EnqueueReads { layer, counts }),
        counts.prop_map(|counts| Op::EnqueueWrites { counts }),
        (0..LAYERS, 0u64..200_000).prop_map(|(layer, advance_ns)| Op::PlanPrefill { layer, advance_ns }),
        (0u64..200_000).prop_map(|advance_ns| Op::PlanDecode { advance_ns }),
        (any::<usize>(), 0.0f64..1.0, 0u64..100_000).prop_map(|(pick, fraction, advance_ns)| Op::Complete {
            pick,
            fraction,
            advance_ns
        }),
        (0u64..100).prop_map(|needed| Op::Relieve { needed }),
    ]
}

/// A table whose prefill window varies with layer, and a decode window that always fits writes.
fn table(prefill_ns: u64, max_iocbs: u32, decode_ns: u64) -> SlackTable {
    let grid = TableGrid {
        input: Axis::new(vec![1, 100_000]).unwrap(),
        prefix: Axis::new(vec![0, 100_000]).unwrap(),
        decode_context: Axis::new(vec![0, 100_000]).unwrap(),
    };
    let id = Identity { model: "m".into(), gpu: "g".into(), layers: LAYERS };
    SlackTable::from_fn(
        id,
        "prop",
        grid,
        |_, _, l| SlackEntry { window_ns: prefill_ns * u64::from(l + 1) / 2, sm_budget: 4, max_iocbs },
        |_| SlackEntry { window_ns: decode_ns, sm_budget: 4, max_iocbs: 1000 },
    )
    .unwrap()
}

fn rates() -> IoRates {
    // A read IOCB takes 1 µs, a write 2 µs, plus 1 µs latency per batch.
    IoRates { read_bytes_per_sec: 1e9, write_bytes_per_sec: 5e8, command_latency_ns: 1000, iocb_bytes: 1000 }
}

struct Harness {
    s: Scheduler,
    now: u64,
    in_flight: Vec<Issue>,
    /// Writes the current window granted; issues from plans and releases may not exceed it.
    window_writes: u64,
    window_issued_writes: u64,
}

impl Harness {
    fn check_invariants(&self, drives: usize, capacity: u64) -> Result<(), TestCaseError> {
        for d in 0..drives {
            let snap = self.s.drive(d).unwrap();
            prop_assert!(
                !(snap.reads_in_flight > 0 && snap.writes_in_flight > 0),
                "drive {d} has reads and writes in flight: {snap:?}"
            );
            let ledger = |kind| -> u64 {
                self.in_flight
                    .iter()
                    .filter(|i| i.drive == d && i.kind == kind)
                    .map(|i| u64::from(i.iocbs))
                    .sum()
            };
            prop_assert_eq!(ledger(IoKind::Read), u64::from(snap.reads_in_flight));
            prop_assert_eq!(ledger(IoKind::Write), u64::from(snap.writes_in_flight));
        }
        prop_assert!(self.s.outstanding_writes() <= capacity);
        prop_assert!(self.window_issued_writes <= self.window_writes);
        Ok(())
    }

    /// Record issues; writes may only go to drives with no reads in flight or held.
    fn accept(&mut self, issues: &[Issue], count_in_window: bool) -> Result<(), TestCaseError> {
        for i in issues {
            prop_assert!(i.iocbs > 0);
            if i.kind == IoKind::Write {
                let snap = self.s.drive(i.drive).unwrap();
                prop_assert_eq!(snap.reads_in_flight, 0, "write issued to drive {} while it reads", i.drive);
                prop_assert_eq!(snap.gated_reads, 0, "write issued ahead of held reads on drive {}", i.drive);
                if count_in_window {
                    self.window_issued_writes += u64::from(i.iocbs);
                }
            } else {
                prop_assert!(i.layer.is_some(), "reads carry their layer");
            }
        }
        self.in_flight.extend_from_slice(issues);
        Ok(())
    }
}

fn run_ops(
    drives: usize,
    capacity: u64,
    prefill_ns: u64,
    max_iocbs: u32,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let cfg = SchedulerConfig { drives, rates: rates(), backlog_capacity_iocbs: capacity, write_guard: 0.05 };
    let t = table(prefill_ns, max_iocbs, 50_000);
    let shape = RequestShape::new(100, 100);
    let mut h = Harness {
        s: Scheduler::new(t, cfg).unwrap(),
        now: 0,
        in_flight: Vec::new(),
        window_writes: 0,
        window_issued_writes: 0,
    };
    let usable = |window_ns: u64| window_ns as f64 * 0.95;
    for op in ops {
        match op {
            Op::EnqueueReads { layer, counts } => h.s.enqueue_reads(layer, &counts).unwrap(),
            Op::EnqueueWrites { counts } => {
                let before = h.s.outstanding_writes();
                match h.s.enqueue_writes(&counts) {
                    Ok(()) => {}
                    Err(SchedError::Backpressure(b)) => {
                        prop_assert_eq!(h.s.outstanding_writes(), before, "a refused enqueue takes nothing");
                        prop_assert!(b.outstanding + b.requested > b.capacity);
                    }
                    Err(SchedError::InvalidConfig(_)) => {
                        prop_assert!(counts.iter().map(|&c| u64::from(c)).sum::<u64>() > capacity)
                    }
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Op::PlanPrefill { layer, advance_ns } => {
                h.now += advance_ns;
                let before: Vec<_> = (0..drives).map(|d| h.s.drive(d).unwrap()).collect();
                let plan = h.s.plan_prefill_layer(shape, layer, h.now).unwrap();
                // Issued IOCBs within the window never exceed its budget.
                prop_assert!(plan.reads + plan.writes <= u64::from(plan.slack.max_iocbs), "{plan:?}");
                // Writes only take slack left after reads: none while next-layer reads are capped.
                if h.s.queued_reads_for(layer + 1) > 0 {
                    prop_assert_eq!(plan.writes, 0, "writes granted while reads of layer {} wait", layer + 1);
                }
                for (d, before) in before.iter().enumerate() {
                    let after = h.s.drive(d).unwrap();
                    // Reads are held only behind writes that were already in flight.
                    if after.gated_reads > before.gated_reads {
                        prop_assert!(before.writes_in_flight > 0, "drive {d} held reads with no writes");
                    }
                    // A drive idle before the plan: its reads then writes fit the usable window.
                    if before.reads_in_flight == 0 && before.writes_in_flight == 0 && before.gated_reads == 0
                    {
                        let r = rates();
                        let busy = r.time_ns(IoKind::Read, u64::from(after.reads_in_flight))
                            + r.time_ns(
                                IoKind::Write,
                                after.armed_writes + u64::from(after.writes_in_flight),
                            );
                        if after.armed_writes + u64::from(after.writes_in_flight) > 0 {
                            prop_assert!(busy <= usable(plan.slack.window_ns) + 1.0, "drive {d}: {busy} ns");
                        }
                    }
                }
                h.window_writes = plan.writes;
                h.window_issued_writes = 0;
                h.accept(&plan.issue, true)?;
            }
            Op::PlanDecode { advance_ns } => {
                h.now += advance_ns;
                let plan = h.s.plan_decode_step(1000, h.now);
                prop_assert!(plan.writes <= u64::from(plan.slack.max_iocbs));
                h.window_writes = plan.writes;
                h.window_issued_writes = 0;
                h.accept(&plan.issue, true)?;
            }
            Op::Complete { pick, fraction, advance_ns } => {
                if h.in_flight.is_empty() {
                    continue;
                }
                h.now += advance_ns;
                let idx = pick % h.in_flight.len();
                let batch = h.in_flight[idx];
                let n = ((f64::from(batch.iocbs) * fraction).ceil() as u32).clamp(1, batch.iocbs);
                if n == batch.iocbs {
                    h.in_flight.remove(idx);
                } else {
                    h.in_flight[idx].iocbs -= n;
                }
                let released = h.s.complete(batch.drive, batch.kind, n, h.now).unwrap();
                h.accept(&released, true)?;
            }
            Op::Relieve { needed } => {
                let issued = h.s.relieve(needed);
                let total: u64 = issued.iter().map(|i| u64::from(i.iocbs)).sum();
                prop_assert!(total <= needed);
                h.accept(&issued, false)?;
            }
        }
        h.check_invariants(drives, capacity)?;
    }

    // Every deferred write is eventually issued: finish what is in flight, drop reads the
    // request no longer needs, and decode steps drain the backlog.
    h.s.cancel_reads();
    let mut steps = 0;
    loop {
        while let Some(b) = h.in_flight.pop() {
            h.now += 10_000;
            let released = h.s.complete(b.drive, b.kind, b.iocbs, h.now).unwrap();
            h.accept(&released, false)?;
        }
        if h.s.outstanding_writes() == 0 {
            break;
        }
        steps += 1;
        prop_assert!(steps <= 10_000, "backlog never drained: {} left", h.s.outstanding_writes());
        h.now += 50_000;
        let plan = h.s.plan_decode_step(1000, h.now);
        prop_assert!(plan.writes > 0 || h.s.queued_writes() == 0, "a decode step with slack issued nothing");
        h.accept(&plan.issue, false)?;
        h.check_invariants(drives, capacity)?;
    }
    prop_assert_eq!(h.s.queued_writes(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn policy_invariants_hold_for_any_call_sequence(
        drives in 1usize..4,
        capacity in 20u64..400,
        prefill_ns in 1_000u64..120_000,
        max_iocbs in 0u32..200,
        ops in (1usize..4).prop_flat_map(|d| proptest::collection::vec(op(d), 1..80)).no_shrink(),
    ) {
        // The op strategy picked its own drive count; pad or trim the counts to ours.
        let fix = |mut c: Vec<u32>| { c.resize(drives, 0); c };
        let ops = ops.into_iter().map(|o| match o {
            Op::EnqueueReads { layer, counts } => Op::EnqueueReads { layer, counts: fix(counts) },
            Op::EnqueueWrites { counts } => Op::EnqueueWrites { counts: fix(counts) },
            other => other,
        }).collect();
        run_ops(drives, capacity, prefill_ns, max_iocbs, ops)?;
    }
}
