//! Bad input that used to abort the process or take effect before it was
//! refused: huge sizes, misaligned report buffers, an empty media directory.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::ptr::null_mut;
use tutti::*;

#[test]
fn a_huge_contiguous_registration_is_an_error_not_an_abort() {
    let rt = Rt::open(&config());
    let mem = Mem::new(4096);
    for num_blocks in [u32::MAX, u32::MAX / 2, 1 << 28] {
        let mut l = layout(TUTTI_LAYOUT_CONTIGUOUS, num_blocks);
        l.base = mem.addr();
        // SAFETY: the layout is refused before any of its memory is touched.
        let code = unsafe { tutti_register_kv(rt.0, &l, null_mut()) };
        expect(code, TUTTI_E_INVALID_ARG, "num_blocks");
    }
    // The runtime is still usable: a sane registration works afterwards.
    let mem = Mem::new(2 * 4 * OBJ * LAYERS as usize);
    register_per_layer(&rt, &mem, 4);
    // SAFETY: a live runtime.
    ok(unsafe { tutti_unregister_kv(rt.0) });
}

#[test]
fn a_huge_strided_registration_is_an_error_not_an_abort() {
    let rt = Rt::open(&config());
    let mem = Mem::new(4096);
    let k: Vec<u64> = (0..LAYERS as u64).map(|l| mem.addr() + l * 2 * OBJ as u64).collect();
    let v: Vec<u64> = k.iter().map(|a| a + OBJ as u64).collect();
    let mut l = layout(TUTTI_LAYOUT_STRIDED, u32::MAX);
    l.num_layers = LAYERS;
    l.k_bases = k.as_ptr();
    l.v_bases = v.as_ptr();
    l.block_stride = 2 * LAYERS as u64 * OBJ as u64;
    // SAFETY: the layout is refused before any of its memory is touched.
    expect(unsafe { tutti_register_kv(rt.0, &l, null_mut()) }, TUTTI_E_INVALID_ARG, "num_blocks");
}

/// A strided layout of `num_blocks` blocks `stride` bytes apart from `base`, K and V of each
/// layer one object apart.
fn strided_at(base: u64, num_blocks: u32, stride: u64) -> (Vec<u64>, Vec<u64>, tutti_kv_layout_t) {
    let k: Vec<u64> = (0..LAYERS as u64).map(|l| base + l * 2 * OBJ as u64).collect();
    let v: Vec<u64> = k.iter().map(|a| a + OBJ as u64).collect();
    let mut l = layout(TUTTI_LAYOUT_STRIDED, num_blocks);
    l.num_layers = LAYERS;
    l.block_stride = stride;
    (k, v, l)
}

#[test]
fn unmapped_host_memory_is_refused_before_any_table_is_built() {
    let rt = Rt::open(&config());
    // The C ABI sweep's case: 2^22 blocks 16 MiB apart over addresses nobody mapped (64 TiB).
    let (k, v, mut l) = strided_at(1 << 20, 1 << 22, 16 << 20);
    l.k_bases = k.as_ptr();
    l.v_bases = v.as_ptr();
    let t = std::time::Instant::now();
    // SAFETY: the layout is refused before any of its memory is touched.
    let code = unsafe { tutti_register_kv(rt.0, &l, null_mut()) };
    let msg = last_error();
    assert_eq!(code, TUTTI_E_INVALID_ARG, "{msg}");
    assert!(msg.contains("not all mapped") || msg.contains("TUTTI_MAX_TABLE_BYTES"), "{msg}");
    // Refused on the spot, not after building tables for it (that took 10 s, 25 s under ASan).
    assert!(t.elapsed() < std::time::Duration::from_secs(5), "{:?}", t.elapsed());
    // Within every bound, and still nobody's memory: refused for what it is.
    let (k, v, mut l) = strided_at(1 << 20, 64, 1 << 20);
    l.k_bases = k.as_ptr();
    l.v_bases = v.as_ptr();
    // SAFETY: as above.
    expect(unsafe { tutti_register_kv(rt.0, &l, null_mut()) }, TUTTI_E_INVALID_ARG, "not all mapped");
    // Memory this process has, but read-only: the loads would write it.
    // SAFETY: a fresh private anonymous mapping, unmapped below.
    let ro = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            1 << 20,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(ro, libc::MAP_FAILED);
    let mut l = layout(TUTTI_LAYOUT_CONTIGUOUS, 4);
    l.base = ro as u64;
    // SAFETY: as above.
    expect(unsafe { tutti_register_kv(rt.0, &l, null_mut()) }, TUTTI_E_INVALID_ARG, "readable and writable");
    // SAFETY: the mapping made above, no longer referenced.
    assert_eq!(unsafe { libc::munmap(ro, 1 << 20) }, 0);
    // The runtime is still usable.
    let mem = Mem::new(2 * 4 * OBJ * LAYERS as usize);
    register_per_layer(&rt, &mem, 4);
    // SAFETY: a live runtime.
    ok(unsafe { tutti_unregister_kv(rt.0) });
}

#[test]
fn tables_past_the_byte_bound_are_refused_up_front_naming_it() {
    let rt = Rt::open(&config());
    // SAFETY: plain data; all zeroes is a valid value.
    let mut info: tutti_runtime_info_t = unsafe { std::mem::zeroed() };
    info.struct_size = std::mem::size_of::<tutti_runtime_info_t>() as u32;
    // SAFETY: a live runtime and a full-size struct.
    ok(unsafe { tutti_runtime_info(rt.0, &mut info) });
    // Two emulated drives are two device views: the smallest block count whose two tables
    // pass the bound, well within TUTTI_MAX_TABLE_DESCRIPTORS per table.
    let per_block = LAYERS as u64 * 2 * info.chunks as u64 * 16 * 2;
    let blocks = (TUTTI_MAX_TABLE_BYTES / per_block + 1) as u32;
    assert!((blocks as u64) * LAYERS as u64 * 2 * info.chunks as u64 <= TUTTI_MAX_TABLE_DESCRIPTORS);
    let (k, v, mut l) = strided_at(1 << 20, blocks, 2 * LAYERS as u64 * OBJ as u64);
    l.k_bases = k.as_ptr();
    l.v_bases = v.as_ptr();
    // SAFETY: refused before any of its memory is touched.
    expect(unsafe { tutti_register_kv(rt.0, &l, null_mut()) }, TUTTI_E_INVALID_ARG, "TUTTI_MAX_TABLE_BYTES");
    // One block fewer is within the bound: refused only because the memory is not there.
    let (k, v, mut l) = strided_at(1 << 20, blocks - 1, 2 * LAYERS as u64 * OBJ as u64);
    l.k_bases = k.as_ptr();
    l.v_bases = v.as_ptr();
    // SAFETY: as above.
    expect(unsafe { tutti_register_kv(rt.0, &l, null_mut()) }, TUTTI_E_INVALID_ARG, "not all mapped");
}

#[test]
fn a_rejected_commit_commits_nothing_and_the_session_commits_later() {
    let rt = Rt::open(&config());
    let n = 70usize; // two bitmap words
    let mem = Mem::new(2 * n * OBJ * LAYERS as usize);
    register_per_layer(&rt, &mem, n as u32);
    let keys = hashes(n, 7);
    let blocks: Vec<u32> = (0..n as u32).collect();
    let mut st = null_mut();
    let mut job = null_mut();
    let mut words = [0u64; 3];
    let mut rep = tutti_store_report_t::default();
    // SAFETY: valid handles and buffers, or a deliberately misaligned / short bitmap.
    unsafe {
        ok(tutti_store_begin(rt.0, keys.as_ptr(), blocks.as_ptr(), n, &mut st));
        ok(tutti_store_submit(st, 0, LAYERS, &mut job));
        ok(tutti_job_wait(job, WAIT_MS, null_mut()));

        rep.failed_bitmap = (words.as_mut_ptr() as *mut u8).add(4) as *mut u64;
        rep.failed_bitmap_words = 2;
        expect(tutti_store_commit(st, &mut rep), TUTTI_E_INVALID_ARG, "failed_bitmap");
        assert_eq!(lookup(&rt, &keys, 0).0, 0, "a refused commit makes nothing visible");
        assert_eq!((rep.stored, rep.present, rep.failed), (0, 0, 0));

        rep.failed_bitmap = words.as_mut_ptr();
        rep.failed_bitmap_words = 1;
        expect(tutti_store_commit(st, &mut rep), TUTTI_E_BUFFER_TOO_SMALL, "failed_bitmap");
        assert_eq!(lookup(&rt, &keys, 0).0, 0);

        words = [u64::MAX; 3];
        rep.failed_bitmap_words = 2;
        ok(tutti_store_commit(st, &mut rep));
        assert_eq!((rep.stored, rep.present, rep.failed), (n as u32, 0, 0));
        assert_eq!(words, [0, 0, u64::MAX], "the bitmap is written, only its words");
        assert_eq!(lookup(&rt, &keys, 0).0, n);
        expect(tutti_store_commit(st, &mut rep), TUTTI_E_INVALID_ARG, "already committed");
        ok(tutti_job_destroy(job));
        ok(tutti_store_destroy(st));
    }
}

#[test]
fn a_misaligned_job_status_buffer_is_refused_before_waiting() {
    let rt = Rt::open(&config());
    let mem = Mem::new(2 * 4 * OBJ * LAYERS as usize);
    register_per_layer(&rt, &mem, 4);
    let keys = hashes(4, 9);
    let rep = store_all(&rt, &keys, &[0, 1, 2, 3]);
    assert_eq!(rep.stored, 4);
    let mut words = [0u64; 2];
    let mut job = null_mut();
    // SAFETY: valid handles; the status carries a deliberately misaligned bitmap.
    unsafe {
        ok(tutti_submit_load(rt.0, keys.as_ptr(), [0u32, 1, 2, 3].as_ptr(), 4, 0, LAYERS, &mut job));
        let mut st = status();
        st.failed_bitmap = (words.as_mut_ptr() as *mut u8).add(1) as *mut u64;
        st.failed_bitmap_words = 1;
        expect(tutti_job_wait(job, WAIT_MS, &mut st), TUTTI_E_INVALID_ARG, "failed_bitmap");
        assert_eq!(st.blocks, 0, "the status is not filled when it is refused");
        expect(tutti_job_poll(job, &mut st), TUTTI_E_INVALID_ARG, "failed_bitmap");
        let mut good = status();
        ok(tutti_job_wait(job, WAIT_MS, &mut good));
        assert_eq!((good.blocks, good.failed), (4, 0));
        ok(tutti_job_destroy(job));
    }
}

#[test]
fn an_empty_emulated_dir_is_refused() {
    let mut c = config();
    c.emulated_dir = c"".as_ptr();
    let mut rt = null_mut();
    // SAFETY: valid config and out pointer.
    expect(unsafe { tutti_runtime_open(&c, &mut rt) }, TUTTI_E_INVALID_ARG, "emulated_dir");
    assert!(rt.is_null());
    assert!(!std::path::Path::new("emu0.img").exists(), "nothing was written into the current directory");
}
