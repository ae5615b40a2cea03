//! The I/O path of a store that moves no bytes (a control-only client of the
//! pool's owner, such as an engine's scheduler process): every data call is
//! refused, naming why, before anything is touched.

use super::{LayerIo, LayerOutcome, LayerRequest};
use crate::error::{ObjError, Result};
use crate::registration::{KvMemoryKind, Registration};
use crate::stripe::StripeMap;
use std::sync::Arc;

pub(crate) struct NoIo;

fn refused() -> ObjError {
    ObjError::invalid(
        "store",
        "this store is control-only (it leased no queue pairs): it looks up, pins and reports, and moves no bytes",
    )
}

impl LayerIo for NoIo {
    fn name(&self) -> &'static str {
        "control-only"
    }
    fn mode(&self) -> String {
        "none: control only, no queue pairs".into()
    }
    fn accepts(&self, _kind: KvMemoryKind) -> Result<()> {
        Err(refused())
    }
    fn attach(&mut self, _reg: &Arc<Registration>, _map: &StripeMap) -> Result<()> {
        Err(refused())
    }
    fn detach(&mut self) -> Result<()> {
        Ok(())
    }
    fn submit(&mut self, _req: LayerRequest<'_>) -> Result<Option<u64>> {
        Err(refused())
    }
    fn progress(&mut self) -> Result<()> {
        Ok(())
    }
    fn poll(&mut self, token: u64) -> Result<Option<LayerOutcome>> {
        Err(ObjError::Unknown { what: "transfer", id: token })
    }
}
