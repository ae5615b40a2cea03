//! Reading what a cubin says about its kernels: the target architecture, the
//! entry points, each one's parameter table and register count.
//!
//! A cubin is an ELF64 image (`e_machine` 190, EM_CUDA) whose `e_flags`
//! carry the SM version in their low byte (sm_90: `0x5a`). Per kernel, the
//! section `.nv.info.<kernel>` holds attributes in a type-length-value
//! format: a format byte, an attribute byte, then two bytes for no value
//! (format 1), a byte (2) or a 16-bit value (3), or a 16-bit size and that
//! many bytes (4). (sm_80 cubins carry format-1 entries; sm_90 ones, so far, not.)
//! Attributes used here:
//! - `EIATTR_KPARAM_INFO` (0x17, 12 bytes): u32 index, u16 ordinal, u16 byte
//!   offset in the parameter buffer, u32 whose bits 18..32 are the size;
//! - `EIATTR_MAX_THREADS` (0x05): the `__launch_bounds__` thread limit;
//! - in the shared `.nv.info` section, `EIATTR_REGCOUNT` (0x2f, 8 bytes):
//!   u32 symbol index, u32 registers per thread.
//!
//! The layout was read off NVRTC 12.9 cubins for sm_90; every read is
//! bounds-checked, so a malformed image is an error, never a panic.

use crate::error::KernelError;

/// ELF `e_machine` of CUDA images.
pub const EM_CUDA: u16 = 190;

const EIATTR_MAX_THREADS: u8 = 0x05;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_REGCOUNT: u8 = 0x2f;

/// One kernel parameter, as the cubin lays out the parameter buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    pub ordinal: u16,
    pub offset: u16,
    pub size: u16,
}

/// What the cubin says about one entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    pub name: String,
    /// By ordinal.
    pub params: Vec<Param>,
    /// Registers per thread (`EIATTR_REGCOUNT`), when recorded.
    pub registers: Option<u32>,
    /// The thread limit of `__launch_bounds__`, when given.
    pub max_threads: Option<u32>,
}

impl KernelInfo {
    /// Parameter sizes in ordinal order.
    pub fn param_sizes(&self) -> Vec<u32> {
        self.params.iter().map(|p| u32::from(p.size)).collect()
    }
}

/// A parsed cubin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cubin {
    /// SM version, e.g. 90.
    pub sm: u32,
    pub kernels: Vec<KernelInfo>,
}

impl Cubin {
    pub fn kernel(&self, name: &str) -> Option<&KernelInfo> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

fn bad(what: impl Into<String>) -> KernelError {
    KernelError::Cubin(what.into())
}

fn u16_at(b: &[u8], off: usize) -> Result<u16, KernelError> {
    b.get(off..off + 2)
        .and_then(|s| s.try_into().ok())
        .map(u16::from_le_bytes)
        .ok_or_else(|| bad(format!("truncated at byte {off}")))
}

fn u32_at(b: &[u8], off: usize) -> Result<u32, KernelError> {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| bad(format!("truncated at byte {off}")))
}

fn u64_at(b: &[u8], off: usize) -> Result<u64, KernelError> {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| bad(format!("truncated at byte {off}")))
}

fn usize_of(v: u64, what: &str) -> Result<usize, KernelError> {
    usize::try_from(v).map_err(|_| bad(format!("{what} {v:#x} does not fit this machine")))
}

struct Section<'a> {
    name: String,
    kind: u32,
    data: &'a [u8],
    link: u32,
}

fn c_str(b: &[u8], off: usize) -> Result<String, KernelError> {
    let tail = b.get(off..).ok_or_else(|| bad(format!("string offset {off} outside its table")))?;
    let end = tail.iter().position(|&c| c == 0).ok_or_else(|| bad("unterminated string"))?;
    Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
}

fn sections(b: &[u8]) -> Result<Vec<Section<'_>>, KernelError> {
    let shoff = usize_of(u64_at(b, 0x28)?, "section header offset")?;
    let entsize = usize::from(u16_at(b, 0x3a)?);
    let count = usize::from(u16_at(b, 0x3c)?);
    let strndx = usize::from(u16_at(b, 0x3e)?);
    if entsize < 64 {
        return Err(bad(format!("section header entries of {entsize} bytes (ELF64 needs 64)")));
    }
    let mut raw = Vec::with_capacity(count);
    for i in 0..count {
        let h = shoff + i * entsize;
        let name = u32_at(b, h)?;
        let kind = u32_at(b, h + 4)?;
        let off = usize_of(u64_at(b, h + 0x18)?, "section offset")?;
        let size = usize_of(u64_at(b, h + 0x20)?, "section size")?;
        let link = u32_at(b, h + 0x28)?;
        // SHT_NOBITS (8) occupies no bytes of the file.
        let data = if kind == 8 {
            &b[0..0]
        } else {
            b.get(off..off.saturating_add(size))
                .ok_or_else(|| bad(format!("section {i} ({off:#x}+{size:#x}) outside the image")))?
        };
        raw.push((name, kind, data, link));
    }
    let names = raw.get(strndx).map(|s| s.2).ok_or_else(|| bad("no section name table"))?;
    raw.into_iter()
        .map(|(name, kind, data, link)| Ok(Section { name: c_str(names, name as usize)?, kind, data, link }))
        .collect()
}

/// (format, attribute, value bytes) of one `.nv.info` entry.
type Attribute<'a> = (u8, u8, &'a [u8]);

/// The entries of an `.nv.info` section.
fn attributes(data: &[u8]) -> Result<Vec<Attribute<'_>>, KernelError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let fmt = data[i];
        let attr = *data.get(i + 1).ok_or_else(|| bad("attribute cut short"))?;
        i += 2;
        let len = match fmt {
            // No value, a byte, a half-word: each padded to two bytes.
            1..=3 => 2,
            4 => {
                let n = usize::from(u16_at(data, i)?);
                i += 2;
                n
            }
            f => return Err(bad(format!("attribute {attr:#x} has unknown format {f}"))),
        };
        let value = data.get(i..i + len).ok_or_else(|| bad(format!("attribute {attr:#x} cut short")))?;
        out.push((fmt, attr, value));
        i += len;
    }
    Ok(out)
}

/// Parses `image`. Errors name what is malformed.
pub fn parse(image: &[u8]) -> Result<Cubin, KernelError> {
    if image.get(..4) != Some(b"\x7fELF") {
        return Err(bad("not an ELF image"));
    }
    if image.get(4) != Some(&2) {
        return Err(bad("not a 64-bit ELF image"));
    }
    let machine = u16_at(image, 0x12)?;
    if machine != EM_CUDA {
        return Err(bad(format!("e_machine is {machine}, not EM_CUDA ({EM_CUDA})")));
    }
    let sm = u32_at(image, 0x30)? & 0xff;
    let secs = sections(image)?;

    // Symbol names by index, from the symbol table the info sections link to.
    let symtab = secs.iter().find(|s| s.kind == 2).ok_or_else(|| bad("no symbol table"))?;
    let strtab =
        secs.get(symtab.link as usize).ok_or_else(|| bad("symbol table links to no string table"))?;
    let nsyms = symtab.data.len() / 24;
    let sym_name = |idx: u32| -> Result<String, KernelError> {
        let i = idx as usize;
        if i >= nsyms {
            return Err(bad(format!("symbol {idx} outside the symbol table")));
        }
        c_str(strtab.data, u32_at(symtab.data, i * 24)? as usize)
    };

    let mut registers = std::collections::HashMap::new();
    if let Some(info) = secs.iter().find(|s| s.name == ".nv.info") {
        for (_, attr, v) in attributes(info.data)? {
            if attr == EIATTR_REGCOUNT && v.len() == 8 {
                registers.insert(sym_name(u32_at(v, 0)?)?, u32_at(v, 4)?);
            }
        }
    }

    let mut kernels = Vec::new();
    for s in &secs {
        let Some(name) = s.name.strip_prefix(".nv.info.") else { continue };
        let mut params = Vec::new();
        let mut max_threads = None;
        for (_, attr, v) in attributes(s.data)? {
            match attr {
                EIATTR_KPARAM_INFO => {
                    if v.len() != 12 {
                        return Err(bad(format!("{name}: parameter record of {} bytes, not 12", v.len())));
                    }
                    let size = (u32_at(v, 8)? >> 18) & 0x3fff;
                    params.push(Param { ordinal: u16_at(v, 4)?, offset: u16_at(v, 6)?, size: size as u16 });
                }
                EIATTR_MAX_THREADS if v.len() >= 4 => max_threads = Some(u32_at(v, 0)?),
                _ => {}
            }
        }
        params.sort_by_key(|p| p.ordinal);
        for (i, p) in params.iter().enumerate() {
            if usize::from(p.ordinal) != i {
                return Err(bad(format!("{name}: parameter ordinals skip or repeat at {}", p.ordinal)));
            }
        }
        kernels.push(KernelInfo {
            name: name.to_string(),
            params,
            registers: registers.get(name).copied(),
            max_threads,
        });
    }
    Ok(Cubin { sm, kernels })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_images_are_errors() {
        assert!(parse(b"").is_err());
        assert!(parse(b"\x7fELF").is_err());
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[0x12] = 62; // x86-64
        let e = parse(&elf).unwrap_err().to_string();
        assert!(e.contains("EM_CUDA"), "{e}");
        elf[0x12] = 190;
        // Section headers claimed far outside the image.
        elf[0x28] = 0xff;
        elf[0x3a] = 64;
        elf[0x3c] = 3;
        assert!(parse(&elf).is_err());
    }

    #[test]
    fn attribute_formats_are_walked() {
        // NVAL (padded), HVAL, SVAL of 4 bytes.
        let data = [1u8, 0x35, 0, 0, 3, 0x1b, 64, 0, 4, 0x37, 4, 0, 1, 2, 3, 4];
        let a = attributes(&data).unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(a[2], (4, 0x37, &[1u8, 2, 3, 4][..]));
        assert!(attributes(&[4u8, 0x17, 12, 0, 1]).is_err(), "a cut-short value is an error");
        assert!(attributes(&[9u8, 0x17]).is_err(), "an unknown format is an error");
        assert!(attributes(&[1u8, 0x35, 0]).is_err(), "a cut-short padded entry is an error");
    }
}
