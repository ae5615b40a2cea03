//! Where each object's bytes land in destination memory (pieces at shuffled
//! slots, like the pages of a paged KV cache), and the data pointer of every
//! command that reads them there: SGL, PRP with lists, or PRP limited to
//! PRP1/PRP2 (what a table of 16-byte PRP entries can hold without lists).

use anyhow::{bail, Context};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tutti_driver::command::prp::{self, Scratch};
use tutti_driver::command::{sgl, DataPtr};
use tutti_driver::queue::slice_segments;
use tutti_driver::spec::SglSupport;
use tutti_driver::transport::{DmaBuffer, DmaSpace, IovaSegment};

/// How a command describes its destination memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// SGL (§4.4): a Data Block inline for one piece, a Last Segment list for several.
    Sgl,
    /// PRP (§4.3) with list pages: one command per maximum transfer, as with SGL.
    Prp,
    /// PRP1/PRP2 only (no list memory): at most two pages per command.
    PrpInline,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::Sgl => "SGL",
            Mode::Prp => "PRP+list",
            Mode::PrpInline => "PRP 2-page",
        }
    }
}

/// The bytes of one SGL descriptor, and of PRP1+PRP2: what one table entry holds per command.
pub const ENTRY_BYTES: u64 = 16;

/// The shape of one configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub object_bytes: u64,
    /// Destination piece size; an object's pieces are placed independently.
    pub piece_bytes: u64,
    /// Controller memory page size.
    pub page: u64,
    /// Largest command (MDTS and the 16-bit block count), a multiple of the LBA size.
    pub max_command: u64,
}

impl Shape {
    /// Checks what the placement and the PRP rules need: page-multiple pieces dividing the object.
    pub fn new(object_bytes: u64, piece_bytes: u64, page: u64, max_command: u64) -> anyhow::Result<Shape> {
        let piece = piece_bytes.min(object_bytes);
        if object_bytes == 0 || !object_bytes.is_multiple_of(page) {
            bail!("object size {object_bytes} is not a multiple of the {page}-byte memory page");
        }
        if piece == 0 || !piece.is_multiple_of(page) || !object_bytes.is_multiple_of(piece) {
            bail!("piece size {piece_bytes} must be a multiple of the {page}-byte page that divides the {object_bytes}-byte object");
        }
        if max_command < page {
            bail!("the controller's largest command ({max_command} bytes) is below one page ({page})");
        }
        Ok(Shape { object_bytes, piece_bytes: piece, page, max_command })
    }

    pub fn pieces(&self) -> u64 {
        self.object_bytes / self.piece_bytes
    }

    /// Bytes per command in `mode`: the largest command, or two pages without a PRP list.
    pub fn command_bytes(&self, mode: Mode) -> u64 {
        let max = match mode {
            Mode::PrpInline => self.max_command.min(2 * self.page),
            Mode::Sgl | Mode::Prp => self.max_command,
        };
        max.min(self.object_bytes)
    }

    pub fn commands_per_object(&self, mode: Mode) -> u64 {
        self.object_bytes.div_ceil(self.command_bytes(mode))
    }
}

/// Destination slots (one piece each), shuffled: piece `p` of object `j` is at
/// slot `slots[j·pieces + p]`.
pub struct Scatter {
    pub shape: Shape,
    pub objects: usize,
    slots: Vec<u32>,
}

impl Scatter {
    pub fn new(shape: Shape, objects: usize, seed: u64) -> anyhow::Result<Scatter> {
        let n = objects as u64 * shape.pieces();
        if n > u32::MAX as u64 {
            bail!("{n} destination pieces are too many");
        }
        let mut slots: Vec<u32> = (0..n as u32).collect();
        slots.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
        Ok(Scatter { shape, objects, slots })
    }

    /// Offset in destination memory of piece `p` of object `j`.
    pub fn piece_offset(&self, j: usize, p: u64) -> u64 {
        self.slots[j * self.shape.pieces() as usize + p as usize] as u64 * self.shape.piece_bytes
    }

    /// The device addresses of object `j`, piece by piece, for memory at `base`.
    pub fn object_segments(&self, j: usize, base: u64) -> Vec<IovaSegment> {
        (0..self.shape.pieces())
            .map(|p| IovaSegment { iova: base + self.piece_offset(j, p), len: self.shape.piece_bytes })
            .collect()
    }
}

/// What the descriptors of one object cost, summed over its commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Costs {
    pub commands: u64,
    /// SGL Data Blocks, or PRP entries (PRP1 included).
    pub descriptors: u64,
    /// Descriptor bytes as entries: 16 per command (SGL1 or PRP1+PRP2) plus list entries
    /// (SGL: 16 per Data Block of a list; PRP: 8 per list entry and chain pointer).
    pub desc_bytes: u64,
    /// List memory as allocated: SGL segments packed (16 B each), PRP lists in whole pages.
    pub list_bytes: u64,
}

impl Costs {
    pub fn add(&mut self, o: Costs) {
        self.commands += o.commands;
        self.descriptors += o.descriptors;
        self.desc_bytes += o.desc_bytes;
        self.list_bytes += o.list_bytes;
    }

    /// A table with one 16-byte entry per command, plus its list memory.
    pub fn table_bytes(&self) -> u64 {
        self.commands * ENTRY_BYTES + self.list_bytes
    }
}

/// One command's descriptor costs and the list memory it needs (alignment, bytes).
fn command_costs(mode: Mode, segs: &[IovaSegment], page: u64, sgl: SglSupport) -> anyhow::Result<Costs> {
    Ok(match mode {
        Mode::Sgl => {
            let n = sgl::count_blocks(segs, sgl)? as u64;
            let list = if n > 1 { 16 * n } else { 0 };
            Costs { commands: 1, descriptors: n, desc_bytes: ENTRY_BYTES + list, list_bytes: list }
        }
        Mode::Prp | Mode::PrpInline => {
            let n = prp::count_entries(segs, page)?;
            let pages = prp::list_pages(n, page) as u64;
            if mode == Mode::PrpInline && pages > 0 {
                bail!("a two-page PRP command needs {n} entries (the pieces are not page aligned)");
            }
            // A list holds the entries after PRP1, plus a chain pointer per extra list page.
            let entries = if pages > 0 { n as u64 - 1 + (pages - 1) } else { 0 };
            Costs {
                commands: 1,
                descriptors: n as u64,
                desc_bytes: ENTRY_BYTES + 8 * entries,
                list_bytes: pages * page,
            }
        }
    })
}

/// One command: object `object` (local to its drive), bytes `offset..offset+bytes` of it.
#[derive(Clone, Copy, Debug)]
pub struct Planned {
    pub object: u32,
    pub offset: u64,
    pub bytes: u64,
    pub ptr: DataPtr,
}

/// Every command of one drive's objects in one mode, with their list memory.
pub struct Descriptors {
    pub commands: Vec<Planned>,
    /// Costs summed over all objects.
    pub costs: Costs,
    _lists: DmaBuffer,
}

/// Builds the data pointers of every command reading `scatter`'s objects into memory at `base`.
pub fn build(
    mode: Mode,
    scatter: &Scatter,
    base: u64,
    dma: &dyn DmaSpace,
    sgl_support: SglSupport,
) -> anyhow::Result<Descriptors> {
    let shape = scatter.shape;
    let step = shape.command_bytes(mode);
    let mut segments = Vec::with_capacity(scatter.objects * shape.commands_per_object(mode) as usize);
    let mut costs = Costs::default();
    let mut list_space = 0u64;
    for j in 0..scatter.objects {
        let all = scatter.object_segments(j, base);
        let mut off = 0;
        while off < shape.object_bytes {
            let len = step.min(shape.object_bytes - off);
            let segs = slice_segments(&all, off, len);
            let c = command_costs(mode, &segs, shape.page, sgl_support).with_context(|| {
                format!("{} command for bytes {off}..{} of an object", mode.label(), off + len)
            })?;
            // PRP lists start on a page (the driver's builder requires it); SGL segments on 16 bytes.
            list_space += c.list_bytes;
            costs.add(c);
            segments.push((j as u32, off, len, segs, c.list_bytes as usize));
            off += len;
        }
    }
    // One page at least: builders check the (empty) scratch of list-less commands too.
    let lists = dma.alloc(list_space.max(shape.page) as usize)?;
    let mut at = 0usize;
    let mut commands = Vec::with_capacity(segments.len());
    for (object, offset, bytes, segs, need) in segments {
        let scratch = Scratch { buf: &lists, offset: at, len: need };
        at += need;
        let ptr = match mode {
            Mode::Sgl => sgl::build(&segs, sgl_support, scratch)?,
            Mode::Prp | Mode::PrpInline => prp::build(&segs, shape.page, scratch)?,
        };
        commands.push(Planned { object, offset, bytes, ptr });
    }
    Ok(Descriptors { commands, costs, _lists: lists })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tutti_driver::spec::{SglDescriptor, SglKind};
    use tutti_emulator::EmuIommu;

    const PAGE: u64 = 4096;

    /// Splits memory at page boundaries, so PRP and SGL descriptions compare equal.
    fn pages(segs: &[IovaSegment]) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for s in segs {
            let (mut a, end) = (s.iova, s.iova + s.len);
            while a < end {
                let next = ((a / PAGE) + 1) * PAGE;
                out.push((a, next.min(end) - a));
                a = next;
            }
        }
        out
    }

    /// Reads back what a data pointer describes, walking list memory in `lists`.
    fn decode(ptr: DataPtr, bytes: u64, lists: &DmaBuffer) -> Vec<IovaSegment> {
        let at = |iova: u64| (iova - lists.iova()) as usize;
        match ptr {
            DataPtr::Sgl(d) if d.kind() == SglKind::DataBlock => {
                vec![IovaSegment { iova: d.addr, len: d.len as u64 }]
            }
            DataPtr::Sgl(d) => {
                assert_eq!(d.kind(), SglKind::LastSegment);
                (0..d.len as usize / 16)
                    .map(|i| {
                        let b: SglDescriptor = lists.read_obj(at(d.addr) + 16 * i).unwrap();
                        assert_eq!(b.kind(), SglKind::DataBlock);
                        IovaSegment { iova: b.addr, len: b.len as u64 }
                    })
                    .collect()
            }
            DataPtr::Prp { prp1, prp2 } => {
                let first = (PAGE - prp1 % PAGE).min(bytes);
                let mut out = vec![IovaSegment { iova: prp1, len: first }];
                let mut left = bytes - first;
                if left == 0 {
                    return out;
                }
                if left <= PAGE {
                    out.push(IovaSegment { iova: prp2, len: left });
                    return out;
                }
                // §4.3: walk the list; the last slot of a page chains when more entries follow.
                let (mut list, mut slot) = (prp2, 0u64);
                while left > 0 {
                    let e: u64 = lists.read_obj(at(list) + 8 * slot as usize).unwrap();
                    if slot == PAGE / 8 - 1 && left > PAGE {
                        (list, slot) = (e, 0);
                        continue;
                    }
                    out.push(IovaSegment { iova: e, len: left.min(PAGE) });
                    left -= left.min(PAGE);
                    slot += 1;
                }
                out
            }
            DataPtr::None => panic!("a read without data pointer"),
        }
    }

    #[test]
    fn placement_is_a_permutation_of_piece_slots() {
        let shape = Shape::new(32 << 10, 4096, PAGE, 128 << 10).unwrap();
        let sc = Scatter::new(shape, 50, 3).unwrap();
        let mut seen: Vec<u64> =
            (0..50).flat_map(|j| (0..8).map(move |p| (j, p))).map(|(j, p)| sc.piece_offset(j, p)).collect();
        seen.sort();
        assert_eq!(seen, (0..400).map(|i| i * 4096).collect::<Vec<_>>());
        let contiguous = Shape::new(32 << 10, 64 << 10, PAGE, 128 << 10).unwrap();
        assert_eq!(
            (contiguous.piece_bytes, contiguous.pieces()),
            (32 << 10, 1),
            "a piece is at most the object"
        );
    }

    #[test]
    fn shapes_refuse_what_prp_and_the_placement_cannot_do() {
        assert!(Shape::new(6000, 4096, PAGE, 1 << 20).unwrap_err().to_string().contains("multiple"));
        assert!(Shape::new(32 << 10, 12 << 10, PAGE, 1 << 20).unwrap_err().to_string().contains("divides"));
        assert!(Shape::new(32 << 10, 2048, PAGE, 1 << 20).is_err());
        assert!(Shape::new(32 << 10, 4096, PAGE, 512).unwrap_err().to_string().contains("below one page"));
    }

    #[test]
    fn every_mode_describes_exactly_the_scattered_pieces() {
        let dma = EmuIommu::new("test");
        for (object, piece) in [
            (32u64 << 10, 4096u64),
            (32 << 10, 32 << 10),
            (512 << 10, 4096),
            (512 << 10, 64 << 10),
            (4096, 4096),
        ] {
            let shape = Shape::new(object, piece, PAGE, 128 << 10).unwrap();
            let sc = Scatter::new(shape, 6, object ^ piece).unwrap();
            let base = 0x10_0000_0000;
            for mode in [Mode::Sgl, Mode::Prp, Mode::PrpInline] {
                let d = build(mode, &sc, base, &dma, SglSupport::Supported).unwrap();
                let per = shape.commands_per_object(mode);
                assert_eq!(d.costs.commands, 6 * per, "{mode:?} {object} {piece}");
                assert_eq!(d.commands.len() as u64, 6 * per);
                assert!(d.commands.iter().all(|c| c.bytes <= shape.command_bytes(mode)));
                for j in 0..6 {
                    let mine: Vec<&Planned> = d.commands.iter().filter(|c| c.object == j as u32).collect();
                    let mut got = Vec::new();
                    for c in &mine {
                        assert_eq!(
                            c.offset,
                            got.iter().map(|(_, l)| l).sum::<u64>(),
                            "commands in object order"
                        );
                        got.extend(pages(&decode(c.ptr, c.bytes, &d._lists)));
                    }
                    assert_eq!(
                        got,
                        pages(&sc.object_segments(j, base)),
                        "{mode:?} {object} {piece} object {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn descriptor_costs_follow_the_spec_layouts() {
        let dma = EmuIommu::new("test");
        let costs = |object: u64, piece: u64, mode: Mode| {
            let shape = Shape::new(object, piece, PAGE, 128 << 10).unwrap();
            build(mode, &Scatter::new(shape, 4, 1).unwrap(), 0x1000_0000, &dma, SglSupport::Supported)
                .unwrap()
                .costs
        };
        let per = |c: Costs| (c.commands / 4, c.descriptors / 4, c.desc_bytes / 4, c.list_bytes / 4);
        // A contiguous 32K object: one Data Block; PRP needs a list of 7 entries in one page.
        assert_eq!(per(costs(32 << 10, 32 << 10, Mode::Sgl)), (1, 1, 16, 0));
        assert_eq!(per(costs(32 << 10, 32 << 10, Mode::Prp)), (1, 8, 16 + 7 * 8, 4096));
        assert_eq!(per(costs(32 << 10, 32 << 10, Mode::PrpInline)), (4, 8, 4 * 16, 0));
        // 4K pieces: one Data Block per page in a Last Segment list.
        assert_eq!(per(costs(32 << 10, 4096, Mode::Sgl)), (1, 8, 16 + 8 * 16, 8 * 16));
        // 2M object, 128K commands: 16 commands of 32 pages; SGL stays one descriptor each.
        assert_eq!(per(costs(2 << 20, 2 << 20, Mode::Sgl)), (16, 16, 16 * 16, 0));
        assert_eq!(per(costs(2 << 20, 2 << 20, Mode::Prp)), (16, 16 * 32, 16 * (16 + 31 * 8), 16 * 4096));
        assert_eq!(costs(32 << 10, 32 << 10, Mode::Prp).table_bytes(), 4 * (16 + 4096));
        let no_sgl = build(
            Mode::Sgl,
            &Scatter::new(Shape::new(8192, 8192, PAGE, 8192).unwrap(), 1, 1).unwrap(),
            0,
            &dma,
            SglSupport::None,
        );
        assert!(no_sgl.err().unwrap().to_string().contains("SGL"));
    }
}
