//! `include/tutti_gio.h` against `tutti_kernels::abi`: a C++ program compiled
//! by the system compiler prints every struct size, field offset and size and
//! every constant; each must equal the Rust definition.
//!
//! Every Rust struct here derives `IntoBytes` (no padding), so listing fields
//! whose sizes add up to the struct size proves the list is complete; equal C
//! sizes and offsets then leave no room for a field only one side has.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;
use tutti_kernels::abi::*;

fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

struct Layout {
    c_name: &'static str,
    size: usize,
    fields: Vec<(&'static str, usize, usize)>,
}

macro_rules! layout {
    ($rust:ty => $c:literal { $($f:ident),* $(,)? }) => {
        Layout {
            c_name: $c,
            size: size_of::<$rust>(),
            fields: vec![$((stringify!($f), offset_of!($rust, $f), field_size(|s: &$rust| &s.$f))),*],
        }
    };
}

fn layouts() -> Vec<Layout> {
    vec![
        layout!(IoCtx => "tt_ioctx" { dptr, slba, nlb, nsid, table_index, drive, opcode, flags, status,
            cdw12_hi, table, rsvd0, ticket, queue, latency_us }),
        layout!(LayerPair => "tt_pair" { file, block }),
        layout!(IocbHeader => "tt_iocb_hdr" { id, seq, count, kind, nparts, parts_left, completed, failed,
            first_error, done_seq, table, layer, npairs, opcode, rsvd0, pair_list, start_ns, done_ns, pair_first,
            rsvd1, rsvd2 }),
        layout!(Iocb => "tt_iocb" { hdr, pairs, ioctx }),
        layout!(RingCell => "tt_ring_cell" { seq, value }),
        layout!(RingHeader => "tt_ring" { head, pad0, tail, sleepers, wake_seq, pad1, capacity, mask, pad2 }),
        layout!(Control => "tt_control" { stop, running, parts_done, iocbs_done, lost_posts, active_blocks, rsvd0, rsvd }),
        layout!(DriveDesc => "tt_drive" { first_queue, nqueues, nsid, lba_shift, max_lbas, flags, rsvd }),
        layout!(NvmeQueue => "tt_nvmeq" { sq, cq, sq_db, cq_db, slot_owner, slot_time, slot_ready, slot_turn,
            depth, qid, drive, cid_shift, gate, wake, slot_late, pad0, ticket, hole, pad1, sq_tail, tail_lock, dead, pad2, cq_head,
            sq_head, head_lock, rsvd0, pad3, completed, errors, expired, stale, sq_doorbells, cq_doorbells,
            pad4 }),
        layout!(LayerTableDesc => "tt_layer_table" { kind, layers, ndrives, chunks, files, blocks, object_units,
            chunk_units, slots_per_file, unit_shift, entries, entry_count, drive, data_start_lba, staging }),
        layout!(StagingDesc => "tt_staging" { free, base, dptr, nslots, slot_bytes, sgl_drives, page_shift, waits,
            withheld, staged_bytes, held, held_now, reclaimed_reset, reclaimed_late }),
        layout!(QueueGate => "tt_qgate" { recovering, users, epoch, rsvd0, rsvd }),
        layout!(PairListDesc => "tt_pair_list" { pairs, npairs }),
        layout!(ExecCtx => "tt_exec_ctx" { sq_ring, cq_ring, control, iocbs, queues, drives, tables, niocbs,
            nqueues, ndrives, ntables, command_timeout_ns, submit_timeout_ns, max_backoff_ns, idle_sleep_ns,
            pair_lists, npair_lists, rsvd0 }),
    ]
}

fn constants() -> Vec<(&'static str, u64)> {
    vec![
        ("TT_ABI_VERSION", ABI_VERSION as u64),
        ("TT_IOCB_MAX_IOCTX", IOCB_MAX_IOCTX as u64),
        ("TT_IOCTX_INDEX_BITS", IOCTX_INDEX_BITS as u64),
        ("TT_IOCB_MAX_PAIRS", IOCB_MAX_PAIRS as u64),
        ("TT_TABLE_MAX_DRIVES", TABLE_MAX_DRIVES as u64),
        ("TT_WARP_SIZE", WARP_SIZE as u64),
        ("TT_IOCTX_SGL", IOCTX_SGL as u64),
        ("TT_IOCTX_PRP", IOCTX_PRP as u64),
        ("TT_IOCTX_TABLE", IOCTX_TABLE as u64),
        ("TT_STATUS_SUCCESS", STATUS_SUCCESS as u64),
        ("TT_STATUS_PENDING", STATUS_PENDING as u64),
        ("TT_STATUS_KIND_SHIFT", STATUS_KIND_SHIFT as u64),
        ("TT_KIND_NVME", KIND_NVME as u64),
        ("TT_KIND_TIMEOUT", KIND_TIMEOUT as u64),
        ("TT_KIND_TRANSLATION", KIND_TRANSLATION as u64),
        ("TT_KIND_INVALID", KIND_INVALID as u64),
        ("TT_KIND_QUEUE_DEAD", KIND_QUEUE_DEAD as u64),
        ("TT_TIMEOUT_COMPLETION", TIMEOUT_COMPLETION as u64),
        ("TT_TIMEOUT_SUBMIT", TIMEOUT_SUBMIT as u64),
        ("TT_TIMEOUT_STAGING", TIMEOUT_STAGING as u64),
        ("TT_XLATE_DRIVE", XLATE_DRIVE as u64),
        ("TT_XLATE_TABLE", XLATE_TABLE as u64),
        ("TT_XLATE_LAYER", XLATE_LAYER as u64),
        ("TT_XLATE_FILE", XLATE_FILE as u64),
        ("TT_XLATE_BLOCK", XLATE_BLOCK as u64),
        ("TT_XLATE_INDEX", XLATE_INDEX as u64),
        ("TT_XLATE_EMPTY", XLATE_EMPTY as u64),
        ("TT_XLATE_LENGTH", XLATE_LENGTH as u64),
        ("TT_XLATE_PAIR_LIST", XLATE_PAIR_LIST as u64),
        ("TT_XLATE_PAIR_RANGE", XLATE_PAIR_RANGE as u64),
        ("TT_XLATE_UNIT", XLATE_UNIT as u64),
        ("TT_INVALID_OPCODE", INVALID_OPCODE as u64),
        ("TT_INVALID_LENGTH", INVALID_LENGTH as u64),
        ("TT_INVALID_DPTR", INVALID_DPTR as u64),
        ("TT_INVALID_SGL_LENGTH", INVALID_SGL_LENGTH as u64),
        ("TT_INVALID_NO_SGL", INVALID_NO_SGL as u64),
        ("TT_INVALID_SGL_ALIGN", INVALID_SGL_ALIGN as u64),
        ("TT_IOCB_EXPLICIT", IOCB_EXPLICIT as u64),
        ("TT_IOCB_LAYER", IOCB_LAYER as u64),
        ("TT_IOCB_LAYER_LIST", IOCB_LAYER_LIST as u64),
        ("TT_TABLE_UNUSED", TABLE_UNUSED as u64),
        ("TT_TABLE_SGL", TABLE_SGL as u64),
        ("TT_TABLE_PRP", TABLE_PRP as u64),
        ("TT_TABLE_STAGED", TABLE_STAGED as u64),
        ("TT_DRIVE_SGL", DRIVE_SGL as u64),
        ("TT_DRIVE_SGL_DWORD", DRIVE_SGL_DWORD as u64),
        ("TT_SLOT_FREE", SLOT_FREE),
        ("TT_LATE_EXPIRED", LATE_EXPIRED as u64),
        ("TT_LATE_ARRIVED", LATE_ARRIVED as u64),
        ("TT_HELD_VALID", HELD_VALID),
        ("TT_HELD_TICKET_BITS", HELD_TICKET_BITS as u64),
        ("TT_NO_ERROR", NO_ERROR),
        ("TT_STATUS(TT_KIND_TIMEOUT, TT_TIMEOUT_SUBMIT)", status(KIND_TIMEOUT, TIMEOUT_SUBMIT) as u64),
        ("TT_ENTRY(7, 3, 5)", ring_entry(7, 3, 5)),
    ]
}

fn cxx() -> Option<String> {
    let candidates = std::env::var("CXX").into_iter().chain(["c++".to_string(), "g++".to_string()]);
    candidates
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
}

#[test]
fn rust_structs_have_no_unlisted_fields() {
    for l in layouts() {
        let sum: usize = l.fields.iter().map(|f| f.2).sum();
        assert_eq!(sum, l.size, "{}: listed fields cover {sum} of {} bytes", l.c_name, l.size);
    }
}

#[test]
fn header_matches_rust_layout() {
    let Some(cxx) = cxx() else {
        return skip::skip("no C++ compiler (set CXX) to check tutti_gio.h against the Rust layout");
    };
    let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include");
    let mut prog =
        String::from("#include <cstdio>\n#include <cstddef>\n#include \"tutti_gio.h\"\nint main() {\n");
    for l in layouts() {
        let _ = writeln!(prog, "  printf(\"S {0} %zu\\n\", sizeof(struct {0}));", l.c_name);
        for (f, _, _) in &l.fields {
            let _ = writeln!(
                prog,
                "  printf(\"F {0}.{1} %zu %zu\\n\", offsetof(struct {0}, {1}), sizeof(((struct {0}*)0)->{1}));",
                l.c_name, f
            );
        }
    }
    for (name, _) in constants() {
        let _ = writeln!(prog, "  printf(\"C {name} %llu\\n\", (unsigned long long)({name}));");
    }
    prog.push_str("  return 0;\n}\n");

    let dir = std::env::temp_dir().join(format!("tutti-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.cpp");
    let exe = dir.join("layout");
    std::fs::write(&src, prog).unwrap();
    let out = Command::new(&cxx)
        .args(["-std=c++17", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(out.status.success(), "{cxx} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let _ = std::fs::remove_dir_all(&dir);

    let c: BTreeMap<String, Vec<u64>> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let mut w = l.split(' ');
            let kind = w.next().unwrap();
            let name = w.next().unwrap();
            // Constant names may contain spaces (macro calls): the value is the last word.
            let rest: Vec<&str> = w.collect();
            let (name, nums) = if kind == "C" {
                let all = l[2..].rsplit_once(' ').unwrap();
                (all.0.to_string(), vec![all.1.parse().unwrap()])
            } else {
                (name.to_string(), rest.iter().map(|n| n.parse().unwrap()).collect())
            };
            (format!("{kind} {name}"), nums)
        })
        .collect();

    let mut mismatches = Vec::new();
    for l in layouts() {
        let want = vec![l.size as u64];
        if c.get(&format!("S {}", l.c_name)) != Some(&want) {
            mismatches.push(format!(
                "sizeof {}: C {:?}, Rust {}",
                l.c_name,
                c.get(&format!("S {}", l.c_name)),
                l.size
            ));
        }
        for (f, off, size) in &l.fields {
            let key = format!("F {}.{f}", l.c_name);
            let want = vec![*off as u64, *size as u64];
            if c.get(&key) != Some(&want) {
                mismatches.push(format!(
                    "{}.{f} (offset, size): C {:?}, Rust {want:?}",
                    l.c_name,
                    c.get(&key)
                ));
            }
        }
    }
    for (name, value) in constants() {
        let key = format!("C {name}");
        if c.get(&key) != Some(&vec![value]) {
            mismatches.push(format!("{name}: C {:?}, Rust {value}", c.get(&key)));
        }
    }
    assert!(mismatches.is_empty(), "tutti_gio.h and abi.rs disagree:\n{}", mismatches.join("\n"));
}
