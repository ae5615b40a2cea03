//! Journal writer ⇄ recovery, against an in-memory device that can tear writes.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

/// Sparse in-memory drives. `tear` makes the next write persist only its
/// first `n` LBAs and then fail, as a power cut in the middle of a command would.
#[derive(Default)]
struct MemDev {
    lba_size: u64,
    blocks: HashMap<(u32, u64), Vec<u8>>,
    tear: Option<u64>,
    fail_flush: bool,
}

impl MetaDev for MemDev {
    fn read(&mut self, drive: u32, lba: u64, bytes: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(bytes);
        for i in 0..bytes as u64 / self.lba_size {
            match self.blocks.get(&(drive, lba + i)) {
                Some(b) => out.extend_from_slice(b),
                None => out.resize(out.len() + self.lba_size as usize, 0),
            }
        }
        Ok(out)
    }
    fn write(&mut self, drive: u32, lba: u64, data: &[u8]) -> Result<()> {
        let n = data.len() as u64 / self.lba_size;
        let keep = self.tear.take().map_or(n, |t| t.min(n));
        for i in 0..keep {
            let s = (i * self.lba_size) as usize;
            self.blocks.insert((drive, lba + i), data[s..s + self.lba_size as usize].to_vec());
        }
        if keep < n {
            return Err(ObjError::drive("mem", "torn write"));
        }
        Ok(())
    }
    fn flush(&mut self, _drive: u32) -> Result<()> {
        if std::mem::take(&mut self.fail_flush) {
            return Err(ObjError::drive("mem", "flush failed"));
        }
        Ok(())
    }
}

fn place(drive: u32, half_pages: u32) -> JournalPlace {
    JournalPlace { drive, lba_size: 512, half_lba: [8, 8 + half_pages as u64 * 8], half_pages }
}

fn rec(kind: RecordKind, file: FileId, gen: u64, hash: u128) -> Record {
    Record { kind, file, gen, key: Key { identity: IdentityId(9), hash: BlockHash(hash) }, stamp: gen }
}

fn dev() -> MemDev {
    MemDev { lba_size: 512, ..Default::default() }
}

#[test]
fn appends_survive_replay_and_invalidations_remove() {
    let mut d = dev();
    let p = place(1, 8);
    let mut j = DriveJournal::format(&mut d, p, 77, 1).unwrap();
    let batch: Vec<Record> = (0..200).map(|i| rec(RecordKind::Insert, 1 + 2 * i, 1, i as u128)).collect();
    j.append(&mut d, &batch).unwrap();
    j.append(&mut d, &[rec(RecordKind::Invalidate, 3, 1, 0), rec(RecordKind::Insert, 5, 2, 999)]).unwrap();
    let (r, stats) = DriveJournal::replay(&mut d, p, 77, 2, 1000, 2).unwrap();
    assert_eq!(r.live(), j.live());
    assert_eq!(r.live().len(), 199);
    assert_eq!(r.live()[&5].key.hash, BlockHash(999));
    assert_eq!((stats.pages, stats.dropped_pages), (1 + 3 + 1, 0));
    // Another pool's tag or another drive's index sees nothing usable.
    assert!(DriveJournal::replay(&mut d, p, 78, 2, 1000, 2).is_err());
    assert!(DriveJournal::replay(&mut d, place(0, 8), 77, 2, 1000, 2).is_err());
}

#[test]
fn a_torn_tail_is_dropped_and_a_stale_page_is_not_resurrected() {
    let mut d = dev();
    let p = place(0, 16);
    let mut j = DriveJournal::format(&mut d, p, 5, 1).unwrap();
    j.append(&mut d, &[rec(RecordKind::Insert, 0, 1, 1)]).unwrap();
    // A 3-page append of which 1.5 pages land.
    let big: Vec<Record> = (0..200).map(|i| rec(RecordKind::Insert, 2 * i + 2, 1, 100 + i as u128)).collect();
    d.tear = Some(12);
    assert!(j.append(&mut d, &big).is_err());
    let (r, stats) = DriveJournal::replay(&mut d, p, 5, 2, 1000, 2).unwrap();
    assert_eq!(r.live().len(), 1, "the torn append is not applied");
    assert_eq!(stats.dropped_pages, 2, "the torn page and the valid page of its run are dropped");
    // Now let the failed append land completely except its flush, then overwrite
    // its first page with a shorter append: its later pages must stay dead.
    d.fail_flush = true;
    assert!(j.append(&mut d, &big).is_err());
    j.append(&mut d, &[rec(RecordKind::Insert, 4, 1, 4)]).unwrap();
    let (r, _) = DriveJournal::replay(&mut d, p, 5, 2, 1000, 2).unwrap();
    assert_eq!(r.live().keys().copied().collect::<Vec<_>>(), vec![0, 4]);
}

#[test]
fn switching_halves_keeps_live_entries_and_survives_a_torn_snapshot() {
    let mut d = dev();
    let p = place(0, 3);
    let mut j = DriveJournal::format(&mut d, p, 5, 1).unwrap();
    for i in 0..5u32 {
        j.append(&mut d, &[rec(RecordKind::Insert, i, 1, i as u128)]).unwrap();
    }
    assert!(j.epoch() >= 2, "five single-page appends in three-page halves switch halves");
    let (r, _) = DriveJournal::replay(&mut d, p, 5, 1, 1000, 2).unwrap();
    assert_eq!(r.live(), j.live());
    assert_eq!(r.live().len(), 5);
    // A snapshot that fills a whole half, then a switch torn in its first page:
    // replay falls back to the previous half.
    let many: Vec<Record> =
        (5..6 + RECORDS_PER_PAGE as u32).map(|i| rec(RecordKind::Insert, i, 1, i as u128)).collect();
    let before = j.epoch();
    let res = {
        d.tear = Some(4);
        j.append(&mut d, &many)
    };
    assert!(res.is_err());
    assert_eq!(j.epoch(), before);
    let (r, _) = DriveJournal::replay(&mut d, p, 5, 1, 1000, 2).unwrap();
    assert_eq!(r.live(), j.live(), "a torn switch leaves the old half in force");
}

#[derive(Clone, Debug)]
enum Op {
    Append(Vec<(bool, u32)>),
    Torn(Vec<(bool, u32)>, u64),
    FlushFails(Vec<(bool, u32)>),
}

fn op() -> impl Strategy<Value = Op> {
    let batch = prop::collection::vec((any::<bool>(), 0u32..40), 1..120);
    prop_oneof![
        3 => batch.clone().prop_map(Op::Append),
        1 => (batch.clone(), 0u64..40).prop_map(|(b, t)| Op::Torn(b, t)),
        1 => batch.prop_map(Op::FlushFails),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever sequence of appends, failed appends and half switches, replay
    /// yields exactly the entries of the appends that returned Ok — plus,
    /// possibly, those of one append that failed after the last successful
    /// one (a write reported as failed may have landed; a successful append
    /// overwrites or shadows every earlier failed one).
    #[test]
    fn replay_matches_the_successful_appends(ops in prop::collection::vec(op(), 1..30), half in 2u32..6) {
        let mut d = dev();
        let p = place(0, half);
        let mut j = DriveJournal::format(&mut d, p, 42, 3).unwrap();
        let mut model: BTreeMap<FileId, Record> = BTreeMap::new();
        let mut gen = 0u64;
        let mut failed: Vec<Vec<Record>> = Vec::new();
        for op in ops {
            let (batch, tear, fail_flush) = match op {
                Op::Append(b) => (b, None, false),
                Op::Torn(b, t) => (b, Some(t), false),
                Op::FlushFails(b) => (b, None, true),
            };
            let recs: Vec<Record> = batch.iter().map(|&(ins, f)| {
                gen += 1;
                rec(if ins { RecordKind::Insert } else { RecordKind::Invalidate }, f, gen, gen as u128)
            }).collect();
            d.tear = tear;
            d.fail_flush = fail_flush;
            match j.append(&mut d, &recs) {
                Ok(()) => {
                    recs.iter().for_each(|r| apply(&mut model, *r));
                    failed.clear();
                }
                Err(_) => {
                    prop_assert!(tear.is_some() || fail_flush || recs.len() > RECORDS_PER_PAGE * (half as usize - 1));
                    failed.push(recs);
                }
            }
            d.tear = None;
            d.fail_flush = false;
            prop_assert_eq!(j.live(), &model);
        }
        let (r, _) = DriveJournal::replay(&mut d, p, 42, 1, 1000, 7).unwrap();
        let landed = |batch: &Vec<Record>| {
            let mut m = model.clone();
            batch.iter().for_each(|r| apply(&mut m, *r));
            m
        };
        prop_assert!(
            r.live() == &model || failed.iter().any(|b| r.live() == &landed(b)),
            "replay {:?}\nmodel {:?}", r.live(), model
        );
    }
}

/// The page layout is the on-disk format: every field where the module docs put it.
#[test]
fn page_fields_sit_at_their_documented_offsets() {
    let place = JournalPlace { drive: 1, lba_size: 512, half_lba: [8, 16], half_pages: 1 };
    let mut j = DriveJournal {
        place,
        pool_tag: 0x1122_3344_5566_7788,
        half: 0,
        epoch: 5,
        next: 3,
        prev_digest: 0,
        live: BTreeMap::new(),
        nonce: 1,
        must_switch: false,
    };
    let r = Record {
        kind: RecordKind::Invalidate,
        file: 0xabcd,
        gen: 9,
        key: Key { identity: IdentityId(7), hash: BlockHash(u128::MAX - 1) },
        stamp: 42,
    };
    let (b, _) = j.encode_run(&[r, r], 3, false, 0xfeed);
    assert_eq!(b.len(), PAGE);
    let le16 = |at: usize| u16::from_le_bytes(b[at..at + 2].try_into().unwrap());
    let le32 = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let le64 = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    assert_eq!(&b[0..4], b"TJNL");
    assert_eq!((le16(4), le16(6)), (1, 0));
    assert_eq!((le64(8), le64(16)), (0x1122_3344_5566_7788, 5));
    assert_eq!((le32(24), le16(28), le16(30), le32(32)), (3, 2, 1, 1));
    assert_eq!(le32(36), crate::codec::crc_with_hole(&b, 36));
    assert_eq!(le64(40), 0xfeed);
    assert_ne!(le64(48), 0, "the nonce");
    assert_eq!((le32(56), le32(60)), (3, 0));
    for at in [64, 120] {
        assert_eq!((b[at], le32(at + 4), le64(at + 8)), (2, 0xabcd, 9));
        assert_eq!(u128::from_le_bytes(b[at + 16..at + 32].try_into().unwrap()), 7);
        assert_eq!(u128::from_le_bytes(b[at + 32..at + 48].try_into().unwrap()), u128::MAX - 1);
        assert_eq!(le64(at + 48), 42);
    }
    assert!(b[176..].iter().all(|&x| x == 0), "unused records are zero");
}
