//! The emulated controller's blocks: anonymous memory or a regular file.
//!
//! Namespaces are laid out one after another. Data moves between media and
//! host memory through the IOMMU: for RAM straight between the mapping and the
//! host buffer (one copy), for a file through a bounded scratch window (one
//! `pread`/`pwrite` per window).

use super::config::{EmulatedConfig, MediaConfig};
use super::iommu::{DeviceDma, IommuFault};
use super::walk::SglPiece;
use crate::owner::{lock_media, MediaOwner};
use memmap2::{MmapMut, MmapOptions, UncheckedAdvice};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use tutti_driver::{DriverError, Result};

/// File transfers move through a scratch buffer at most this large.
const FILE_WINDOW: u64 = 1 << 20;

/// Why a media operation failed.
#[derive(Debug)]
pub(super) enum MediaError {
    /// The host buffer was not reachable through the IOMMU.
    Dma(IommuFault),
    /// The backing file failed.
    Io(std::io::Error),
    /// A range outside the namespace, or bit buckets in a write: the engine
    /// checks both before calling, so seeing this is a bug.
    BadRequest,
}

impl From<IommuFault> for MediaError {
    fn from(f: IommuFault) -> Self {
        MediaError::Dma(f)
    }
}

impl From<std::io::Error> for MediaError {
    fn from(e: std::io::Error) -> Self {
        MediaError::Io(e)
    }
}

/// Where namespace `i` lives in the store.
#[derive(Clone, Copy, Debug)]
struct Extent {
    base: u64,
    len: u64,
}

enum Store {
    Ram(MmapMut),
    /// `_owner` is declared before `file`: it is dropped first, so the owner record
    /// goes before closing the file releases the lock.
    File {
        _owner: MediaOwner,
        file: File,
        path: PathBuf,
    },
    /// [`MediaConfig::Null`]: nothing stored, nothing moved.
    Null,
}

pub(super) struct Media {
    extents: Vec<Extent>,
    store: Store,
    scratch: Vec<u8>,
    /// RAM media committed at start ([`MediaConfig::RamPrefaulted`]): zeroing keeps
    /// its pages instead of handing them back to the kernel.
    prefaulted: bool,
}

/// Walks the pieces of a transfer in order, a window at a time.
struct Cursor<'a> {
    pieces: &'a [SglPiece],
    index: usize,
    /// Bytes of `pieces[index]` already consumed.
    within: u64,
}

impl<'a> Cursor<'a> {
    fn new(pieces: &'a [SglPiece]) -> Self {
        Cursor { pieces, index: 0, within: 0 }
    }

    /// Calls `f(piece, offset_in_piece, buf_range)` for the next `n` bytes of the transfer.
    fn take(
        &mut self,
        n: usize,
        mut f: impl FnMut(SglPiece, u64, std::ops::Range<usize>) -> Result<(), MediaError>,
    ) -> Result<(), MediaError> {
        let mut done = 0usize;
        while done < n {
            let piece = *self.pieces.get(self.index).ok_or(MediaError::BadRequest)?;
            let step = (piece.len() - self.within).min((n - done) as u64) as usize;
            f(piece, self.within, done..done + step)?;
            done += step;
            self.within += step as u64;
            if self.within == piece.len() {
                self.index += 1;
                self.within = 0;
            }
        }
        Ok(())
    }
}

fn host_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|p| p.is_power_of_two()).unwrap_or(4096)
}

impl Media {
    /// Opens the media `cfg` describes, sized for all its namespaces.
    pub fn open(cfg: &EmulatedConfig) -> Result<Media> {
        let mut extents = Vec::with_capacity(cfg.namespaces.len());
        let mut total = 0u64;
        for (i, ns) in cfg.namespaces.iter().enumerate() {
            let len = ns.bytes();
            extents.push(Extent { base: total, len });
            total = total.checked_add(len).ok_or_else(|| {
                DriverError::Emulated(format!("{}: namespace {} overflows the media size", cfg.name, i + 1))
            })?;
        }
        let store = match &cfg.media {
            MediaConfig::Ram | MediaConfig::RamPrefaulted => {
                let len = usize::try_from(total).map_err(|_| {
                    DriverError::Emulated(format!("{}: {total} bytes of RAM media do not fit", cfg.name))
                })?;
                // Anonymous memory is zero-filled and committed page by page as it is
                // written, or all at once here (MAP_POPULATE write-faults every page of a
                // private writable mapping).
                let mut opts = MmapOptions::new();
                opts.len(len).no_reserve_swap();
                if matches!(cfg.media, MediaConfig::RamPrefaulted) {
                    opts.populate();
                }
                let map = opts.map_anon().map_err(|e| {
                    DriverError::io(format!("{}: mapping {total} bytes of RAM media", cfg.name), e)
                })?;
                Store::Ram(map)
            }
            MediaConfig::File(path) => {
                let (owner, file) = open_file(&cfg.name, path, total)?;
                Store::File { _owner: owner, file, path: path.clone() }
            }
            MediaConfig::Null => Store::Null,
        };
        let prefaulted = matches!(cfg.media, MediaConfig::RamPrefaulted);
        Ok(Media { extents, store, scratch: Vec::new(), prefaulted })
    }

    /// Absolute store offset of `offset..offset+len` in namespace index `ns`.
    fn locate(&self, ns: usize, offset: u64, len: u64) -> Result<u64, MediaError> {
        let ext = self.extents.get(ns).ok_or(MediaError::BadRequest)?;
        match offset.checked_add(len) {
            Some(end) if end <= ext.len => Ok(ext.base + offset),
            _ => Err(MediaError::BadRequest),
        }
    }

    /// Copies `offset..` of namespace `ns` into the host memory `pieces` describe.
    pub fn read(
        &mut self,
        ns: usize,
        offset: u64,
        pieces: &[SglPiece],
        iommu: &impl DeviceDma,
    ) -> Result<(), MediaError> {
        let total: u64 = pieces.iter().map(SglPiece::len).sum();
        let at = self.locate(ns, offset, total)?;
        match &mut self.store {
            Store::Ram(map) => {
                let mut pos = at as usize;
                for piece in pieces {
                    let n = piece.len() as usize;
                    if let SglPiece::Data(seg) = piece {
                        iommu.dma_write(seg.iova, &map[pos..pos + n])?;
                    }
                    pos += n;
                }
            }
            Store::File { file, .. } => {
                let mut cursor = Cursor::new(pieces);
                let mut pos = 0u64;
                while pos < total {
                    let n = (total - pos).min(FILE_WINDOW) as usize;
                    self.scratch.resize(n, 0);
                    file.read_exact_at(&mut self.scratch[..n], at + pos)?;
                    let buf = &self.scratch;
                    cursor.take(n, |piece, within, range| match piece {
                        SglPiece::Data(seg) => Ok(iommu.dma_write(seg.iova + within, &buf[range])?),
                        SglPiece::Skip(_) => Ok(()),
                    })?;
                    pos += n as u64;
                }
            }
            Store::Null => {}
        }
        Ok(())
    }

    /// Copies the host memory `pieces` describe into namespace `ns` at `offset`.
    pub fn write(
        &mut self,
        ns: usize,
        offset: u64,
        pieces: &[SglPiece],
        iommu: &impl DeviceDma,
    ) -> Result<(), MediaError> {
        if pieces.iter().any(|p| matches!(p, SglPiece::Skip(_))) {
            return Err(MediaError::BadRequest);
        }
        let total: u64 = pieces.iter().map(SglPiece::len).sum();
        let at = self.locate(ns, offset, total)?;
        match &mut self.store {
            Store::Ram(map) => {
                let mut pos = at as usize;
                for piece in pieces {
                    let n = piece.len() as usize;
                    if let SglPiece::Data(seg) = piece {
                        iommu.dma_read(seg.iova, &mut map[pos..pos + n])?;
                    }
                    pos += n;
                }
            }
            Store::File { file, .. } => {
                let mut cursor = Cursor::new(pieces);
                let mut pos = 0u64;
                while pos < total {
                    let n = (total - pos).min(FILE_WINDOW) as usize;
                    self.scratch.resize(n, 0);
                    let buf = &mut self.scratch;
                    cursor.take(n, |piece, within, range| match piece {
                        SglPiece::Data(seg) => Ok(iommu.dma_read(seg.iova + within, &mut buf[range])?),
                        SglPiece::Skip(_) => Err(MediaError::BadRequest),
                    })?;
                    file.write_all_at(&self.scratch[..n], at + pos)?;
                    pos += n as u64;
                }
            }
            Store::Null => {}
        }
        Ok(())
    }

    /// Makes `len` bytes at `offset` of namespace `ns` read as zeroes, releasing
    /// their storage where the store allows it.
    pub fn write_zeroes(&mut self, ns: usize, offset: u64, len: u64) -> Result<(), MediaError> {
        let at = self.locate(ns, offset, len)?;
        match &mut self.store {
            Store::Ram(map) => zero_ram(map, at as usize, len as usize, self.prefaulted),
            Store::File { file, path, .. } => zero_file(file, path, at, len, &mut self.scratch)?,
            Store::Null => {}
        }
        Ok(())
    }

    /// Deallocates (§6.7 Dataset Management): the blocks read as zeroes afterwards,
    /// as Identify Namespace DLFEAT promises.
    pub fn deallocate(&mut self, ns: usize, offset: u64, len: u64) -> Result<(), MediaError> {
        self.write_zeroes(ns, offset, len)
    }

    /// Makes every completed write durable.
    pub fn flush(&mut self) -> Result<(), MediaError> {
        match &self.store {
            Store::Ram(_) | Store::Null => Ok(()),
            Store::File { file, .. } => Ok(file.sync_data()?),
        }
    }
}

/// Opens (creating if absent) and locks a media file, then sizes it. A file
/// another owner holds is refused before anything is written to it.
fn open_file(name: &str, path: &std::path::Path, needed: u64) -> Result<(MediaOwner, File)> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| DriverError::io(format!("{name}: opening media file {}", path.display()), e))?;
    let meta = file.metadata().map_err(|e| {
        DriverError::io(format!("{name}: reading the size of media file {}", path.display()), e)
    })?;
    if !meta.is_file() {
        return Err(DriverError::Emulated(format!("{name}: media {} is not a regular file", path.display())));
    }
    let owner = lock_media(name, path, &file)?;
    if meta.len() < needed {
        // Extending leaves a hole: no disk space is used until blocks are written.
        file.set_len(needed).map_err(|e| {
            DriverError::Emulated(format!(
                "{name}: media file {} is {} bytes, the namespaces need {needed}, and it could not be extended: {e}",
                path.display(),
                meta.len()
            ))
        })?;
    }
    Ok((owner, file))
}

/// Zeroes `at..at + len` of RAM media; whole pages go back to the kernel unless `keep`
/// (prefaulted media stays committed, so a later write does not fault).
fn zero_ram(map: &mut MmapMut, at: usize, len: usize, keep: bool) {
    let page = host_page_size();
    let end = at + len;
    let first_page = at.next_multiple_of(page);
    let last_page = end & !(page - 1);
    if keep || first_page >= last_page {
        map[at..end].fill(0);
        return;
    }
    map[at..first_page].fill(0);
    map[last_page..end].fill(0);
    // SAFETY: no reference into the mapping is alive across this call (we hold it
    // mutably), and MADV_DONTNEED on private anonymous memory makes the range
    // read as zeroes, which is exactly the content it must have.
    let advised =
        unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, first_page, last_page - first_page) };
    if advised.is_err() {
        map[first_page..last_page].fill(0);
    }
}

fn zero_file(
    file: &File,
    path: &std::path::Path,
    at: u64,
    len: u64,
    scratch: &mut Vec<u8>,
) -> Result<(), MediaError> {
    if len == 0 {
        return Ok(());
    }
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(at), libc::off_t::try_from(len)) else {
        return Err(MediaError::BadRequest);
    };
    // SAFETY: the descriptor is open for writing for as long as `file` lives; the call
    // only changes file contents in the given range.
    let punched = unsafe {
        libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, off, n)
    };
    if punched == 0 {
        return Ok(());
    }
    tracing::debug!(file = %path.display(), error = %std::io::Error::last_os_error(), "hole punching failed; writing zeroes");
    scratch.clear();
    scratch.resize(len.min(FILE_WINDOW) as usize, 0);
    let mut pos = 0u64;
    while pos < len {
        let n = (len - pos).min(FILE_WINDOW) as usize;
        file.write_all_at(&scratch[..n], at + pos)?;
        pos += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NamespaceConfig;
    use crate::iommu::EmuIommu;
    use tutti_driver::transport::{DmaSpace, IovaSegment};

    fn cfg(media: MediaConfig) -> EmulatedConfig {
        EmulatedConfig {
            namespaces: vec![
                NamespaceConfig::with_bytes(4 << 20, 512),
                NamespaceConfig::with_bytes(3 << 20, 4096),
            ],
            media,
            ..EmulatedConfig::default()
        }
    }

    fn temp_path(tag: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::env::temp_dir().join(format!("tutti-media-{tag}-{}-{n}", std::process::id()))
    }

    fn data(piece_iova: u64, len: u64) -> SglPiece {
        SglPiece::Data(IovaSegment { iova: piece_iova, len })
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    /// Writes a pattern through scattered pieces, reads it back through others, checks namespaces
    /// do not overlap and that zeroed ranges read as zeroes.
    fn round_trip(media: &mut Media) {
        let mmu = EmuIommu::new("t");
        let len = (FILE_WINDOW + 0x3000) as usize; // crosses a file window
        let src = mmu.alloc(len + 0x1000).unwrap();
        let dst = mmu.alloc(len + 0x1000).unwrap();
        let bytes = pattern(len, 7);
        src.copy_in(0x200, &bytes).unwrap();
        let w = [data(src.iova_at(0x200), 0x1000), data(src.iova_at(0x1200), len as u64 - 0x1000)];
        media.write(0, 4096, &w, &mmu).unwrap();
        media.write(1, 0, &[data(src.iova_at(0x200), 4096)], &mmu).unwrap();
        let r = [data(dst.iova_at(0x800), 0x10), data(dst.iova_at(0x810), len as u64 - 0x10)];
        media.read(0, 4096, &r, &mmu).unwrap();
        let mut out = vec![0u8; len];
        dst.copy_out(0x800, &mut out).unwrap();
        assert!(out == bytes, "data read back differs");
        // Namespace 2 starts after namespace 1.
        media.read(1, 0, &[data(dst.iova_at(0), 4096)], &mmu).unwrap();
        let mut first = vec![0u8; 4096];
        dst.copy_out(0, &mut first).unwrap();
        assert_eq!(first, bytes[..4096]);
        // Bit buckets skip media bytes.
        dst.fill(0xee);
        media.read(0, 4096, &[SglPiece::Skip(100), data(dst.iova(), 28)], &mmu).unwrap();
        let mut out = [0u8; 29];
        dst.copy_out(0, &mut out).unwrap();
        assert_eq!(out[..28], bytes[100..128]);
        assert_eq!(out[28], 0xee);
        // Zeroes: partial pages at both ends and whole pages between.
        media.write_zeroes(0, 4096 + 100, 3 * 4096).unwrap();
        media.deallocate(0, 4096 + 5 * 4096, 512).unwrap();
        media.read(0, 4096, &[data(dst.iova(), len as u64)], &mmu).unwrap();
        let mut out = vec![0u8; len];
        dst.copy_out(0, &mut out).unwrap();
        assert_eq!(out[..100], bytes[..100]);
        assert!(out[100..100 + 3 * 4096].iter().all(|&b| b == 0));
        assert_eq!(out[100 + 3 * 4096..5 * 4096], bytes[100 + 3 * 4096..5 * 4096]);
        assert!(out[5 * 4096..5 * 4096 + 512].iter().all(|&b| b == 0));
        assert_eq!(out[5 * 4096 + 512..], bytes[5 * 4096 + 512..]);
        media.flush().unwrap();
    }

    #[test]
    fn ram_media_round_trips() {
        let mut media = Media::open(&cfg(MediaConfig::Ram)).unwrap();
        round_trip(&mut media);
    }

    /// Pages of RAM media the kernel has backed (mincore), out of all of them.
    fn resident_pages(media: &Media) -> (usize, usize) {
        let Store::Ram(map) = &media.store else { panic!("not RAM media") };
        let page = host_page_size();
        let pages = map.len().div_ceil(page);
        let mut vec = vec![0u8; pages];
        // SAFETY: the mapping is live and page aligned, `vec` has a byte per page.
        let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        (vec.iter().filter(|&&b| b & 1 != 0).count(), pages)
    }

    #[test]
    fn prefaulted_ram_media_is_committed_at_start_and_stays_so() {
        let lazy = Media::open(&cfg(MediaConfig::Ram)).unwrap();
        let (resident, pages) = resident_pages(&lazy);
        assert_eq!(resident, 0, "lazy RAM media has {resident} of {pages} pages before any write");
        let mut media = Media::open(&cfg(MediaConfig::RamPrefaulted)).unwrap();
        let (resident, pages) = resident_pages(&media);
        assert_eq!(resident, pages, "prefaulted RAM media has {resident} of {pages} pages at start");
        round_trip(&mut media);
        // Zeroing and deallocating whole pages kept them: a later write will not fault.
        media.write_zeroes(0, 0, 4 << 20).unwrap();
        media.deallocate(1, 0, 3 << 20).unwrap();
        let (resident, pages) = resident_pages(&media);
        assert_eq!(resident, pages, "prefaulted RAM media has {resident} of {pages} pages after zeroing");
    }

    #[test]
    fn file_media_round_trips_and_persists() {
        let path = temp_path("rt");
        let c = cfg(MediaConfig::File(path.clone()));
        let mut media = Media::open(&c).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 7 << 20);
        round_trip(&mut media);
        drop(media);
        // Reopened, the blocks are still there.
        let mut media = Media::open(&c).unwrap();
        let mmu = EmuIommu::new("t");
        let dst = mmu.alloc(4096).unwrap();
        media.read(1, 0, &[data(dst.iova(), 4096)], &mmu).unwrap();
        let mut out = vec![0u8; 4096];
        dst.copy_out(0, &mut out).unwrap();
        assert_eq!(out, pattern(4096, 7));
        drop(media);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn null_media_moves_no_data_but_checks_ranges() {
        let mut media = Media::open(&cfg(MediaConfig::Null)).unwrap();
        let mmu = EmuIommu::new("t");
        let buf = mmu.alloc(4096).unwrap();
        buf.copy_in(0, &pattern(4096, 5)).unwrap();
        media.write(1, 0, &[data(buf.iova(), 4096)], &mmu).unwrap();
        buf.copy_in(0, &pattern(4096, 9)).unwrap();
        media.read(1, 0, &[data(buf.iova(), 4096)], &mmu).unwrap();
        let mut out = vec![0u8; 4096];
        buf.copy_out(0, &mut out).unwrap();
        assert_eq!(out, pattern(4096, 9), "a read from null media changed the host buffer");
        // Ranges are still checked: past the namespace is a bad request, not a success.
        assert!(matches!(
            media.read(1, 7 << 20, &[data(buf.iova(), 4096)], &mmu),
            Err(MediaError::BadRequest)
        ));
    }

    #[test]
    fn short_file_is_extended_and_longer_file_kept() {
        let path = temp_path("ext");
        std::fs::write(&path, b"abc").unwrap();
        Media::open(&cfg(MediaConfig::File(path.clone()))).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 7 << 20);
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(8 << 20).unwrap();
        Media::open(&cfg(MediaConfig::File(path.clone()))).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 << 20);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn second_owner_of_a_media_file_is_refused_until_the_first_goes() {
        let path = temp_path("own");
        let c = cfg(MediaConfig::File(path.clone()));
        let mut first = Media::open(&c).unwrap();
        let sidecar = tutti_driver::owner::sidecar_path(&path);
        let record = std::fs::read_to_string(&sidecar).unwrap();
        assert!(record.contains(&format!("pid={}", std::process::id())), "{record}");
        // Write through the first owner, then try a second open.
        let mmu = EmuIommu::new("t");
        let src = mmu.alloc(4096).unwrap();
        src.copy_in(0, &pattern(4096, 3)).unwrap();
        first.write(1, 0, &[data(src.iova(), 4096)], &mmu).unwrap();
        let err = match Media::open(&c) {
            Err(e) => e,
            Ok(_) => panic!("a second owner of {} was accepted", path.display()),
        };
        assert!(matches!(err, DriverError::InUse(_)), "{err:?}");
        let msg = err.to_string();
        let pid = format!("pid {}", std::process::id());
        assert!(
            msg.contains(path.to_str().unwrap()) && msg.contains(&pid) && msg.contains("this process"),
            "{msg}"
        );
        // The first owner is unaffected.
        let dst = mmu.alloc(4096).unwrap();
        first.read(1, 0, &[data(dst.iova(), 4096)], &mmu).unwrap();
        let mut out = vec![0u8; 4096];
        dst.copy_out(0, &mut out).unwrap();
        assert_eq!(out, pattern(4096, 3));
        drop(first);
        assert!(!sidecar.exists(), "the owner record outlived its owner");
        // Closed, it opens again; a stale record naming a dead process blocks nothing.
        std::fs::write(&sidecar, "pid=999999999\ncommand=gone\n").unwrap();
        let again = Media::open(&c).unwrap();
        let record = std::fs::read_to_string(&sidecar).unwrap();
        assert!(record.contains(&format!("pid={}", std::process::id())), "{record}");
        drop(again);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn non_regular_file_is_refused() {
        let err = Media::open(&cfg(MediaConfig::File(std::env::temp_dir()))).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("regular file") || e.contains("opening media file")));
    }

    #[test]
    fn faults_and_ranges_are_reported() {
        let mut media = Media::open(&cfg(MediaConfig::Ram)).unwrap();
        let mmu = EmuIommu::new("t");
        assert!(matches!(media.read(0, 0, &[data(0x1000, 512)], &mmu), Err(MediaError::Dma(_))));
        assert!(matches!(media.write(0, 0, &[data(0x1000, 512)], &mmu), Err(MediaError::Dma(_))));
        assert!(matches!(media.write_zeroes(0, (4 << 20) - 512, 1024), Err(MediaError::BadRequest)));
        assert!(matches!(media.write_zeroes(2, 0, 512), Err(MediaError::BadRequest)));
        assert!(matches!(media.write(0, 0, &[SglPiece::Skip(512)], &mmu), Err(MediaError::BadRequest)));
    }
}
