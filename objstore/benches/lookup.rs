//! The CPU-side lookups on a layer's path, each next to a baseline measured in
//! the same run:
//! - SGL table lookup: the descriptors of one layer of a 1024-block request by
//!   the table's index arithmetic (baseline: the same descriptors from a HashMap);
//! - index lookup: the 1024 chained hashes of a 16K-token request against an
//!   index of 65536 files, with LRU upkeep (baseline: the bare HashMap probes).
//!
//! Ratios (lookup time / baseline) are printed at the end.

// A benchmark is a test harness: a broken setup aborts it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};
use tutti_driver::spec::SglDescriptor;
use tutti_objstore::hash::{chain_hashes, BlockHash, IdentityId};
use tutti_objstore::index::{Index, Key, Reserve};
use tutti_objstore::registration::table_index;

const LAYERS: u32 = 32;
const CHUNKS: u32 = 1;
const BLOCKS: u32 = 4096;
const REQUEST: u32 = 1024;
const FILES: u32 = 65536;

struct Tables {
    descs: Vec<SglDescriptor>,
    map: HashMap<(u32, u32, u32, u32), SglDescriptor>,
    blocks: Vec<u32>,
}

fn tables() -> Tables {
    let mut descs = Vec::new();
    let mut map = HashMap::new();
    for b in 0..BLOCKS {
        for layer in 0..LAYERS {
            for kv in 0..2 {
                for c in 0..CHUNKS {
                    let d = SglDescriptor::data_block(0x10_0000_0000 + descs.len() as u64 * 32768, 32768);
                    assert_eq!(table_index(LAYERS, CHUNKS, b, layer, kv, c), descs.len());
                    descs.push(d);
                    map.insert((b, layer, kv, c), d);
                }
            }
        }
    }
    // A request's blocks are wherever the engine put them.
    let blocks = (0..REQUEST).map(|i| (i * 2654435761u32.wrapping_add(i)) % BLOCKS).collect();
    Tables { descs, map, blocks }
}

fn layer_by_index(t: &Tables, layer: u32) -> u64 {
    let mut sum = 0u64;
    for &b in &t.blocks {
        for kv in 0..2 {
            sum = sum.wrapping_add(t.descs[table_index(LAYERS, CHUNKS, b, layer, kv, 0)].addr);
        }
    }
    sum
}

fn layer_by_map(t: &Tables, layer: u32) -> u64 {
    let mut sum = 0u64;
    for &b in &t.blocks {
        for kv in 0..2 {
            sum = sum.wrapping_add(t.map.get(&(b, layer, kv, 0)).map_or(0, |d| d.addr));
        }
    }
    sum
}

struct Indexed {
    index: Index,
    map: HashMap<Key, u32>,
    identity: IdentityId,
    request: Vec<BlockHash>,
}

/// An index filled with 64 requests' chains (the measured one among them).
fn indexed() -> Indexed {
    let identity = IdentityId(0x74_7574_7469);
    let mut index = Index::new(FILES).unwrap();
    let mut map = HashMap::new();
    let mut request = Vec::new();
    for r in 0..FILES / REQUEST {
        let tokens: Vec<u32> = (0..REQUEST * 16).map(|t| t.wrapping_mul(31) ^ r << 20).collect();
        let hashes = chain_hashes(&tokens, 16);
        for &hash in &hashes {
            let key = Key { identity, hash };
            let Some(Reserve::New { file, .. }) = index.reserve(key) else { panic!("index full") };
            index.commit(file).expect("commit a reserved file");
            map.insert(key, file);
        }
        if r == 7 {
            request = hashes;
        }
    }
    Indexed { index, map, identity, request }
}

fn probe_map(x: &Indexed) -> usize {
    let mut n = 0;
    for &hash in &x.request {
        if !x.map.contains_key(&Key { identity: x.identity, hash }) {
            break;
        }
        n += 1;
    }
    n
}

fn time(mut f: impl FnMut(), rounds: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..rounds {
        f();
    }
    t.elapsed().as_secs_f64()
}

fn bench(c: &mut Criterion) {
    let t = tables();
    assert_eq!(layer_by_index(&t, 3), layer_by_map(&t, 3), "both lookups find the same descriptors");
    let mut g = c.benchmark_group("sgl_table_lookup");
    g.throughput(Throughput::Elements(2 * REQUEST as u64));
    g.bench_function("table index, one layer", |b| b.iter(|| black_box(layer_by_index(&t, 5))));
    g.bench_function("baseline HashMap, one layer", |b| b.iter(|| black_box(layer_by_map(&t, 5))));
    g.finish();

    let mut x = indexed();
    assert_eq!(x.index.lookup(x.identity, &x.request, false).len(), REQUEST as usize);
    assert_eq!(probe_map(&x), REQUEST as usize);
    let mut g = c.benchmark_group("index_lookup");
    g.throughput(Throughput::Elements(REQUEST as u64));
    g.bench_function("Index::lookup, 1024 hits", |b| {
        b.iter(|| black_box(x.index.lookup(x.identity, &x.request, false).len()))
    });
    g.bench_function("baseline HashMap probes", |b| b.iter(|| black_box(probe_map(&x))));
    g.finish();

    let table = time(|| _ = black_box(layer_by_index(&t, 9)), 2000)
        / time(|| _ = black_box(layer_by_map(&t, 9)), 2000);
    let (identity, request) = (x.identity, x.request.clone());
    let index = time(|| drop(black_box(x.index.lookup(identity, &request, false))), 200)
        / time(|| _ = black_box(probe_map(&x)), 200);
    println!("ratio SGL table index / HashMap: {table:.3}");
    println!("ratio Index::lookup / HashMap probes: {index:.2}");
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300));
    targets = bench
}
criterion_main!(benches);
