//! Handles to what a `GioUring` hands out: IOCBs, registered layer tables and pair lists.
//! Their own module because both the error type and the IOCB code name them.

/// An IOCB of a `GioUring`'s pool. The generation changes every time the
/// IOCB is handed out, so a stale handle is refused rather than misread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IocbId {
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

impl IocbId {
    /// Index in the pool (`tt_iocb_hdr.id`).
    pub fn index(&self) -> u32 {
        self.index
    }
    /// One integer for a C handle: generation << 32 | index.
    pub fn to_raw(self) -> u64 {
        (self.gen as u64) << 32 | self.index as u64
    }
    /// The inverse of [`IocbId::to_raw`]; a made-up value is refused as stale when used.
    pub fn from_raw(raw: u64) -> Self {
        IocbId { index: raw as u32, gen: (raw >> 32) as u32 }
    }
}

impl std::fmt::Display for IocbId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IOCB {}#{}", self.index, self.gen)
    }
}

/// A layer table registered with a `GioUring`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableId(pub(crate) u8);

impl TableId {
    /// The table's slot (`tt_ioctx.table`, `tt_iocb_hdr.table`).
    pub fn index(&self) -> u8 {
        self.0
    }
}

/// A (file, block) pair list registered with a `GioUring`
/// ([`GioUring::register_pairs`](crate::GioUring::register_pairs)). Like
/// [`IocbId`], the generation changes every time the slot is reused, so a
/// handle kept past `unregister_pairs` is refused rather than misread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PairListId {
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

impl PairListId {
    /// The list's slot (`tt_iocb_hdr.pair_list`).
    pub fn index(&self) -> u32 {
        self.index
    }
    /// One integer for a C handle: generation << 32 | index.
    pub fn to_raw(self) -> u64 {
        (self.gen as u64) << 32 | self.index as u64
    }
    /// The inverse of [`PairListId::to_raw`]; a made-up value is refused as stale when used.
    pub fn from_raw(raw: u64) -> Self {
        PairListId { index: raw as u32, gen: (raw >> 32) as u32 }
    }
}

impl std::fmt::Display for PairListId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pair list {}#{}", self.index, self.gen)
    }
}
