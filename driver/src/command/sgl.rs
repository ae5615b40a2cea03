//! Scatter Gather Lists (§4.4) for data pointers.
//!
//! One contiguous buffer is a Data Block inline in the command. Scattered
//! buffers become a Last Segment descriptor in the command pointing at an
//! array of Data Blocks in scratch memory (IOVA-contiguous, qword aligned).

use super::prp::Scratch;
use super::DataPtr;
use crate::error::{DriverError, Result};
use crate::spec::{SglDescriptor, SglSupport};
use crate::transport::IovaSegment;

/// Largest length one Data Block descriptor can carry.
const MAX_BLOCK: u64 = u32::MAX as u64 & !3;

fn for_each_block(segments: &[IovaSegment], mut f: impl FnMut(SglDescriptor) -> Result<()>) -> Result<()> {
    for s in segments {
        let mut off = 0;
        while off < s.len {
            let n = (s.len - off).min(MAX_BLOCK);
            f(SglDescriptor::data_block(s.iova + off, n as u32))?;
            off += n;
        }
    }
    Ok(())
}

/// Checks a segment list against the controller's SGL support and counts descriptors.
pub fn count_blocks(segments: &[IovaSegment], support: SglSupport) -> Result<usize> {
    if !support.available() {
        return Err(DriverError::invalid("the controller does not support SGLs (Identify SGLS = 0)"));
    }
    if segments.is_empty() {
        return Err(DriverError::invalid("empty transfer"));
    }
    let mut n = 0;
    for (i, s) in segments.iter().enumerate() {
        if s.len == 0 {
            return Err(DriverError::invalid(format!("segment {i} is empty")));
        }
        // SGLS = 10b: Data Block address and length must be dword multiples.
        if support == SglSupport::DwordAligned && (s.iova | s.len) & 3 != 0 {
            return Err(DriverError::invalid(format!(
                "segment {i} ({:#x}+{:#x}) breaks the controller's SGL dword alignment rule (SGLS = 10b)",
                s.iova, s.len
            )));
        }
        n += s.len.div_ceil(MAX_BLOCK) as usize;
    }
    Ok(n)
}

/// Builds SGL1 for `segments`, writing a segment array into `scratch` when
/// more than one descriptor is needed.
pub fn build(segments: &[IovaSegment], support: SglSupport, scratch: Scratch<'_>) -> Result<DataPtr> {
    let n = count_blocks(segments, support)?;
    if n == 1 {
        let mut only = None;
        for_each_block(segments, |d| {
            only = Some(d);
            Ok(())
        })?;
        return only.map(DataPtr::Sgl).ok_or_else(|| DriverError::invalid("empty transfer"));
    }
    let bytes = n * 16;
    if bytes > scratch.len || !scratch.offset.is_multiple_of(16) {
        return Err(DriverError::invalid(format!(
            "transfer needs {n} SGL descriptors ({bytes} bytes); {} bytes of segment space available",
            scratch.len
        )));
    }
    let mut at = scratch.offset;
    for_each_block(segments, |d| {
        scratch.buf.write_obj(at, &d)?;
        at += 16;
        Ok(())
    })?;
    Ok(DataPtr::Sgl(SglDescriptor::last_segment(scratch.buf.iova_at(scratch.offset), bytes as u32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dword_rule_is_enforced_only_when_reported() {
        let odd = [IovaSegment { iova: 0x1001, len: 7 }];
        assert!(count_blocks(&odd, SglSupport::Supported).is_ok());
        assert!(count_blocks(&odd, SglSupport::DwordAligned).is_err());
        assert!(count_blocks(&odd, SglSupport::None).is_err());
    }

    #[test]
    fn huge_segments_split_into_several_blocks() {
        let big = [IovaSegment { iova: 0, len: 10 << 30 }];
        assert_eq!(count_blocks(&big, SglSupport::Supported).ok(), Some(3));
    }
}
