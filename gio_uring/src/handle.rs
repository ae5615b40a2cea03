//! Handles to what a `GioUring` hands out: IOCBs, registered layer tables and pair lists.
//! Their own module because both the error type and the IOCB code name them.

/// A handle of a slot index and a generation that changes every time the slot is handed out
/// again, so a stale handle is refused rather than misread. `$what` names it in messages;
/// `$slot` says where the index goes in the executor's structures.
macro_rules! generational_handle {
    ($(#[$doc:meta])* $name:ident, $what:literal, $slot:literal, [$($derive:ident),*]) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash $(, $derive)*)]
        pub struct $name {
            pub(crate) index: u32,
            pub(crate) gen: u32,
        }

        impl $name {
            #[doc = concat!("The slot (", $slot, ").")]
            pub fn index(&self) -> u32 {
                self.index
            }
            /// One integer for a C handle: generation << 32 | index.
            pub fn to_raw(self) -> u64 {
                (self.gen as u64) << 32 | self.index as u64
            }
            #[doc = concat!("The inverse of [`", stringify!($name), "::to_raw`]; a made-up value is refused as stale when used.")]
            pub fn from_raw(raw: u64) -> Self {
                $name { index: raw as u32, gen: (raw >> 32) as u32 }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!($what, " {}#{}"), self.index, self.gen)
            }
        }
    };
}

generational_handle!(
    /// An IOCB of a `GioUring`'s pool; the generation changes every time the IOCB is handed out.
    IocbId, "IOCB", "`tt_iocb_hdr.id`", [PartialOrd, Ord]
);

generational_handle!(
    /// A (file, block) pair list registered with a `GioUring`
    /// ([`GioUring::register_pairs`](crate::GioUring::register_pairs)); a handle kept past
    /// `unregister_pairs` is refused rather than misread.
    PairListId, "pair list", "`tt_iocb_hdr.pair_list`", []
);

/// A layer table registered with a `GioUring`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableId(pub(crate) u8);

impl TableId {
    /// The table's slot (`tt_ioctx.table`, `tt_iocb_hdr.table`).
    pub fn index(&self) -> u8 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_through_raw_and_name_themselves() {
        let id = IocbId { index: 7, gen: 3 };
        assert_eq!(id.to_raw(), 3 << 32 | 7);
        assert_eq!(IocbId::from_raw(id.to_raw()), id);
        assert_eq!(id.to_string(), "IOCB 7#3");
        let list = PairListId { index: 1, gen: u32::MAX };
        assert_eq!(PairListId::from_raw(list.to_raw()), list);
        assert_eq!(list.to_string(), format!("pair list 1#{}", u32::MAX));
    }
}
