//! The controller's data-pointer parser: PRP lists (§4.3) and SGLs (§4.4).
//!
//! Pure functions from a command's data pointer to the device addresses it
//! describes, or the status a strict controller returns for it. List and
//! segment memory is read through a caller-supplied closure, so the same code
//! serves the emulated controller (reads through its IOMMU) and property tests
//! (reads from a plain buffer).

use super::iommu::IommuFault;
use tutti_driver::spec::{SglDescriptor, SglKind, SglSupport, Status};
use tutti_driver::transport::IovaSegment;

/// At most this many SGL descriptors are read for one command; a longer (or
/// looping) chain is refused with Invalid Number of SGL Descriptors.
pub const MAX_SGL_DESCRIPTORS: u64 = 65536;
/// At most this many SGL segments are followed for one command.
pub const MAX_SGL_SEGMENTS: u32 = 4096;

const SGL_DESCRIPTOR_SIZE: u64 = 16;
const PRP_ENTRY_SIZE: u64 = 8;

/// One piece of a command's data buffer, in transfer order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SglPiece {
    /// Host memory the data moves to or from.
    Data(IovaSegment),
    /// Bytes of a read that are discarded (an SGL Bit Bucket, §4.4).
    Skip(u64),
}

impl SglPiece {
    pub fn len(&self) -> u64 {
        match self {
            SglPiece::Data(seg) => seg.len,
            SglPiece::Skip(len) => *len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn push_segment(out: &mut Vec<SglPiece>, iova: u64, len: u64) {
    match out.last_mut() {
        Some(SglPiece::Data(last)) if last.iova.checked_add(last.len) == Some(iova) => last.len += len,
        _ => out.push(SglPiece::Data(IovaSegment { iova, len })),
    }
}

/// Walks PRP1/PRP2 of a command transferring `len` bytes with memory pages of
/// `page_size` bytes (CC.MPS) and returns the host segments, merged where adjacent.
///
/// §4.3: PRP1 may carry a page offset but must be dword aligned. If the data
/// fits in PRP1's page, PRP2 is unused; if it fits in one more page, PRP2 is
/// that page; otherwise PRP2 points at a PRP list (qword aligned, possibly with
/// an offset: the list then runs to the end of its page). When more entries
/// remain than a list page has slots, the last slot chains to the next list
/// page; a list whose remaining entries exactly fill the page has no chain.
/// Every entry after PRP1, chain pointers included, has a zero page offset.
pub fn walk_prp(
    prp1: u64,
    prp2: u64,
    len: u64,
    page_size: u64,
    read: impl FnMut(u64, &mut [u8]) -> Result<(), IommuFault>,
) -> Result<Vec<IovaSegment>, Status> {
    let mut out = Vec::new();
    walk_prp_into(prp1, prp2, len, page_size, read, &mut out)?;
    let segment = |p: SglPiece| match p {
        SglPiece::Data(seg) => Some(seg),
        SglPiece::Skip(_) => None,
    };
    Ok(out.into_iter().filter_map(segment).collect())
}

/// [`walk_prp`] into `out` (cleared first; only [`SglPiece::Data`] pieces), so
/// that a controller reuses one buffer instead of allocating per command.
pub fn walk_prp_into(
    prp1: u64,
    prp2: u64,
    len: u64,
    page_size: u64,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<(), IommuFault>,
    out: &mut Vec<SglPiece>,
) -> Result<(), Status> {
    out.clear();
    if !page_size.is_power_of_two() || page_size < 4096 {
        return Err(Status::INVALID_FIELD);
    }
    if len == 0 {
        return Ok(());
    }
    let offset_mask = page_size - 1;
    if prp1 & 0x3 != 0 {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    let first = len.min(page_size - (prp1 & offset_mask));
    push_segment(out, prp1, first);
    let mut remaining = len - first;
    if remaining == 0 {
        return Ok(());
    }
    if remaining <= page_size {
        if prp2 & offset_mask != 0 {
            return Err(Status::PRP_OFFSET_INVALID);
        }
        push_segment(out, prp2, remaining);
        return Ok(());
    }

    if prp2 & (PRP_ENTRY_SIZE - 1) != 0 {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    let mut entries_left = remaining.div_ceil(page_size);
    let mut list = prp2;
    let mut raw = Vec::new();
    while entries_left > 0 {
        let slots = (page_size - (list & offset_mask)) / PRP_ENTRY_SIZE;
        let chained = entries_left > slots;
        let to_read = if chained { slots } else { entries_left };
        raw.resize((to_read * PRP_ENTRY_SIZE) as usize, 0);
        read(list, &mut raw).map_err(|_| Status::DATA_TRANSFER_ERROR)?;
        let mut entries = raw.chunks_exact(PRP_ENTRY_SIZE as usize).map(|b| {
            let mut word = [0u8; 8];
            word.copy_from_slice(b);
            u64::from_le_bytes(word)
        });
        let data_entries = if chained { to_read - 1 } else { to_read };
        for entry in entries.by_ref().take(data_entries as usize) {
            if entry & offset_mask != 0 {
                return Err(Status::PRP_OFFSET_INVALID);
            }
            let n = remaining.min(page_size);
            push_segment(out, entry, n);
            remaining -= n;
        }
        entries_left -= data_entries;
        if chained {
            let next = entries.next().ok_or(Status::INTERNAL_ERROR)?;
            if next & offset_mask != 0 {
                return Err(Status::PRP_OFFSET_INVALID);
            }
            list = next;
        }
    }
    Ok(())
}

/// Collects the data pieces of an SGL and checks each data descriptor.
struct SglCollector<'a> {
    out: &'a mut Vec<SglPiece>,
    total: u64,
    len: u64,
    mode: SglSupport,
    is_read: bool,
}

impl SglCollector<'_> {
    /// A Data Block or Bit Bucket descriptor (any other type is refused here).
    fn data(&mut self, d: &SglDescriptor) -> Result<(), Status> {
        check_subtype(d)?;
        let len = d.len as u64;
        let piece = match d.kind() {
            SglKind::DataBlock => {
                // §4.4: with dword granularity (SGLS = 10b) the low two bits of
                // a Data Block's address and length are zero.
                if self.mode == SglSupport::DwordAligned && (d.addr & 0x3 != 0 || len & 0x3 != 0) {
                    return Err(Status::SGL_GRANULARITY_INVALID);
                }
                if d.addr.checked_add(len).is_none() {
                    return Err(Status::DATA_SGL_LENGTH_INVALID);
                }
                SglPiece::Data(IovaSegment { iova: d.addr, len })
            }
            // A Bit Bucket discards data the controller reads; a write has no data to discard.
            SglKind::BitBucket if self.is_read => SglPiece::Skip(len),
            _ => return Err(Status::SGL_TYPE_INVALID),
        };
        if len == 0 {
            return Ok(());
        }
        // This controller does not set SGLS bit 18, so an SGL longer than the
        // transfer is as invalid as a shorter one.
        self.total = self.total.checked_add(len).ok_or(Status::DATA_SGL_LENGTH_INVALID)?;
        if self.total > self.len {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        match (self.out.last_mut(), piece) {
            (Some(SglPiece::Data(last)), SglPiece::Data(seg)) if last.iova + last.len == seg.iova => {
                last.len += seg.len
            }
            (Some(SglPiece::Skip(last)), SglPiece::Skip(n)) => *last += n,
            _ => self.out.push(piece),
        }
        Ok(())
    }
}

/// Sub type 0h (Address) is the only one valid over PCIe; the others are for fabrics.
fn check_subtype(d: &SglDescriptor) -> Result<(), Status> {
    if d.subtype() != 0 {
        return Err(Status::SGL_TYPE_INVALID);
    }
    Ok(())
}

fn parse_descriptor(b: &[u8]) -> SglDescriptor {
    let mut addr = [0u8; 8];
    addr.copy_from_slice(&b[0..8]);
    let mut len = [0u8; 4];
    len.copy_from_slice(&b[8..12]);
    SglDescriptor { addr: u64::from_le_bytes(addr), len: u32::from_le_bytes(len), rsvd: [0; 3], id: b[15] }
}

/// Walks the SGL that starts at `sgl1` for a command transferring `len` bytes
/// (`is_read`: controller to host) on a controller with SGL support `mode`.
///
/// §4.4: SGL1 is a Data Block, a Bit Bucket (reads only), a Segment or a Last
/// Segment. A segment is a qword-aligned array of descriptors whose length is a
/// non-zero multiple of 16; only its last descriptor may point to another
/// segment, and a Last Segment's array points nowhere. The described data must
/// equal `len` exactly. Zero-length data descriptors are skipped.
pub fn walk_sgl(
    sgl1: SglDescriptor,
    len: u64,
    mode: SglSupport,
    is_read: bool,
    read: impl FnMut(u64, &mut [u8]) -> Result<(), IommuFault>,
) -> Result<Vec<SglPiece>, Status> {
    let mut out = Vec::new();
    walk_sgl_into(sgl1, len, mode, is_read, read, &mut out)?;
    Ok(out)
}

/// [`walk_sgl`] into `out` (cleared first), so that a controller reuses one
/// buffer instead of allocating per command.
pub fn walk_sgl_into(
    sgl1: SglDescriptor,
    len: u64,
    mode: SglSupport,
    is_read: bool,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<(), IommuFault>,
    out: &mut Vec<SglPiece>,
) -> Result<(), Status> {
    out.clear();
    if mode == SglSupport::None {
        return Err(Status::INVALID_FIELD);
    }
    let mut c = SglCollector { out, total: 0, len, mode, is_read };
    let mut next = match sgl1.kind() {
        SglKind::Segment | SglKind::LastSegment => {
            check_subtype(&sgl1)?;
            Some(sgl1)
        }
        _ => {
            c.data(&sgl1)?;
            None
        }
    };
    let mut segments = 0u32;
    let mut descriptors = 1u64;
    let mut raw = Vec::new();
    while let Some(seg) = next.take() {
        segments += 1;
        if segments > MAX_SGL_SEGMENTS {
            return Err(Status::INVALID_SGL_COUNT);
        }
        let seg_len = seg.len as u64;
        if seg_len == 0 || seg_len & (SGL_DESCRIPTOR_SIZE - 1) != 0 || seg.addr & 0x7 != 0 {
            return Err(Status::INVALID_SGL_SEGMENT);
        }
        let count = seg_len / SGL_DESCRIPTOR_SIZE;
        descriptors += count;
        if descriptors > MAX_SGL_DESCRIPTORS {
            return Err(Status::INVALID_SGL_COUNT);
        }
        raw.resize(seg_len as usize, 0);
        read(seg.addr, &mut raw).map_err(|_| Status::DATA_TRANSFER_ERROR)?;
        let is_last_segment = seg.kind() == SglKind::LastSegment;
        for (i, bytes) in raw.chunks_exact(SGL_DESCRIPTOR_SIZE as usize).enumerate() {
            let d = parse_descriptor(bytes);
            match d.kind() {
                SglKind::Segment | SglKind::LastSegment => {
                    check_subtype(&d)?;
                    if is_last_segment || i as u64 != count - 1 {
                        return Err(Status::INVALID_SGL_SEGMENT);
                    }
                    next = Some(d);
                }
                _ => c.data(&d)?,
            }
        }
    }
    if c.total != len {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;
    const BASE: u64 = 0x10_0000;

    /// Host memory for list and segment reads: `pages` pages starting at BASE.
    struct Mem {
        bytes: Vec<u8>,
        reads: usize,
    }

    impl Mem {
        fn new(pages: u64) -> Mem {
            Mem { bytes: vec![0; (pages * PAGE) as usize], reads: 0 }
        }
        fn put_u64s(&mut self, addr: u64, words: &[u64]) {
            for (i, w) in words.iter().enumerate() {
                let at = (addr - BASE) as usize + i * 8;
                self.bytes[at..at + 8].copy_from_slice(&w.to_le_bytes());
            }
        }
        fn put_sgl(&mut self, addr: u64, descs: &[SglDescriptor]) {
            for (i, d) in descs.iter().enumerate() {
                let at = (addr - BASE) as usize + i * 16;
                self.bytes[at..at + 8].copy_from_slice(&d.addr.to_le_bytes());
                self.bytes[at + 8..at + 12].copy_from_slice(&d.len.to_le_bytes());
                self.bytes[at + 15] = d.id;
            }
        }
        fn reader(&mut self) -> impl FnMut(u64, &mut [u8]) -> Result<(), IommuFault> + '_ {
            move |iova, dst| {
                self.reads += 1;
                let fault = IommuFault { iova, len: dst.len() };
                let start = iova.checked_sub(BASE).ok_or(fault)? as usize;
                let src = self.bytes.get(start..start + dst.len()).ok_or(fault)?;
                dst.copy_from_slice(src);
                Ok(())
            }
        }
    }

    fn seg(iova: u64, len: u64) -> IovaSegment {
        IovaSegment { iova, len }
    }

    fn no_memory(iova: u64, dst: &mut [u8]) -> Result<(), IommuFault> {
        Err(IommuFault { iova, len: dst.len() })
    }

    /// Data pages far from the list memory, never adjacent so segments do not merge.
    fn data_page(i: u64) -> u64 {
        0x8000_0000 + i * 2 * PAGE
    }

    #[test]
    fn prp_within_one_page_ignores_prp2() {
        let segs = walk_prp(0x5000_0100, 0xdead_beef, 0x200, PAGE, no_memory);
        assert_eq!(segs, Ok(vec![seg(0x5000_0100, 0x200)]));
        // Exactly to the end of PRP1's page.
        let segs = walk_prp(0x5000_0f00, 0x3, 0x100, PAGE, no_memory);
        assert_eq!(segs, Ok(vec![seg(0x5000_0f00, 0x100)]));
        assert_eq!(walk_prp(0x2, 0, 0, PAGE, no_memory), Ok(vec![]));
    }

    #[test]
    fn prp1_must_be_dword_aligned() {
        assert_eq!(walk_prp(0x5000_0102, 0, 0x10, PAGE, no_memory), Err(Status::PRP_OFFSET_INVALID));
        assert_eq!(walk_prp(0x5000_0104, 0, 0x10, PAGE, no_memory), Ok(vec![seg(0x5000_0104, 0x10)]));
    }

    #[test]
    fn prp2_is_the_second_page_when_two_suffice() {
        let segs = walk_prp(0x5000_0800, 0x9000_0000, 0x1000, PAGE, no_memory);
        assert_eq!(segs, Ok(vec![seg(0x5000_0800, 0x800), seg(0x9000_0000, 0x800)]));
        // Two full pages.
        let segs = walk_prp(0x5000_0000, 0x9000_0000, 0x2000, PAGE, no_memory);
        assert_eq!(segs, Ok(vec![seg(0x5000_0000, 0x1000), seg(0x9000_0000, 0x1000)]));
        // The second page directly follows the first: one merged segment.
        let segs = walk_prp(0x5000_0800, 0x5000_1000, 0x1000, PAGE, no_memory);
        assert_eq!(segs, Ok(vec![seg(0x5000_0800, 0x1000)]));
        assert_eq!(
            walk_prp(0x5000_0800, 0x9000_0008, 0x1000, PAGE, no_memory),
            Err(Status::PRP_OFFSET_INVALID)
        );
    }

    #[test]
    fn prp2_points_to_a_list_beyond_two_pages() {
        let mut mem = Mem::new(1);
        mem.put_u64s(BASE, &[data_page(1), data_page(2), data_page(3)]);
        let segs = walk_prp(data_page(0) + 0x200, BASE, 3 * PAGE + 0x100, PAGE, mem.reader());
        assert_eq!(
            segs,
            Ok(vec![
                seg(data_page(0) + 0x200, 0xe00),
                seg(data_page(1), PAGE),
                seg(data_page(2), PAGE),
                seg(data_page(3), 0x300),
            ])
        );
    }

    #[test]
    fn prp_list_may_start_at_an_offset_and_runs_to_its_page_end() {
        // A list at offset 0xff0 has two slots; three entries are needed, so
        // slot 0 is data and slot 1 chains to the next list page.
        let mut mem = Mem::new(2);
        mem.put_u64s(BASE + 0xff0, &[data_page(1), BASE + PAGE]);
        mem.put_u64s(BASE + PAGE, &[data_page(2), data_page(3)]);
        let segs = walk_prp(data_page(0), BASE + 0xff0, 4 * PAGE, PAGE, mem.reader()).unwrap();
        assert_eq!(segs, (0..4).map(|i| seg(data_page(i), PAGE)).collect::<Vec<_>>());
        // With exactly two entries needed, both slots are data.
        let mut mem = Mem::new(2);
        mem.put_u64s(BASE + 0xff0, &[data_page(1), data_page(2)]);
        let segs = walk_prp(data_page(0), BASE + 0xff0, 3 * PAGE, PAGE, mem.reader()).unwrap();
        assert_eq!(segs, (0..3).map(|i| seg(data_page(i), PAGE)).collect::<Vec<_>>());
    }

    #[test]
    fn prp_list_pointer_must_be_qword_aligned() {
        let mut mem = Mem::new(1);
        assert_eq!(
            walk_prp(data_page(0), BASE + 4, 3 * PAGE, PAGE, mem.reader()),
            Err(Status::PRP_OFFSET_INVALID)
        );
    }

    #[test]
    fn prp_lists_chain_with_511_entries_per_page() {
        // 600 list entries: page 1 holds 511 data entries and a chain, page 2 holds 89.
        let entries = 600u64;
        let mut mem = Mem::new(2);
        let first: Vec<u64> = (1..=511).map(data_page).chain([BASE + PAGE]).collect();
        let second: Vec<u64> = (512..=entries).map(data_page).collect();
        mem.put_u64s(BASE, &first);
        mem.put_u64s(BASE + PAGE, &second);
        let segs = walk_prp(data_page(0), BASE, (entries + 1) * PAGE, PAGE, mem.reader()).unwrap();
        assert_eq!(segs.len(), entries as usize + 1);
        assert_eq!(segs, (0..=entries).map(|i| seg(data_page(i), PAGE)).collect::<Vec<_>>());
        assert!(segs.iter().all(|s| s.iova != BASE + PAGE), "the chain pointer is not data");
        assert_eq!(mem.reads, 2);
    }

    #[test]
    fn an_exactly_full_prp_list_page_has_no_chain() {
        // 512 entries fill one list page: the last slot is data, not a chain.
        let mut mem = Mem::new(1);
        let list: Vec<u64> = (1..=512).map(data_page).collect();
        mem.put_u64s(BASE, &list);
        let segs = walk_prp(data_page(0), BASE, 513 * PAGE, PAGE, mem.reader()).unwrap();
        assert_eq!(segs.len(), 513);
        assert_eq!(segs[512], seg(data_page(512), PAGE));
        assert_eq!(mem.reads, 1);
        // 513 entries: 511 + chain, then 2 on the next page.
        let mut mem = Mem::new(2);
        let first: Vec<u64> = (1..=511).map(data_page).chain([BASE + PAGE]).collect();
        mem.put_u64s(BASE, &first);
        mem.put_u64s(BASE + PAGE, &[data_page(512), data_page(513)]);
        let segs = walk_prp(data_page(0), BASE, 514 * PAGE, PAGE, mem.reader()).unwrap();
        assert_eq!(segs.last(), Some(&seg(data_page(513), PAGE)));
        assert_eq!(segs.len(), 514);
    }

    #[test]
    fn prp_list_entries_and_chains_must_be_page_aligned() {
        let mut mem = Mem::new(1);
        mem.put_u64s(BASE, &[data_page(1), data_page(2) + 0x200]);
        assert_eq!(
            walk_prp(data_page(0), BASE, 3 * PAGE, PAGE, mem.reader()),
            Err(Status::PRP_OFFSET_INVALID)
        );
        let mut mem = Mem::new(2);
        let first: Vec<u64> = (1..=511).map(data_page).chain([BASE + PAGE + 8]).collect();
        mem.put_u64s(BASE, &first);
        let r = walk_prp(data_page(0), BASE, 600 * PAGE, PAGE, mem.reader());
        assert_eq!(r, Err(Status::PRP_OFFSET_INVALID));
    }

    #[test]
    fn unreadable_prp_list_is_a_data_transfer_error() {
        assert_eq!(walk_prp(data_page(0), BASE, 3 * PAGE, PAGE, no_memory), Err(Status::DATA_TRANSFER_ERROR));
        // A chain that leads out of mapped memory.
        let mut mem = Mem::new(1);
        let first: Vec<u64> = (1..=511).map(data_page).chain([BASE + 64 * PAGE]).collect();
        mem.put_u64s(BASE, &first);
        let r = walk_prp(data_page(0), BASE, 600 * PAGE, PAGE, mem.reader());
        assert_eq!(r, Err(Status::DATA_TRANSFER_ERROR));
    }

    #[test]
    fn prp_honours_larger_memory_pages() {
        let page = 64 * 1024;
        let segs = walk_prp(0x4000_8000, 0x9000_0000, page, page, no_memory);
        assert_eq!(segs, Ok(vec![seg(0x4000_8000, 0x8000), seg(0x9000_0000, 0x8000)]));
        // A 4 KiB-aligned PRP2 is not aligned to a 64 KiB page.
        assert_eq!(
            walk_prp(0x4000_8000, 0x9000_1000, page, page, no_memory),
            Err(Status::PRP_OFFSET_INVALID)
        );
    }

    fn sgl(
        mode: SglSupport,
        is_read: bool,
        sgl1: SglDescriptor,
        len: u64,
        mem: &mut Mem,
    ) -> Result<Vec<SglPiece>, Status> {
        walk_sgl(sgl1, len, mode, is_read, mem.reader())
    }

    const S: SglSupport = SglSupport::Supported;

    #[test]
    fn sgl1_data_block_describes_the_whole_transfer() {
        let mut mem = Mem::new(1);
        let d = SglDescriptor::data_block(0x7000_0003, 0x1001);
        assert_eq!(sgl(S, true, d, 0x1001, &mut mem), Ok(vec![SglPiece::Data(seg(0x7000_0003, 0x1001))]));
        assert_eq!(sgl(S, true, d, 0x1000, &mut mem), Err(Status::DATA_SGL_LENGTH_INVALID));
        assert_eq!(sgl(S, true, d, 0x1002, &mut mem), Err(Status::DATA_SGL_LENGTH_INVALID));
        assert_eq!(mem.reads, 0);
    }

    #[test]
    fn sgl_last_segment_lists_data_blocks() {
        let mut mem = Mem::new(1);
        mem.put_sgl(
            BASE,
            &[
                SglDescriptor::data_block(0x7000_0000, 0x800),
                SglDescriptor::data_block(0x7000_0800, 0x800), // adjacent: merged
                SglDescriptor::data_block(0x9000_0000, 0),     // empty: skipped
                SglDescriptor::data_block(0x9100_0000, 0x200),
            ],
        );
        let r = sgl(S, false, SglDescriptor::last_segment(BASE, 64), 0x1200, &mut mem);
        assert_eq!(
            r,
            Ok(vec![SglPiece::Data(seg(0x7000_0000, 0x1000)), SglPiece::Data(seg(0x9100_0000, 0x200))])
        );
        let r = sgl(S, false, SglDescriptor::last_segment(BASE, 64), 0x1400, &mut mem);
        assert_eq!(r, Err(Status::DATA_SGL_LENGTH_INVALID));
    }

    #[test]
    fn sgl_segments_chain_to_a_last_segment() {
        let mut mem = Mem::new(1);
        mem.put_sgl(
            BASE,
            &[SglDescriptor::data_block(0x7000_0000, 0x100), SglDescriptor::segment(BASE + 0x100, 32)],
        );
        mem.put_sgl(
            BASE + 0x100,
            &[SglDescriptor::data_block(0x7100_0000, 0x100), SglDescriptor::last_segment(BASE + 0x200, 16)],
        );
        mem.put_sgl(BASE + 0x200, &[SglDescriptor::data_block(0x7200_0000, 0x100)]);
        let r = sgl(S, true, SglDescriptor::segment(BASE, 32), 0x300, &mut mem);
        assert_eq!(
            r,
            Ok(vec![
                SglPiece::Data(seg(0x7000_0000, 0x100)),
                SglPiece::Data(seg(0x7100_0000, 0x100)),
                SglPiece::Data(seg(0x7200_0000, 0x100)),
            ])
        );
        // A Segment whose list ends with data is itself the last segment (§4.4).
        let r = sgl(S, true, SglDescriptor::segment(BASE + 0x200, 16), 0x100, &mut mem);
        assert_eq!(r, Ok(vec![SglPiece::Data(seg(0x7200_0000, 0x100))]));
    }

    #[test]
    fn segment_descriptors_only_at_the_end_of_a_segment() {
        let mut mem = Mem::new(1);
        mem.put_sgl(
            BASE,
            &[SglDescriptor::last_segment(BASE + 0x100, 16), SglDescriptor::data_block(0x7000_0000, 0x100)],
        );
        mem.put_sgl(BASE + 0x100, &[SglDescriptor::data_block(0x7100_0000, 0x100)]);
        let r = sgl(S, true, SglDescriptor::segment(BASE, 32), 0x200, &mut mem);
        assert_eq!(r, Err(Status::INVALID_SGL_SEGMENT));
    }

    #[test]
    fn a_last_segment_points_nowhere() {
        let mut mem = Mem::new(1);
        mem.put_sgl(
            BASE,
            &[SglDescriptor::data_block(0x7000_0000, 0x100), SglDescriptor::last_segment(BASE + 0x100, 16)],
        );
        mem.put_sgl(BASE + 0x100, &[SglDescriptor::data_block(0x7100_0000, 0x100)]);
        let r = sgl(S, true, SglDescriptor::last_segment(BASE, 32), 0x200, &mut mem);
        assert_eq!(r, Err(Status::INVALID_SGL_SEGMENT));
        // The same list behind a Segment is fine.
        let r = sgl(S, true, SglDescriptor::segment(BASE, 32), 0x200, &mut mem);
        assert!(r.is_ok());
    }

    #[test]
    fn segment_length_and_alignment() {
        let mut mem = Mem::new(1);
        mem.put_sgl(BASE, &[SglDescriptor::data_block(0x7000_0000, 0x100); 2]);
        for bad in [
            SglDescriptor::last_segment(BASE, 0),
            SglDescriptor::last_segment(BASE, 24),
            SglDescriptor::segment(BASE + 4, 16),
        ] {
            assert_eq!(sgl(S, true, bad, 0x100, &mut mem), Err(Status::INVALID_SGL_SEGMENT), "{bad:?}");
        }
    }

    #[test]
    fn unknown_types_and_subtypes_are_refused() {
        let mut mem = Mem::new(1);
        let mut d = SglDescriptor::data_block(0x7000_0000, 0x100);
        d.id = 0x50; // Transport SGL Data Block
        assert_eq!(sgl(S, true, d, 0x100, &mut mem), Err(Status::SGL_TYPE_INVALID));
        d.id = 0x01; // Data Block, sub type Offset
        assert_eq!(sgl(S, true, d, 0x100, &mut mem), Err(Status::SGL_TYPE_INVALID));
        let mut last = SglDescriptor::last_segment(BASE, 16);
        last.id |= 0x1;
        assert_eq!(sgl(S, true, last, 0x100, &mut mem), Err(Status::SGL_TYPE_INVALID));
        // Inside a segment.
        mem.put_sgl(BASE, &[d]);
        assert_eq!(
            sgl(S, true, SglDescriptor::last_segment(BASE, 16), 0x100, &mut mem),
            Err(Status::SGL_TYPE_INVALID)
        );
    }

    #[test]
    fn bit_buckets_only_for_reads() {
        let mut mem = Mem::new(1);
        mem.put_sgl(
            BASE,
            &[
                SglDescriptor::data_block(0x7000_0000, 0x200),
                SglDescriptor::bit_bucket(0x100),
                SglDescriptor::bit_bucket(0x100),
                SglDescriptor::data_block(0x7000_0200, 0x200),
            ],
        );
        let list = SglDescriptor::last_segment(BASE, 64);
        let r = sgl(S, true, list, 0x600, &mut mem);
        assert_eq!(
            r,
            Ok(vec![
                SglPiece::Data(seg(0x7000_0000, 0x200)),
                SglPiece::Skip(0x200),
                SglPiece::Data(seg(0x7000_0200, 0x200)),
            ])
        );
        assert_eq!(sgl(S, false, list, 0x600, &mut mem), Err(Status::SGL_TYPE_INVALID));
        assert_eq!(
            sgl(S, true, SglDescriptor::bit_bucket(0x200), 0x200, &mut mem),
            Ok(vec![SglPiece::Skip(0x200)])
        );
        assert_eq!(
            sgl(S, false, SglDescriptor::bit_bucket(0x200), 0x200, &mut mem),
            Err(Status::SGL_TYPE_INVALID)
        );
    }

    #[test]
    fn dword_mode_requires_aligned_data_blocks() {
        let mut mem = Mem::new(1);
        let dw = SglSupport::DwordAligned;
        let ok = SglDescriptor::data_block(0x7000_0004, 0x104);
        assert_eq!(sgl(dw, true, ok, 0x104, &mut mem), Ok(vec![SglPiece::Data(seg(0x7000_0004, 0x104))]));
        let bad_addr = SglDescriptor::data_block(0x7000_0002, 0x104);
        assert_eq!(sgl(dw, true, bad_addr, 0x104, &mut mem), Err(Status::SGL_GRANULARITY_INVALID));
        let bad_len = SglDescriptor::data_block(0x7000_0004, 0x103);
        assert_eq!(sgl(dw, true, bad_len, 0x103, &mut mem), Err(Status::SGL_GRANULARITY_INVALID));
        // Byte granularity accepts both.
        assert!(sgl(S, true, bad_addr, 0x104, &mut mem).is_ok());
        assert!(sgl(S, true, bad_len, 0x103, &mut mem).is_ok());
        assert_eq!(sgl(SglSupport::None, true, ok, 0x104, &mut mem), Err(Status::INVALID_FIELD));
    }

    #[test]
    fn looping_chains_are_bounded() {
        let mut mem = Mem::new(1);
        mem.put_sgl(BASE, &[SglDescriptor::segment(BASE, 16)]);
        let r = sgl(S, true, SglDescriptor::segment(BASE, 16), 0x100, &mut mem);
        assert_eq!(r, Err(Status::INVALID_SGL_COUNT));
        assert_eq!(mem.reads, MAX_SGL_SEGMENTS as usize);
        // One segment claiming more descriptors than allowed is refused before it is read.
        let huge = SglDescriptor::last_segment(BASE, (MAX_SGL_DESCRIPTORS as u32) * 16);
        let reads = mem.reads;
        assert_eq!(sgl(S, true, huge, 0x100, &mut mem), Err(Status::INVALID_SGL_COUNT));
        assert_eq!(mem.reads, reads);
    }

    #[test]
    fn unreadable_segment_is_a_data_transfer_error() {
        let r = walk_sgl(SglDescriptor::last_segment(BASE, 16), 0x100, S, true, no_memory);
        assert_eq!(r, Err(Status::DATA_TRANSFER_ERROR));
    }

    #[test]
    fn data_block_wrapping_the_address_space_is_a_length_error() {
        let mut mem = Mem::new(1);
        let d = SglDescriptor::data_block(u64::MAX - 0xff, 0x200);
        assert_eq!(sgl(S, true, d, 0x200, &mut mem), Err(Status::DATA_SGL_LENGTH_INVALID));
    }
}
