//! Stripe addressing never maps two objects to overlapping LBAs, never
//! touches the superblock or journal, and stays inside every drive.

use proptest::prelude::*;
use std::collections::HashMap;
use tutti_objstore::stripe::{DriveShape, StripeMap};
use tutti_objstore::{Dtype, Geometry};

fn shapes() -> impl Strategy<Value = Vec<DriveShape>> {
    let one = (prop_oneof![Just(512u32), Just(4096u32)], 2_000u64..40_000, 0u32..4).prop_map(
        |(lba, blocks, mdts)| DriveShape {
            lba_size: lba,
            blocks: blocks * 4096 / lba as u64,
            max_transfer: 4096u64 << mdts,
        },
    );
    prop::collection::vec(one, 1..7)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn objects_are_disjoint_and_in_bounds(
        drives in shapes(),
        layers in 1u32..12,
        head_dim in prop_oneof![Just(128u32), Just(256), Just(640)],
        journal_pages in 1u32..20,
    ) {
        let g = Geometry { layers, kv_heads: 2, head_dim, tokens_per_block: 16, dtype: Dtype::Bf16 };
        let Ok(map) = StripeMap::new(&g, &drives, journal_pages) else {
            // Only a drive too small for one file's slots may be refused.
            let slots = (2 * layers as u64).div_ceil(drives.len() as u64);
            let meta = 4096 * (1 + 2 * journal_pages as u64);
            prop_assert!(drives.iter().any(|d| d.blocks * d.lba_size as u64 - meta < slots * g.object_bytes()));
            return Ok(());
        };
        let files = map.files().min(64);
        let mut per_drive: HashMap<u32, Vec<(u64, u64, u32, u32)>> = HashMap::new();
        let mut which: Vec<u32> = (0..files).chain(map.files().saturating_sub(8)..map.files()).collect();
        which.dedup();
        which.sort_unstable();
        which.dedup();
        for f in which {
            for j in 0..map.objects_per_file() {
                let o = map.locate(f, j);
                let r = map.drive(o.drive);
                prop_assert_eq!(o.drive, (f + j) % drives.len() as u32);
                prop_assert!(o.lba >= r.data_start_lba, "object below the data region");
                prop_assert!(o.lba + o.lbas <= r.blocks, "object past the end of drive {}", o.drive);
                prop_assert_eq!(o.lbas * r.lba_size as u64, g.object_bytes());
                // Chunks tile the object exactly, each within one command's limit.
                let mut next = o.lba;
                for c in 0..map.chunks() {
                    let (at, len) = map.locate_chunk(f, j, c);
                    prop_assert_eq!(at.lba, next);
                    prop_assert!(len <= drives.iter().map(|d| d.max_transfer).min().unwrap_or(0));
                    next += at.lbas;
                }
                prop_assert_eq!(next, o.lba + o.lbas);
                per_drive.entry(o.drive).or_default().push((o.lba, o.lba + o.lbas, f, j));
            }
        }
        for (d, mut v) in per_drive {
            v.sort_unstable();
            for w in v.windows(2) {
                prop_assert!(w[0].1 <= w[1].0, "drive {d}: file {} obj {} overlaps file {} obj {}", w[0].2, w[0].3, w[1].2, w[1].3);
            }
            let r = map.drive(d);
            prop_assert!(r.superblock_lbas * r.lba_size as u64 == 4096);
            prop_assert_eq!(r.journal_lba + 2 * r.journal_half_lbas, r.data_start_lba);
        }
    }
}
