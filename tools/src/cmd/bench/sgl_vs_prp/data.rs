//! The objects' bytes: a deterministic pattern written to the drives once per
//! object size, and the check that what a pass read into scattered memory is
//! exactly that, object by object.

use super::scatter::Scatter;
use anyhow::{bail, Context};
use std::sync::Arc;
use tutti_driver::command::DataMode;
use tutti_driver::controller::Controller;
use tutti_driver::transport::{DmaBuffer, IovaSegment};

/// The bytes of `len` from `offset` of drive `drive`'s object area (`offset` and `len` multiples of 8).
pub fn pattern(seed: u64, drive: usize, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    for w in 0..(len / 8) as u64 {
        // splitmix64 of (seed, drive, word): no two words of the run alike in practice.
        let mut x = seed ^ (drive as u64) << 56 ^ (offset / 8 + w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(x ^ (x >> 31)).to_le_bytes());
    }
    out
}

/// A 64-bit FNV-1a style hash over 8-byte words, to show two reads produced the same bytes.
#[derive(Clone, Copy)]
pub struct Checksum(u64);

impl Checksum {
    pub fn new() -> Self {
        Checksum(0xcbf2_9ce4_8422_2325)
    }
    pub fn update(&mut self, bytes: &[u8]) {
        for w in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..w.len()].copy_from_slice(w);
            self.0 = (self.0 ^ u64::from_le_bytes(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

/// Writes `data` at LBA 0 of namespace 1 through an I/O queue pair (SGL where supported).
pub fn write_objects(ctrl: &Arc<Controller>, data: &[u8]) -> anyhow::Result<()> {
    let buf = ctrl.dma().alloc(data.len())?;
    buf.copy_in(0, data)?;
    let mut qp = ctrl.create_io_queue_pair(64)?;
    let seg = IovaSegment { iova: buf.iova(), len: data.len() as u64 };
    qp.write(1, 0, &[seg], DataMode::Auto).with_context(|| format!("writing the objects to {}", ctrl.name()))
}

/// One drive's part of a pass: its source bytes and the scattered memory it read into.
pub struct DriveData<'a> {
    pub source: &'a [u8],
    pub scatter: &'a Scatter,
    pub dst: &'a DmaBuffer,
}

/// Compares every object read with its source, in global object order (object
/// `k` is object `k / drives` of drive `k % drives`), and returns the bytes
/// compared and the checksum of the bytes read. Any differing byte is an error.
pub fn verify(drives: &[DriveData<'_>]) -> anyhow::Result<(u64, Checksum)> {
    let nd = drives.len();
    let total: usize = drives.iter().map(|d| d.scatter.objects).sum();
    let mut sum = Checksum::new();
    let mut piece = Vec::new();
    let mut verified = 0u64;
    for k in 0..total {
        let (d, j) = (k % nd, k / nd);
        let dd = &drives[d];
        let shape = dd.scatter.shape;
        piece.resize(shape.piece_bytes as usize, 0);
        for p in 0..shape.pieces() {
            dd.dst.copy_out(dd.scatter.piece_offset(j, p) as usize, &mut piece)?;
            let at = (j as u64 * shape.object_bytes + p * shape.piece_bytes) as usize;
            let want = &dd.source[at..at + piece.len()];
            if let Some(i) = piece.iter().zip(want).position(|(a, b)| a != b) {
                bail!(
                    "object {k} (drive {d}) piece {p}: byte {} read as {:#04x}, stored as {:#04x}",
                    p * shape.piece_bytes + i as u64,
                    piece[i],
                    want[i]
                );
            }
            sum.update(&piece);
            verified += piece.len() as u64;
        }
    }
    Ok((verified, sum))
}

/// The checksum of the source objects in global order, what [`verify`] must reproduce.
pub fn source_checksum(sources: &[Vec<u8>], object_bytes: u64) -> Checksum {
    let nd = sources.len();
    let per: Vec<usize> = sources.iter().map(|s| s.len() / object_bytes as usize).collect();
    let mut sum = Checksum::new();
    for k in 0..per.iter().sum::<usize>() {
        let (d, j) = (k % nd, k / nd);
        let at = j * object_bytes as usize;
        sum.update(&sources[d][at..at + object_bytes as usize]);
    }
    sum
}
