//! The objects' bytes: a deterministic pattern written to the drives once per
//! object size, and the check that what a pass read into scattered memory is
//! exactly that, object by object.

use super::scatter::Scatter;
use anyhow::{bail, Context};
use std::sync::Arc;
use tutti_driver::command::DataMode;
use tutti_driver::controller::Controller;
use tutti_driver::transport::{DmaBuffer, IovaSegment};

/// A 64-bit FNV-1a style hash over 8-byte words, to show two reads produced the same bytes.
#[derive(Clone, Copy, Debug)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::bench::sgl_vs_prp::scatter::Shape;
    use crate::pattern::drive_words;
    use tutti_driver::transport::DmaSpace;
    use tutti_emulator::EmuIommu;

    /// Two drives' objects placed where the scatters say, as a correct read leaves them.
    fn placed(shape: Shape, objects: [usize; 2]) -> (Vec<Vec<u8>>, Vec<Scatter>, Vec<DmaBuffer>) {
        let dma = EmuIommu::new("test");
        let mut out = (Vec::new(), Vec::new(), Vec::new());
        for (d, n) in objects.into_iter().enumerate() {
            let src = drive_words(9, d, 0, n * shape.object_bytes as usize);
            let sc = Scatter::new(shape, n, d as u64).unwrap();
            let dst = dma.alloc(n * shape.object_bytes as usize).unwrap();
            for j in 0..n {
                for p in 0..shape.pieces() {
                    let at = (j as u64 * shape.object_bytes + p * shape.piece_bytes) as usize;
                    dst.copy_in(sc.piece_offset(j, p) as usize, &src[at..at + shape.piece_bytes as usize])
                        .unwrap();
                }
            }
            out.0.push(src);
            out.1.push(sc);
            out.2.push(dst);
        }
        out
    }

    #[test]
    fn a_correct_read_verifies_and_hashes_like_the_source() {
        let shape = Shape::new(16384, 4096, 4096, 1 << 20).unwrap();
        let (src, sc, dst) = placed(shape, [3, 2]);
        let drives: Vec<DriveData<'_>> =
            (0..2).map(|d| DriveData { source: &src[d], scatter: &sc[d], dst: &dst[d] }).collect();
        let (n, sum) = verify(&drives).unwrap();
        assert_eq!(n, 5 * 16384);
        assert_eq!(sum.hex(), source_checksum(&src, 16384).hex());
        assert_ne!(drive_words(9, 0, 0, 64), drive_words(9, 1, 0, 64), "drives hold different bytes");
        assert_eq!(
            drive_words(9, 0, 8, 8),
            drive_words(9, 0, 0, 16)[8..],
            "the pattern depends on the offset only"
        );
    }

    #[test]
    fn a_wrong_byte_or_a_swapped_piece_is_named() {
        let shape = Shape::new(16384, 4096, 4096, 1 << 20).unwrap();
        let (src, sc, dst) = placed(shape, [3, 2]);
        let off = sc[1].piece_offset(1, 2) as usize + 5;
        let old: u8 = dst[1].read_obj(off).unwrap();
        dst[1].write_obj(off, &(old ^ 1)).unwrap();
        let drives: Vec<DriveData<'_>> =
            (0..2).map(|d| DriveData { source: &src[d], scatter: &sc[d], dst: &dst[d] }).collect();
        let err = verify(&drives).unwrap_err().to_string();
        assert!(err.contains("object 3 (drive 1) piece 2: byte 8197"), "{err}");
        dst[1].write_obj(off, &old).unwrap();
        // The right bytes in the wrong slot: pieces 0 and 1 of object 0 swapped.
        let (a, b) = (sc[0].piece_offset(0, 0) as usize, sc[0].piece_offset(0, 1) as usize);
        let (mut pa, mut pb) = (vec![0u8; 4096], vec![0u8; 4096]);
        dst[0].copy_out(a, &mut pa).unwrap();
        dst[0].copy_out(b, &mut pb).unwrap();
        dst[0].copy_in(a, &pb).unwrap();
        dst[0].copy_in(b, &pa).unwrap();
        assert!(verify(&drives).unwrap_err().to_string().contains("object 0 (drive 0) piece 0"));
    }
}
