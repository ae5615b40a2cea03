//! Handle registries: what a C handle pointer stands for.
//!
//! A handle is a token, never dereferenced: its value keys a table of live
//! objects of one type. A pointer not in the table — destroyed, never made,
//! or a handle of another type — is refused with `TUTTI_E_BAD_HANDLE`
//! instead of being read. Calls clone the object's `Arc` out of the table,
//! so destroying a handle while another thread uses it frees nothing under
//! that thread's feet.

use crate::error::{CapiError, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Tokens are multiples of 16 from a base no allocator hands out as small
/// integers; the low bits carry the handle type, so types never share a token.
static NEXT: AtomicUsize = AtomicUsize::new(0x7a11_0000);

pub(crate) struct Registry<T> {
    kind: &'static str,
    tag: usize,
    map: Mutex<Option<HashMap<usize, Arc<T>>>>,
}

impl<T> Registry<T> {
    pub const fn new(kind: &'static str, tag: usize) -> Self {
        Registry { kind, tag, map: Mutex::new(None) }
    }

    fn table(&self) -> MutexGuard<'_, Option<HashMap<usize, Arc<T>>>> {
        // The table is only ever changed by single insert/remove calls, so a
        // panic elsewhere while it was held cannot leave it half-updated.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `obj` and returns its handle.
    pub fn insert<H>(&self, obj: Arc<T>) -> *mut H {
        let token = NEXT.fetch_add(16, Ordering::Relaxed) | self.tag;
        self.table().get_or_insert_with(HashMap::new).insert(token, obj);
        std::ptr::without_provenance_mut(token)
    }

    /// The object behind `handle`.
    pub fn get<H>(&self, handle: *const H) -> Result<Arc<T>> {
        if handle.is_null() {
            return Err(CapiError::Null(self.kind));
        }
        let token = handle.addr();
        self.table()
            .as_ref()
            .and_then(|m| m.get(&token).cloned())
            .ok_or(CapiError::BadHandle { kind: self.kind, ptr: token })
    }

    /// Unregisters `handle` (NULL: nothing to do) and returns the object.
    pub fn remove<H>(&self, handle: *const H) -> Result<Option<Arc<T>>> {
        if handle.is_null() {
            return Ok(None);
        }
        let token = handle.addr();
        let mut table = self.table();
        let obj = table.as_mut().and_then(|m| m.remove(&token));
        // An empty table is freed, so a process that destroyed every handle holds no memory of ours.
        if table.as_ref().is_some_and(|m| m.is_empty()) {
            *table = None;
        }
        drop(table);
        obj.map(Some).ok_or(CapiError::BadHandle { kind: self.kind, ptr: token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_checked_by_type_and_liveness() {
        static A: Registry<u32> = Registry::new("a", 1);
        static B: Registry<u32> = Registry::new("b", 2);
        let h: *mut u8 = A.insert(Arc::new(5));
        assert_eq!(*A.get(h).unwrap(), 5);
        assert!(matches!(B.get(h), Err(CapiError::BadHandle { kind: "b", .. })));
        assert!(matches!(A.get(std::ptr::null::<u8>()), Err(CapiError::Null("a"))));
        let held = A.get(h).unwrap();
        assert_eq!(*A.remove(h).unwrap().unwrap(), 5);
        assert_eq!(*held, 5, "a clone outlives the handle");
        assert!(matches!(A.remove(h), Err(CapiError::BadHandle { .. })), "double destroy is refused");
        assert!(A.remove(std::ptr::null::<u8>()).unwrap().is_none());
        assert!(A.get(0x1234 as *const u8).is_err());
    }
}
