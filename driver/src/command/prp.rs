//! Physical Region Page lists (§4.3).
//!
//! PRP1 names the first byte (any dword-aligned offset); every further entry
//! names a whole memory page. Two pages fit in PRP1/PRP2; more need a list:
//! a list page holds `page/8` entries and, when more remain than fit, its last
//! slot points at the next list page. A list that exactly fills a page keeps
//! its last slot for data.

use super::DataPtr;
use crate::error::{DriverError, Result};
use crate::transport::{DmaBuffer, IovaSegment};

/// Device memory a builder may write list pages (PRP lists or SGL segments) into.
#[derive(Clone, Copy)]
pub struct Scratch<'a> {
    pub buf: &'a DmaBuffer,
    /// Byte offset of the area in `buf`; page aligned for PRP lists.
    pub offset: usize,
    pub len: usize,
}

impl<'a> Scratch<'a> {
    pub fn whole(buf: &'a DmaBuffer) -> Self {
        Scratch { buf, offset: 0, len: buf.len() }
    }
}

/// Number of PRP entries (PRP1 included) a segment list needs, after checking
/// that PRP can describe it: only the first segment may start off a page
/// boundary (at a dword), and only the last may end off one.
pub fn count_entries(segments: &[IovaSegment], page: u64) -> Result<usize> {
    let mask = page - 1;
    let last = segments.len().checked_sub(1).ok_or_else(|| DriverError::invalid("empty transfer"))?;
    let mut n = 0usize;
    for (i, s) in segments.iter().enumerate() {
        if s.len == 0 {
            return Err(DriverError::invalid(format!("segment {i} is empty")));
        }
        if i == 0 && s.iova & 3 != 0 {
            return Err(DriverError::invalid(format!(
                "PRP cannot describe a buffer at {:#x}: PRP1 must be dword aligned (§4.3)",
                s.iova
            )));
        }
        if i > 0 && s.iova & mask != 0 {
            return Err(DriverError::invalid(format!(
                "PRP cannot describe segment {i} at {:#x}: it does not start on a {page}-byte page",
                s.iova
            )));
        }
        let end = s.iova + s.len;
        if i < last && end & mask != 0 {
            return Err(DriverError::invalid(format!(
                "PRP cannot describe segment {i} ending at {end:#x}: only the last segment may end inside a page"
            )));
        }
        n += ((end - 1) / page - s.iova / page + 1) as usize;
    }
    Ok(n)
}

/// List pages needed for `n` entries (PRP1 included).
pub fn list_pages(n: usize, page: u64) -> usize {
    let per_page = (page / 8) as usize;
    match n {
        0..=2 => 0,
        _ => {
            let m = n - 1;
            if m <= per_page {
                1
            } else {
                1 + (m - per_page).div_ceil(per_page - 1)
            }
        }
    }
}

fn for_each_entry(segments: &[IovaSegment], page: u64, mut f: impl FnMut(u64) -> Result<()>) -> Result<()> {
    for s in segments {
        let end = s.iova + s.len;
        f(s.iova)?;
        let mut a = (s.iova & !(page - 1)) + page;
        while a < end {
            f(a)?;
            a += page;
        }
    }
    Ok(())
}

/// Builds PRP1/PRP2 for `segments`, writing any list pages into `scratch`.
pub fn build(segments: &[IovaSegment], page: u64, scratch: Scratch<'_>) -> Result<DataPtr> {
    let n = count_entries(segments, page)?;
    let pages = list_pages(n, page);
    let page_bytes = page as usize;
    if pages * page_bytes > scratch.len || !scratch.offset.is_multiple_of(page_bytes) {
        return Err(DriverError::invalid(format!(
            "transfer needs {pages} PRP list pages; {} bytes of list space available",
            scratch.len
        )));
    }
    let per_page = page_bytes / 8;
    let mut prp1 = 0;
    let mut prp2 = 0;
    let mut idx = 0usize;
    let (mut list_page, mut slot) = (0usize, 0usize);
    let list_iova = |p: usize| scratch.buf.iova_at(scratch.offset + p * page_bytes);
    for_each_entry(segments, page, |e| {
        let i = idx;
        idx += 1;
        match (i, n) {
            (0, _) => prp1 = e,
            (1, 2) => prp2 = e,
            _ => {
                if i == 1 {
                    prp2 = list_iova(0);
                }
                let remaining = n - i;
                if slot == per_page - 1 && remaining > 1 {
                    // §4.3: the last entry of a full list page chains to the next one.
                    let at = scratch.offset + list_page * page_bytes + slot * 8;
                    scratch.buf.write_obj(at, &list_iova(list_page + 1))?;
                    list_page += 1;
                    slot = 0;
                }
                let at = scratch.offset + list_page * page_bytes + slot * 8;
                scratch.buf.write_obj(at, &e)?;
                slot += 1;
            }
        }
        Ok(())
    })?;
    Ok(DataPtr::Prp { prp1, prp2 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(iova: u64, len: u64) -> IovaSegment {
        IovaSegment { iova, len }
    }

    #[test]
    fn counts_pages_spanned() {
        assert_eq!(count_entries(&[seg(0x1000, 0x1000)], 4096).ok(), Some(1));
        assert_eq!(count_entries(&[seg(0x1800, 0x1000)], 4096).ok(), Some(2));
        assert_eq!(count_entries(&[seg(0x1800, 0x800), seg(0x5000, 0x2001)], 4096).ok(), Some(4));
    }

    #[test]
    fn rejects_layouts_prp_cannot_express() {
        assert!(count_entries(&[seg(0x1002, 8)], 4096).is_err());
        assert!(count_entries(&[seg(0x1000, 0x800), seg(0x3000, 8)], 4096).is_err());
        assert!(count_entries(&[seg(0x1000, 0x1000), seg(0x3800, 8)], 4096).is_err());
        assert!(count_entries(&[], 4096).is_err());
    }

    #[test]
    fn list_page_counts() {
        assert_eq!(list_pages(2, 4096), 0);
        assert_eq!(list_pages(3, 4096), 1);
        assert_eq!(list_pages(513, 4096), 1); // 512 list entries: exactly full, no chain
        assert_eq!(list_pages(514, 4096), 2); // 513: 511 + chain, then 2
        assert_eq!(list_pages(1 + 511 + 512, 4096), 2);
        assert_eq!(list_pages(1 + 511 + 513, 4096), 3);
    }
}
