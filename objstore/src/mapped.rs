//! Whether ranges of this process's address space are mapped readable and writable, from
//! `/proc/self/maps`.
//!
//! A registration of host KV memory is checked against it before anything is mapped for the
//! drives or any table is built: the drives (and, on the staged path, the executor's copies)
//! read and write every byte of it, and memory that is not there would otherwise be found
//! only when a transfer faults (or, for an emulated drive, after seconds of building tables for
//! addresses that hold nothing).

use crate::error::{ObjError, Result};
use crate::layout::MemRegion;

/// Most bytes of `/proc/self/maps` read (about 100 bytes a line: far more mappings than a
/// process may have by default, `vm.max_map_count` = 65530).
const MAPS_MAX: u64 = 64 << 20;

/// A mapping: [start, end) and whether it is readable and writable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mapping {
    start: u64,
    end: u64,
    rw: bool,
}

/// The mappings of this process, sorted by address.
fn own_mappings() -> Result<Vec<Mapping>> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open("/proc/self/maps")
        .and_then(|f| f.take(MAPS_MAX).read_to_string(&mut text))
        .map_err(|e| ObjError::invalid("memory", format!("cannot read /proc/self/maps to check it: {e}")))?;
    Ok(parse(&text))
}

/// Parses `/proc/<pid>/maps` lines ("start-end perms offset dev inode path"); lines that do not
/// parse are skipped (none should).
fn parse(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (start, end) = f.next()?.split_once('-')?;
            let perms = f.next()?.as_bytes();
            Some(Mapping {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                rw: perms.first() == Some(&b'r') && perms.get(1) == Some(&b'w'),
            })
        })
        .collect();
    out.sort_unstable_by_key(|m| m.start);
    out
}

/// The first address of `r` that no readable and writable mapping covers, if any.
fn first_hole(maps: &[Mapping], r: &MemRegion) -> Option<u64> {
    let Some(end) = r.addr.checked_add(r.len) else { return Some(r.addr) };
    let mut at = r.addr;
    while at < end {
        // The last mapping starting at or before `at`.
        let Some(i) = maps.partition_point(|m| m.start <= at).checked_sub(1) else { return Some(at) };
        let m = maps[i];
        if !m.rw || m.end <= at {
            return Some(at);
        }
        at = m.end;
    }
    None
}

/// Refuses `regions` unless every byte of them is mapped readable and writable in this process.
pub(crate) fn check_host_mapped(regions: &[MemRegion]) -> Result<()> {
    let maps = own_mappings()?;
    for r in regions {
        if let Some(hole) = first_hole(&maps, r) {
            return Err(ObjError::invalid(
                "memory",
                format!(
                    "the KV memory {:#x}+{:#x} is not all mapped readable and writable in this process \
                     ({hole:#x} is not); register memory the process has allocated",
                    r.addr, r.len
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
00651000-00652000 r--p 00051000 08:02 173521      /usr/bin/dbus-daemon
00652000-00655000 rw-p 00052000 08:02 173521      /usr/bin/dbus-daemon
00e03000-00e24000 rw-p 00000000 00:00 0           [heap]
00e24000-011f7000 rw-p 00000000 00:00 0           [heap]
7fff0000-7fff1000 rw-p 00000000 00:00 0
";

    fn region(addr: u64, len: u64) -> MemRegion {
        MemRegion { addr, len }
    }

    #[test]
    fn holes_and_read_only_pages_are_found_adjacent_mappings_join() {
        let maps = parse(MAPS);
        assert_eq!(maps.len(), 6);
        // Across two adjacent rw mappings.
        assert_eq!(first_hole(&maps, &region(0x00e03000, 0x011f7000 - 0x00e03000)), None);
        // Read-only, executable, unmapped, and past the end of a mapping.
        assert_eq!(first_hole(&maps, &region(0x00651000, 0x100)), Some(0x00651000));
        assert_eq!(first_hole(&maps, &region(0x00400000, 0x10)), Some(0x00400000));
        assert_eq!(first_hole(&maps, &region(0x1000, 0x10)), Some(0x1000), "below every mapping");
        assert_eq!(first_hole(&maps, &region(0x01300000, 0x10)), Some(0x01300000), "between mappings");
        assert_eq!(first_hole(&maps, &region(u64::MAX - 4, 0x10)), Some(u64::MAX - 4), "wraps");
        assert_eq!(first_hole(&maps, &region(0x00652000, 0x4000)), Some(0x00655000));
        assert_eq!(first_hole(&maps, &region(0x7fff0000, 0x1000)), None);
        assert_eq!(first_hole(&maps, &region(0x7fff0000, 0x1001)), Some(0x7fff1000));
    }

    #[test]
    fn this_processs_own_memory_is_mapped_and_a_far_range_is_not() {
        let buf = vec![0u8; 1 << 20];
        check_host_mapped(&[region(buf.as_ptr() as u64, buf.len() as u64)]).unwrap();
        // 2^22 blocks 16 MiB apart from a low address: 64 TiB no process maps.
        let e = check_host_mapped(&[region(1 << 20, (1u64 << 22) * (16 << 20))]).unwrap_err();
        assert!(e.to_string().contains("not all mapped"), "{e}");
    }
}
