//! PRP and SGL builders against the emulated controller's parser: for random
//! buffer layouts and lengths, the controller must read back exactly the
//! segments the driver described.

use proptest::prelude::*;
use tutti_driver::command::prp::{self, Scratch};
use tutti_driver::command::{sgl, DataPtr};
use tutti_driver::spec::SglSupport;
use tutti_driver::transport::{DmaSpace, IovaSegment};
use tutti_emulator::walk::{walk_prp, walk_sgl, SglPiece};
use tutti_emulator::EmuIommu;

const PAGE: u64 = 4096;

fn merged(segs: &[IovaSegment]) -> Vec<IovaSegment> {
    let mut out: Vec<IovaSegment> = Vec::new();
    for s in segs.iter().filter(|s| s.len > 0) {
        match out.last_mut() {
            Some(l) if l.iova + l.len == s.iova => l.len += s.len,
            _ => out.push(*s),
        }
    }
    out
}

/// A PRP-expressible layout: the first piece starts at a dword offset, inner
/// pieces are whole pages, the last may end mid-page; gaps between pieces.
fn prp_layout() -> impl Strategy<Value = (Vec<(u64, u64)>, u64)> {
    (0u64..1024, 1u64..8, proptest::collection::vec((0u64..3, 1u64..4), 0..6), 1u64..PAGE).prop_map(
        |(dw, first_pages, inner, tail)| {
            let mut pieces = Vec::new();
            let mut at = 0x10_0000 + dw * 4;
            let first_len = first_pages * PAGE - dw * 4;
            pieces.push((at, first_len));
            at += first_len;
            for (gap, pages) in inner {
                at += gap * PAGE;
                pieces.push((at, pages * PAGE));
                at += pages * PAGE;
            }
            at += PAGE;
            pieces.push((at, tail));
            let span = at + tail + PAGE;
            (pieces, span)
        },
    )
}

fn check_prp(pieces: &[(u64, u64)], span: u64) -> Result<(), TestCaseError> {
    let mmu = EmuIommu::new("prop");
    let data = mmu.alloc(span as usize).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let lists = mmu.alloc(8 * PAGE as usize).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let segs: Vec<IovaSegment> =
        pieces.iter().map(|&(o, n)| IovaSegment { iova: data.iova() + o - 0x10_0000, len: n }).collect();
    let total: u64 = segs.iter().map(|s| s.len).sum();
    let ptr =
        prp::build(&segs, PAGE, Scratch::whole(&lists)).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let DataPtr::Prp { prp1, prp2 } = ptr else { return Err(TestCaseError::fail("not a PRP pointer")) };
    let walked = walk_prp(prp1, prp2, total, PAGE, |iova, buf| mmu.dma_read(iova, buf))
        .map_err(|s| TestCaseError::fail(format!("controller rejected the PRP: {s}")))?;
    prop_assert_eq!(merged(&walked), merged(&segs));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn prp_round_trips((pieces, span) in prp_layout()) {
        check_prp(&pieces, span)?;
    }

    /// Contiguous buffers of any page count, including lists that need chaining.
    #[test]
    fn prp_long_contiguous(dw in 0u64..1024, pages in 1u64..1100, tail in 0u64..PAGE) {
        let first = PAGE - dw * 4;
        let len = first + (pages - 1) * PAGE + tail;
        check_prp(&[(0x10_0000 + dw * 4, len)], 0x10_0000 + len + 2 * PAGE)?;
    }

    #[test]
    fn sgl_round_trips(
        pieces in proptest::collection::vec((0u64..64, 1u64..20_000), 1..40),
        dword in any::<bool>(),
    ) {
        let mmu = EmuIommu::new("prop");
        let mode = if dword { SglSupport::DwordAligned } else { SglSupport::Supported };
        let span: u64 = pieces.iter().map(|&(g, n)| g * 4 + n + 8).sum::<u64>() + 16;
        let data = mmu.alloc(span as usize).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let seglist = mmu.alloc(PAGE as usize).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut at = data.iova();
        let mut segs = Vec::new();
        for &(gap, n) in &pieces {
            at += gap * 4 + 4;
            let n = if dword { n.next_multiple_of(4) } else { n };
            segs.push(IovaSegment { iova: at, len: n });
            at += n.next_multiple_of(4);
        }
        let total: u64 = segs.iter().map(|s| s.len).sum();
        let ptr = sgl::build(&segs, mode, Scratch::whole(&seglist)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let DataPtr::Sgl(d) = ptr else { return Err(TestCaseError::fail("not an SGL pointer")) };
        let walked = walk_sgl(d, total, mode, true, |iova, buf| mmu.dma_read(iova, buf))
            .map_err(|s| TestCaseError::fail(format!("controller rejected the SGL: {s}")))?;
        let data_segs: Vec<IovaSegment> = walked
            .iter()
            .map(|p| match p { SglPiece::Data(s) => Ok(*s), SglPiece::Skip(_) => Err(TestCaseError::fail("unexpected bit bucket")) })
            .collect::<Result<_, _>>()?;
        prop_assert_eq!(merged(&data_segs), merged(&segs));
    }
}

#[test]
fn exactly_full_list_page_has_no_chain() {
    // 513 pages: PRP1 + 512 list entries, which fill one list page exactly.
    let mmu = EmuIommu::new("t");
    let Ok(data) = mmu.alloc(513 * PAGE as usize) else { panic!("alloc") };
    let Ok(lists) = mmu.alloc(2 * PAGE as usize) else { panic!("alloc") };
    let seg = [IovaSegment { iova: data.iova(), len: 513 * PAGE }];
    let Ok(DataPtr::Prp { prp1, prp2 }) = prp::build(&seg, PAGE, Scratch::whole(&lists)) else {
        panic!("build")
    };
    assert_eq!(prp1, data.iova());
    assert_eq!(prp2, lists.iova());
    let last: u64 = lists.read_obj(511 * 8).unwrap_or(0);
    assert_eq!(last, data.iova() + 512 * PAGE, "last slot holds data, not a chain pointer");
    let second: u64 = lists.read_obj(PAGE as usize).unwrap_or(1);
    assert_eq!(second, 0, "second list page unused");
    let walked = walk_prp(prp1, prp2, 513 * PAGE, PAGE, |i, b| mmu.dma_read(i, b));
    assert_eq!(walked.map(|w| merged(&w)), Ok(seg.to_vec()));
}

#[test]
fn one_more_entry_chains_to_a_second_list_page() {
    let mmu = EmuIommu::new("t");
    let Ok(data) = mmu.alloc(514 * PAGE as usize) else { panic!("alloc") };
    let Ok(lists) = mmu.alloc(2 * PAGE as usize) else { panic!("alloc") };
    let seg = [IovaSegment { iova: data.iova(), len: 514 * PAGE }];
    let Ok(DataPtr::Prp { prp1, prp2 }) = prp::build(&seg, PAGE, Scratch::whole(&lists)) else {
        panic!("build")
    };
    let chain: u64 = lists.read_obj(511 * 8).unwrap_or(0);
    assert_eq!(chain, lists.iova() + PAGE, "slot 511 chains to the next list page");
    let walked = walk_prp(prp1, prp2, 514 * PAGE, PAGE, |i, b| mmu.dma_read(i, b));
    assert_eq!(walked.map(|w| merged(&w)), Ok(seg.to_vec()));
}
