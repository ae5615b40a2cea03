use super::*;
use crate::buckets::Axis;
use crate::online::OnlineConfig;
use crate::policy::IoRates;
use crate::table::{Identity, TableGrid};

const LAYERS: u32 = 4;

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

/// 1 IOCB = 1000 B; reads 1 B/ns, writes 0.5 B/ns, 1 µs latency.
fn config(mode: Mode, drives: usize, backlog: u64) -> ArbiterConfig {
    ArbiterConfig {
        mode,
        drives,
        rates: IoRates {
            read_bytes_per_sec: 1e9,
            write_bytes_per_sec: 5e8,
            command_latency_ns: 1000,
            iocb_bytes: 1000,
        },
        backlog_bytes: backlog,
        on_full: BacklogFull::Backpressure,
        write_guard: 0.0,
        idle_after_ns: 1_000_000_000,
        online: OnlineConfig::default(),
    }
}

fn arb(mode: Mode, window_ns: u64) -> Arbiter {
    let t = matches!(mode, Mode::Slack | Mode::SlackOnline).then(|| table(window_ns, 1000));
    let mut a = Arbiter::new(config(mode, 2, 100_000), t).unwrap();
    a.record(true);
    a
}

fn unit(job: u64, layer: u32, kind: IoKind, bytes: [u64; 2]) -> Unit {
    Unit { job, layer, kind, drive_bytes: bytes.to_vec() }
}

/// Accepts a store of `bytes` as job `job`.
fn bind(a: &mut Arbiter, bytes: u64, job: u64) {
    let key = a.accept_store(bytes).unwrap().expect("the store fits the backlog");
    a.bind_store(key, job).unwrap();
}

fn shape() -> RequestShape {
    RequestShape::new(1000, 1000)
}

/// Checks the logged invariants: never a read and a write in flight on one drive, and no write
/// started on a drive between a read's `Ready` and its `Issue`.
fn check_log(events: &[Event], drives: usize) {
    let mut reads = vec![0i64; drives];
    let mut writes = vec![0i64; drives];
    let mut running: HashMap<(u64, u32), (IoKind, Vec<usize>)> = HashMap::new();
    let mut waiting: HashMap<(u64, u32), Vec<usize>> = HashMap::new();
    for e in events {
        match e {
            Event::Ready { job, layer, drives, .. } => {
                waiting.insert((*job, *layer), drives.clone());
            }
            Event::Issue { job, layer, kind, drives, .. } => {
                for &d in drives {
                    match kind {
                        IoKind::Read => reads[d] += 1,
                        IoKind::Write => {
                            writes[d] += 1;
                            assert!(
                                !waiting.values().any(|w| w.contains(&d)),
                                "write of job {job} layer {layer} started on drive {d} while a read was ready: {e:?}"
                            );
                        }
                    }
                    assert!(reads[d] == 0 || writes[d] == 0, "drive {d} mixes reads and writes at {e:?}");
                }
                if *kind == IoKind::Read {
                    waiting.remove(&(*job, *layer));
                }
                running.insert((*job, *layer), (*kind, drives.clone()));
            }
            Event::Complete { job, layer, .. } => {
                let (kind, ds) = running.remove(&(*job, *layer)).unwrap();
                for d in ds {
                    match kind {
                        IoKind::Read => reads[d] -= 1,
                        IoKind::Write => writes[d] -= 1,
                    }
                }
            }
            Event::Release { .. } | Event::Accept { .. } => {}
        }
    }
}

#[test]
fn a_write_waits_for_reads_on_its_drive_and_a_read_for_writes() {
    let mut a = arb(Mode::Arbitrate, 0);
    let r = unit(1, 0, IoKind::Read, [100, 0]);
    assert_eq!(a.request(&r, false, 0).unwrap(), Decision::Go);
    let key = a.accept_store(200).unwrap().unwrap();
    a.bind_store(key, 2).unwrap();
    // Drive 0 has a read in flight: the write touching it waits, one on drive 1 alone goes.
    assert_eq!(a.request(&unit(2, 0, IoKind::Write, [100, 0]), false, 0).unwrap(), Decision::Wait);
    assert_eq!(a.request(&unit(2, 1, IoKind::Write, [0, 100]), false, 0).unwrap(), Decision::Go);
    // Drive 1 has a write in flight: a read touching it waits and is ready from now on.
    let r2 = unit(3, 0, IoKind::Read, [0, 50]);
    assert_eq!(a.request(&r2, false, 0).unwrap(), Decision::Wait);
    a.complete(1, 0).unwrap();
    // Drive 0 is free of reads now, but the ready read on drive 1 still holds writes back there.
    assert_eq!(a.request(&unit(2, 0, IoKind::Write, [100, 0]), false, 0).unwrap(), Decision::Go);
    a.complete(2, 1).unwrap();
    assert_eq!(a.request(&r2, false, 0).unwrap(), Decision::Go);
    assert_eq!(a.stats().mixed_issues, 0);
    check_log(&a.record(false), 2);
}

#[test]
fn a_ready_read_holds_back_writes_asked_for_after_it() {
    let mut a = arb(Mode::Arbitrate, 0);
    bind(&mut a, 1000, 9);
    assert_eq!(a.request(&unit(9, 0, IoKind::Write, [100, 100]), false, 0).unwrap(), Decision::Go);
    let r = unit(1, 0, IoKind::Read, [100, 100]);
    assert_eq!(a.request(&r, false, 0).unwrap(), Decision::Wait);
    // The first write completes; a later write is asked for before the read is asked again.
    a.complete(9, 0).unwrap();
    assert_eq!(a.request(&unit(9, 1, IoKind::Write, [100, 100]), true, 0).unwrap(), Decision::Wait);
    assert_eq!(a.request(&r, false, 0).unwrap(), Decision::Go);
    check_log(&a.record(false), 2);
}

#[test]
fn pass_mode_mixes_and_counts_it() {
    let mut a = arb(Mode::Pass, 0);
    assert_eq!(a.request(&unit(1, 0, IoKind::Read, [100, 0]), false, 0).unwrap(), Decision::Go);
    assert_eq!(a.request(&unit(2, 0, IoKind::Write, [100, 0]), false, 0).unwrap(), Decision::Go);
    assert_eq!(a.stats().mixed_issues, 1);
}

#[test]
fn slack_holds_writes_outside_windows_and_fits_them_inside() {
    // A 10 µs window: a write of 2 IOCBs per drive takes 1 + 4 µs.
    let mut a = arb(Mode::Slack, 10_000);
    bind(&mut a, 100_000, 5);
    let w = |l| unit(5, l, IoKind::Write, [2000, 2000]);
    // No timings yet: the slack policy is off and says so; the write goes.
    let p = a.policy(0);
    assert!(!p.slack_active);
    assert!(p.off_reason.unwrap().contains("no layer or decode timings"));
    assert_eq!(a.request(&w(0), false, 0).unwrap(), Decision::Go);
    a.complete(5, 0).unwrap();
    // A window opens: the policy is on; two writes fit (5 µs each), a third does not.
    a.layer_start(shape(), 0, 1_000).unwrap();
    assert!(a.policy(1_000).slack_active);
    assert_eq!(a.request(&w(1), false, 1_000).unwrap(), Decision::Go);
    assert_eq!(a.request(&w(2), false, 1_000).unwrap(), Decision::Go);
    assert_eq!(a.request(&w(3), false, 1_000).unwrap(), Decision::Wait);
    assert_eq!(a.stats().write_waits_for_slack, 1);
    a.layer_end(0, 11_000).unwrap();
    // Between windows (engine busy, not idle): held.
    assert_eq!(a.request(&w(3), false, 12_000).unwrap(), Decision::Wait);
    // A decode step drains it.
    a.decode_start(100, 20_000).unwrap();
    assert_eq!(a.request(&w(3), false, 20_000).unwrap(), Decision::Go);
    assert_eq!(a.stats().writes_in_decode, 1);
    // Urgent skips slack.
    a.decode_end(30_000);
    assert_eq!(a.request(&w(4), true, 30_000).unwrap(), Decision::Go);
}

#[test]
fn writes_queue_behind_writes_on_a_drive_until_it_drains() {
    let mut a = arb(Mode::Slack, 10_000);
    bind(&mut a, 100_000, 5);
    a.layer_start(shape(), 0, 0).unwrap();
    // 4 write IOCBs on drive 0 take 9 µs of the 10: a second such write does not fit behind it,
    // one on the idle drive 1 does.
    assert_eq!(a.request(&unit(5, 0, IoKind::Write, [4000, 0]), false, 0).unwrap(), Decision::Go);
    assert_eq!(a.request(&unit(5, 1, IoKind::Write, [4000, 0]), false, 100).unwrap(), Decision::Wait);
    assert_eq!(a.request(&unit(5, 2, IoKind::Write, [0, 4000]), false, 100).unwrap(), Decision::Go);
    // Once drive 0 reports its write done, the estimate is dropped: the rest of the window is free.
    a.complete(5, 0).unwrap();
    assert_eq!(a.request(&unit(5, 1, IoKind::Write, [1000, 0]), false, 200).unwrap(), Decision::Go);
}

#[test]
fn the_iocb_budget_of_the_window_caps_writes() {
    let t = table(1_000_000, 3);
    let mut a = Arbiter::new(config(Mode::Slack, 2, 100_000), Some(t)).unwrap();
    bind(&mut a, 100_000, 5);
    a.layer_start(shape(), 0, 0).unwrap();
    assert_eq!(a.request(&unit(5, 0, IoKind::Write, [2000, 0]), false, 0).unwrap(), Decision::Go);
    // 2 of 3 IOCBs used: a 2-IOCB write does not fit, a 1-IOCB one does.
    assert_eq!(a.request(&unit(5, 1, IoKind::Write, [0, 2000]), false, 0).unwrap(), Decision::Wait);
    assert_eq!(a.request(&unit(5, 2, IoKind::Write, [0, 1000]), false, 0).unwrap(), Decision::Go);
}

#[test]
fn idle_engine_turns_the_slack_policy_off() {
    let mut a = arb(Mode::Slack, 10);
    bind(&mut a, 100_000, 5);
    a.layer_start(shape(), 0, 0).unwrap();
    a.layer_end(0, 10).unwrap();
    assert_eq!(a.request(&unit(5, 0, IoKind::Write, [2000, 0]), false, 100).unwrap(), Decision::Wait);
    let later = 10 + a.config().idle_after_ns;
    let p = a.policy(later);
    assert!(!p.slack_active && p.off_reason.unwrap().contains("idle"));
    assert_eq!(a.request(&unit(5, 0, IoKind::Write, [2000, 0]), false, later).unwrap(), Decision::Go);
}

#[test]
fn the_backlog_bound_refuses_or_drops_and_counts() {
    let mut a = Arbiter::new(config(Mode::Arbitrate, 2, 1000), None).unwrap();
    let k = a.accept_store(600).unwrap().unwrap();
    a.bind_store(k, 1).unwrap();
    match a.accept_store(500) {
        Err(SchedError::BacklogFull { held: 600, requested: 500, capacity: 1000 }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(a.backlog_bytes(), 600);
    assert_eq!(a.stats().stores_refused, 1);
    // The store's first layer is written: its bytes leave the backlog; the second still holds.
    assert_eq!(a.request(&unit(1, 0, IoKind::Write, [200, 100]), false, 0).unwrap(), Decision::Go);
    a.complete(1, 0).unwrap();
    assert_eq!(a.backlog_bytes(), 300);
    let k2 = a.accept_store(500).unwrap().unwrap();
    assert_eq!(a.backlog_bytes(), 800);
    a.withdraw_store(k2);
    a.forget(1);
    assert_eq!(a.backlog_bytes(), 0);

    let mut cfg = config(Mode::Arbitrate, 2, 1000);
    cfg.on_full = BacklogFull::Drop;
    let mut d = Arbiter::new(cfg, None).unwrap();
    assert!(d.accept_store(900).unwrap().is_some());
    assert!(d.accept_store(200).unwrap().is_none());
    let s = d.stats();
    assert_eq!(
        (s.stores_dropped, s.bytes_dropped, s.backlog_bytes, s.backlog_peak_bytes),
        (1, 200, 900, 900)
    );
}

#[test]
fn forgetting_a_job_withdraws_its_ready_reads() {
    let mut a = arb(Mode::Arbitrate, 0);
    bind(&mut a, 1000, 2);
    assert_eq!(a.request(&unit(2, 0, IoKind::Write, [100, 0]), false, 0).unwrap(), Decision::Go);
    assert_eq!(a.request(&unit(1, 0, IoKind::Read, [100, 0]), false, 0).unwrap(), Decision::Wait);
    a.complete(2, 0).unwrap();
    // The load is gone: its ready read no longer holds writes back.
    a.forget(1);
    assert_eq!(a.request(&unit(2, 1, IoKind::Write, [100, 0]), false, 0).unwrap(), Decision::Go);
}

#[test]
fn online_correction_shrinks_the_window_of_a_stale_table() {
    // The table believes 10 µs per layer; the engine computes each in 5 µs.
    let mut a = arb(Mode::SlackOnline, 10_000);
    let mut now = 0;
    for layer in 0..LAYERS {
        a.layer_start(shape(), layer, now).unwrap();
        now += 5_000;
        a.layer_end(layer, now).unwrap();
    }
    bind(&mut a, 100_000, 5);
    a.layer_start(shape(), 0, now).unwrap();
    // 1 + 4 µs fits 5 µs but a 3-IOCB write (7 µs) no longer fits the corrected window.
    assert_eq!(a.request(&unit(5, 0, IoKind::Write, [3000, 0]), false, now).unwrap(), Decision::Wait);
    let mut plain = arb(Mode::Slack, 10_000);
    bind(&mut plain, 100_000, 5);
    plain.layer_start(shape(), 0, now).unwrap();
    assert_eq!(plain.request(&unit(5, 0, IoKind::Write, [3000, 0]), false, now).unwrap(), Decision::Go);
}

#[test]
fn slack_modes_need_a_table_and_bad_units_are_refused() {
    assert!(Arbiter::new(config(Mode::Slack, 2, 10), None).is_err());
    let mut a = arb(Mode::Arbitrate, 0);
    assert!(a
        .request(&Unit { job: 1, layer: 0, kind: IoKind::Read, drive_bytes: vec![1] }, false, 0)
        .is_err());
    assert!(a.complete(7, 7).is_err());
}

/// A pseudo-random mix of loads and stores over 3 drives, each answered as an I/O path would
/// (asking again until `Go`, completing later): the logged invariants hold in every arbitrating
/// mode, and the backlog never exceeds its bound.
#[test]
fn random_traffic_keeps_the_invariants() {
    for mode in [Mode::Arbitrate, Mode::Slack, Mode::SlackOnline] {
        let t = (mode != Mode::Arbitrate).then(|| table(20_000, 64));
        let mut a = Arbiter::new(config(mode, 3, 50_000), t).unwrap();
        a.record(true);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut waiting: Vec<(Unit, bool)> = Vec::new();
        let mut running: Vec<(u64, u32)> = Vec::new();
        let mut now = 0u64;
        let mut next_job = 1;
        for step in 0..4000u32 {
            now += 500;
            match rnd(6) {
                0 => {
                    let kind = if rnd(2) == 0 { IoKind::Read } else { IoKind::Write };
                    let job = next_job;
                    next_job += 1;
                    let mut bytes = vec![0u64; 3];
                    for b in bytes.iter_mut() {
                        *b = rnd(3) * 1000;
                    }
                    if bytes.iter().all(|&b| b == 0) {
                        bytes[0] = 1000;
                    }
                    if kind == IoKind::Write {
                        match a.accept_store(bytes.iter().sum()) {
                            Ok(Some(k)) => a.bind_store(k, job).unwrap(),
                            Err(SchedError::BacklogFull { .. }) => continue,
                            other => panic!("{other:?}"),
                        }
                    }
                    waiting.push((Unit { job, layer: 0, kind, drive_bytes: bytes }, rnd(10) == 0));
                }
                1 if !running.is_empty() => {
                    let (job, layer) = running.swap_remove(rnd(running.len() as u64) as usize);
                    a.complete(job, layer).unwrap();
                }
                2 => match rnd(4) {
                    0 => a.layer_start(shape(), step % LAYERS, now).unwrap(),
                    1 => a.layer_end(step % LAYERS, now).unwrap(),
                    2 => a.decode_start(100, now).unwrap(),
                    _ => a.decode_end(now),
                },
                _ => {
                    let mut keep = Vec::new();
                    for (u, urgent) in waiting.drain(..) {
                        match a.request(&u, urgent, now).unwrap() {
                            Decision::Go => running.push((u.job, u.layer)),
                            Decision::Wait => keep.push((u, urgent)),
                        }
                    }
                    waiting = keep;
                }
            }
            assert!(a.backlog_bytes() <= 50_000);
        }
        let s = a.stats();
        assert_eq!(s.mixed_issues, 0, "{mode}");
        assert!(s.reads_issued > 100 && s.writes_issued > 20, "{mode}: {s:?}");
        check_log(&a.record(false), 3);
    }
}

/// Two arbiters' announced counts, per (arbiter, drive), as a shared region would hold them.
#[derive(Debug, Default)]
struct Board {
    rows: std::sync::Mutex<HashMap<(usize, usize), DriveCounts>>,
}

#[derive(Debug)]
struct Seat {
    board: Arc<Board>,
    me: usize,
}

impl Peers for Seat {
    fn publish(&self, drive: usize, counts: DriveCounts) {
        self.board.rows.lock().unwrap().insert((self.me, drive), counts);
    }
    fn check(&self, kind: IoKind, drives: &[usize], _now_ns: u64) -> PeerVerdict {
        let rows = self.board.rows.lock().unwrap();
        let blocked = rows.iter().any(|(&(who, d), c)| {
            who != self.me
                && drives.contains(&d)
                && match kind {
                    IoKind::Read => c.writes_in_flight > 0,
                    IoKind::Write => c.reads_in_flight > 0 || c.reads_ready > 0,
                }
        });
        if blocked {
            PeerVerdict::Blocked
        } else {
            PeerVerdict::Clear
        }
    }
}

fn seated(board: &Arc<Board>, me: usize, mode: Mode) -> Arbiter {
    let mut a = arb(mode, 0);
    a.set_peers(Some(Arc::new(Seat { board: board.clone(), me })));
    a
}

#[test]
fn peers_hold_a_unit_the_local_policy_lets_go() {
    let board = Arc::new(Board::default());
    let mut reader = seated(&board, 0, Mode::Arbitrate);
    let mut writer = seated(&board, 1, Mode::Arbitrate);
    bind(&mut writer, 2000, 7);
    // A write in flight in the other process holds a read on its drive.
    assert_eq!(writer.request(&unit(7, 0, IoKind::Write, [1000, 0]), false, 0).unwrap(), Decision::Go);
    assert_eq!(reader.request(&unit(1, 0, IoKind::Read, [1000, 0]), false, 0).unwrap(), Decision::Wait);
    assert_eq!(reader.stats().xproc_waits, 1);
    // The read is ready meanwhile: the writer's next write on that drive defers to it.
    assert_eq!(writer.request(&unit(7, 1, IoKind::Write, [1000, 0]), false, 0).unwrap(), Decision::Wait);
    assert_eq!(writer.stats().xproc_waits, 1);
    // A drive without the other direction is free.
    assert_eq!(reader.request(&unit(2, 0, IoKind::Read, [0, 1000]), false, 0).unwrap(), Decision::Go);
    writer.complete(7, 0).unwrap();
    assert_eq!(reader.request(&unit(1, 0, IoKind::Read, [1000, 0]), false, 0).unwrap(), Decision::Go);
    // The read's announcement was taken back each time it waited: once it finishes and the
    // other read is forgotten, the write goes.
    reader.complete(1, 0).unwrap();
    reader.complete(2, 0).unwrap();
    assert_eq!(writer.request(&unit(7, 1, IoKind::Write, [1000, 0]), false, 0).unwrap(), Decision::Go);
    assert_eq!(board.rows.lock().unwrap()[&(1, 0)].writes_in_flight, 1);
    assert_eq!(board.rows.lock().unwrap()[&(0, 0)], DriveCounts::default());
}

#[test]
fn pass_mode_ignores_the_peers() {
    let board = Arc::new(Board::default());
    let mut reader = seated(&board, 0, Mode::Pass);
    let mut writer = seated(&board, 1, Mode::Arbitrate);
    bind(&mut writer, 1000, 7);
    assert_eq!(writer.request(&unit(7, 0, IoKind::Write, [1000, 0]), false, 0).unwrap(), Decision::Go);
    assert_eq!(reader.request(&unit(1, 0, IoKind::Read, [1000, 0]), false, 0).unwrap(), Decision::Go);
    assert_eq!(reader.stats().xproc_waits, 0);
}

#[test]
fn abandoning_earlier_jobs_frees_their_drives_and_backlog_and_keeps_later_ones() {
    let bound = 1u64 << 48;
    let mut a = arb(Mode::Arbitrate, 0);
    // A dead connection's jobs: a write running on both drives, a read ready, a store's bytes.
    bind(&mut a, 1000, 3);
    assert_eq!(a.request(&unit(3, 0, IoKind::Write, [100, 100]), false, 0).unwrap(), Decision::Go);
    assert_eq!(a.request(&unit(4, 0, IoKind::Read, [100, 0]), false, 0).unwrap(), Decision::Wait);
    // A job of the new connection waits behind them.
    let new_read = unit(bound | 1, 0, IoKind::Read, [0, 100]);
    assert_eq!(a.request(&new_read, false, 0).unwrap(), Decision::Wait);
    assert_eq!(a.backlog_bytes(), 1000);

    assert_eq!(a.abandon_before(bound), 2, "the running write and the ready read");
    assert_eq!(a.backlog_bytes(), 0, "the dead store's bytes are released");
    // The new connection's read is still ready (it was not dropped) and now goes.
    assert_eq!(a.drive_state()[1], (0, 0, 1));
    assert_eq!(a.request(&new_read, false, 0).unwrap(), Decision::Go);
    assert_eq!(a.drive_state(), vec![(0, 0, 0), (1, 0, 0)]);
    // A late completion of an abandoned unit changes nothing.
    assert!(a.complete(3, 0).is_err());
    assert_eq!(a.drive_state(), vec![(0, 0, 0), (1, 0, 0)]);
    a.complete(bound | 1, 0).unwrap();
    assert_eq!(a.drive_state(), vec![(0, 0, 0), (0, 0, 0)]);
    assert_eq!(a.abandon_before(bound), 0);
    check_log(&a.record(false), 2);
}
