//! The P2P data path through the C ABI (ABI 1.10): memory registered as
//! `TUTTI_MEMORY_DEVICE_P2P` is mapped for the drives with `map_device` and
//! probed; on emulated drives (whose IOMMU accepts any page-aligned memory as
//! device memory: a stand-in for a BAR mapping, which no machine here has) the
//! probe passes and the data path is P2P, round tripping byte for byte, with
//! the provider named; `TUTTI_P2P=off` keeps it staged and says why; a caller
//! built against ABI 1.4..1.9 passes the smaller `tutti_data_path_t` and gets
//! exactly its fields.

// Test code: a panic is how a test fails (the shared fixtures expect() too).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::mem::size_of;
use std::ptr;
use tutti::*;

const BLOCKS: u32 = 6;

fn data_path(rt: &Rt) -> tutti_data_path_t {
    // SAFETY: all-zero bytes are a valid tutti_data_path_t (integers and bytes).
    let mut d: tutti_data_path_t = unsafe { std::mem::zeroed() };
    d.struct_size = size_of::<tutti_data_path_t>() as u32;
    // SAFETY: a live handle and a writable struct.
    ok(unsafe { tutti_runtime_data_path(rt.0, &mut d) });
    d
}

fn text(bytes: &[std::ffi::c_char]) -> String {
    let b: Vec<u8> = bytes.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&b).into_owned()
}

fn register(rt: &Rt, mem: &Mem) -> i32 {
    let per_layer = 2 * BLOCKS as u64 * OBJ as u64;
    let bases: Vec<u64> = (0..LAYERS as u64).map(|l| mem.addr() + l * per_layer).collect();
    let mut l = layout(TUTTI_LAYOUT_VLLM_PER_LAYER, BLOCKS);
    l.num_layers = LAYERS;
    l.k_bases = bases.as_ptr();
    l.memory = TUTTI_MEMORY_DEVICE_P2P;
    // SAFETY: `mem` holds every object and outlives the runtime's registration.
    unsafe { tutti_register_kv(rt.0, &l, ptr::null_mut()) }
}

fn filled() -> Mem {
    let mut mem = Mem::new(2 * BLOCKS as usize * OBJ * LAYERS as usize);
    for (i, b) in mem.bytes().iter_mut().enumerate() {
        *b = ((i % 239) as u8).wrapping_add(3);
    }
    mem
}

#[test]
fn device_memory_goes_p2p_and_reports_its_provider() {
    let rt = Rt::open(&config());
    let mut mem = filled();
    ok(register(&rt, &mem));
    let d = data_path(&rt);
    assert_eq!((d.mode, d.memory), (TUTTI_DATA_PATH_P2P, TUTTI_MEMORY_DEVICE_P2P));
    assert_eq!(text(&d.p2p_provider), "caller-mapped device memory");
    assert_eq!((text(&d.p2p_missing), d.staging_slots), (String::new(), 0));
    let keys = hashes(3, 9);
    let want: Vec<Vec<u8>> = (0..3).map(|b| block_bytes(&mut mem, b, BLOCKS)).collect();
    let rep = store_all(&rt, &keys, &[0, 1, 2]);
    assert_eq!((rep.stored, rep.failed), (3, 0));
    mem.bytes().fill(0);
    let st = load_all(&rt, &keys, &[5, 4, 3]);
    assert_eq!((st.done, st.failed), (1, 0));
    for (i, b) in [5usize, 4, 3].into_iter().enumerate() {
        assert!(block_bytes(&mut mem, b, BLOCKS) == want[i], "chunk {i} in block {b}: every byte");
    }
    assert_eq!(data_path(&rt).staged_bytes, 0, "no staging slot was used");

    // A caller of ABI 1.4..1.9 passes the 304-byte struct: its bytes are filled, none past them.
    let mut old = [0xA5u8; 368];
    old[..4].copy_from_slice(&304u32.to_ne_bytes());
    // SAFETY: 368 writable bytes, aligned for the struct (a u8 array is not: copy to one that is).
    let mut buf: tutti_data_path_t = unsafe { std::mem::transmute(old) };
    // SAFETY: a live handle; the struct says it is 304 bytes long.
    ok(unsafe { tutti_runtime_data_path(rt.0, &mut buf) });
    // SAFETY: reading back the bytes of a plain struct.
    let back: [u8; 368] = unsafe { std::mem::transmute(buf) };
    assert_eq!(u32::from_ne_bytes(back[4..8].try_into().unwrap()), TUTTI_DATA_PATH_P2P);
    assert!(back[304..].iter().all(|&b| b == 0xA5), "nothing past the caller's 304 bytes was written");
}

#[test]
fn the_p2p_setting_off_keeps_device_memory_staged() {
    // Set for this process only; the other test in this binary reads no TUTTI_P2P (run by itself
    // through a child so the environment of the other test is untouched).
    if std::env::var_os("TUTTI_P2P_CHILD").is_none() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args(["--exact", "the_p2p_setting_off_keeps_device_memory_staged", "--nocapture"])
            .env("TUTTI_P2P_CHILD", "1")
            .env("TUTTI_P2P", "off")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        return;
    }
    let rt = Rt::open(&config());
    let mem = filled();
    ok(register(&rt, &mem));
    let d = data_path(&rt);
    assert_eq!((d.mode, d.memory), (TUTTI_DATA_PATH_STAGED, TUTTI_MEMORY_DEVICE_P2P));
    assert!(text(&d.p2p_missing).contains("P2P is off"), "{}", text(&d.p2p_missing));
    assert_eq!(text(&d.p2p_provider), "caller-mapped device memory");
}
