//! Layer transfers run by another process: for an engine process on a
//! controller that has no I/O queue pair left to lease (one that grants a
//! single pair, which the pool's owner needs for its metadata), the owner
//! moves the engine's layers on its shared pair, between its own metadata
//! commands, straight into and out of the engine's memory.
//!
//! [`LayerService`] is what the engine's store calls ([`ProxyIo`] adapts it
//! to the store's I/O path); [`LayerHost`] is what the owner runs for one
//! engine: the CPU-driven path ([`DirectIo`]) over a registration of the
//! engine's memory made through DMA spaces that reach that engine.

use super::direct::DirectIo;
use super::{Direction, LayerIo, LayerOutcome, LayerRequest, Pair};
use crate::error::{ObjError, Result};
use crate::geometry::Geometry;
use crate::hash::CacheIdentity;
use crate::layout::{KvLayout, LayerBases};
use crate::registration::{KvMemoryKind, Registration};
use crate::stripe::StripeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::controller::Controller;
use tutti_driver::transport::DmaSpace;

/// The addresses of an engine's KV objects, as sent to the process that
/// moves them: enough to rebuild (and so validate) the layout there.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayoutSpec {
    pub num_blocks: u32,
    pub block_stride: u64,
    /// (K base, V base) of each layer.
    pub layers: Vec<(u64, u64)>,
}

impl LayoutSpec {
    pub fn of(layout: &KvLayout) -> LayoutSpec {
        LayoutSpec {
            num_blocks: layout.num_blocks(),
            block_stride: layout.block_stride(),
            layers: layout.layers().iter().map(|b| (b.k, b.v)).collect(),
        }
    }

    /// The layout with the same object addresses (checked as any layout is).
    pub fn layout(&self, geometry: Geometry) -> Result<KvLayout> {
        let layers = self.layers.iter().map(|&(k, v)| LayerBases { k, v }).collect();
        KvLayout::strided(geometry, self.num_blocks, self.block_stride, layers)
    }
}

/// The I/O calls of an engine's store, served by another process.
pub trait LayerService: Send + Sync {
    fn attach(&self, layout: &LayoutSpec) -> Result<()>;
    fn detach(&self) -> Result<()>;
    fn register_pairs(&self, pairs: &[Pair]) -> Result<Option<u64>>;
    fn unregister_pairs(&self, handle: u64) -> Result<()>;
    /// Starts layer `layer` of `pairs`; `None` when full for now.
    fn submit(&self, req: LayerRequest<'_>) -> Result<Option<u64>>;
    fn poll(&self, token: u64) -> Result<Option<LayerOutcome>>;
}

/// The store's I/O path over a [`LayerService`].
pub(crate) struct ProxyIo {
    service: Arc<dyn LayerService>,
}

impl ProxyIo {
    pub fn new(service: Arc<dyn LayerService>) -> Self {
        ProxyIo { service }
    }
}

impl LayerIo for ProxyIo {
    fn name(&self) -> &'static str {
        "proxied"
    }
    fn mode(&self) -> String {
        "moved by the pool's owner on its shared queue pair (no queue pair was left to lease)".into()
    }
    fn accepts(&self, kind: KvMemoryKind) -> Result<()> {
        if kind.p2p_obstacle().is_some() {
            return Err(ObjError::invalid(
                "memory",
                format!(
                    "{} KV memory needs the staged data path; layers moved by the pool's owner address the \
                     client's memory directly (lease a queue pair for this process instead)",
                    kind.name()
                ),
            ));
        }
        Ok(())
    }

    fn attach(&mut self, reg: &Arc<Registration>, _map: &StripeMap) -> Result<()> {
        self.accepts(reg.memory_kind)?;
        if reg.staged() {
            return Err(ObjError::invalid(
                "memory",
                format!(
                    "{} KV memory is on the staged path ({}), which layers moved by the pool's owner cannot run",
                    reg.memory_kind.name(),
                    reg.p2p_missing.as_deref().unwrap_or("")
                ),
            ));
        }
        self.service.attach(&LayoutSpec::of(&reg.layout))
    }
    fn detach(&mut self) -> Result<()> {
        self.service.detach()
    }
    fn register_pairs(&mut self, pairs: &[Pair]) -> Result<Option<u64>> {
        self.service.register_pairs(pairs)
    }
    fn unregister_pairs(&mut self, handle: u64) -> Result<()> {
        self.service.unregister_pairs(handle)
    }
    fn submit(&mut self, req: LayerRequest<'_>) -> Result<Option<u64>> {
        self.service.submit(req)
    }
    fn progress(&mut self) -> Result<()> {
        Ok(())
    }
    fn poll(&mut self, token: u64) -> Result<Option<LayerOutcome>> {
        self.service.poll(token)
    }
}

/// Layer transfers the pool's owner runs for one engine process.
pub struct LayerHost {
    io: DirectIo,
    map: StripeMap,
    geometry: Geometry,
    reg: Option<Arc<Registration>>,
    /// Tokens submitted and not yet finished.
    in_flight: Vec<u64>,
    /// Pair lists registered and not yet released.
    lists: Vec<u64>,
}

/// Most pairs in one proxied layer or list.
pub const MAX_PROXY_PAIRS: usize = 1 << 20;

impl LayerHost {
    /// `drives`: the pool's drives in pool order (controller, namespace).
    pub fn new(
        drives: &[(Arc<Controller>, u32)],
        map: StripeMap,
        geometry: Geometry,
        depth: u32,
    ) -> Result<Self> {
        Ok(LayerHost {
            io: DirectIo::new(drives, depth, true)?,
            map,
            geometry,
            reg: None,
            in_flight: Vec::new(),
            lists: Vec::new(),
        })
    }

    /// Registers the engine's memory described by `spec`, mapped through
    /// `spaces` (one per drive, each reaching the engine's memory).
    ///
    /// # Safety
    /// Every DMA space in `spaces` must map addresses of the engine's process
    /// (not this one's), so that no mapping reaches this process's memory.
    pub unsafe fn attach(&mut self, spec: &LayoutSpec, spaces: &[Arc<dyn DmaSpace>]) -> Result<()> {
        if !self.in_flight.is_empty() || !self.lists.is_empty() {
            return Err(ObjError::invalid(
                "layout",
                "transfers or pair lists are still open; finish them first",
            ));
        }
        let layout = spec.layout(self.geometry)?;
        let identity = CacheIdentity::new("proxied", self.geometry, layout.kind(), b"");
        self.io.detach()?;
        self.reg = None;
        // SAFETY: forwarded from the caller: the spaces map the engine's memory.
        let reg = Arc::new(unsafe {
            Registration::new(layout, identity, spaces, &self.map, None, KvMemoryKind::Host, None)?
        });
        self.io.attach(&reg, &self.map)?;
        self.reg = Some(reg);
        Ok(())
    }

    pub fn detach(&mut self) -> Result<()> {
        if !self.in_flight.is_empty() {
            return Err(ObjError::invalid("layout", "transfers are still in flight"));
        }
        self.io.detach()?;
        self.reg = None;
        Ok(())
    }

    /// Pairs within the pool's files and the engine's registered blocks.
    fn check(&self, pairs: &[Pair]) -> Result<()> {
        let reg = self.reg.as_ref().ok_or(ObjError::NotRegistered)?;
        if pairs.len() > MAX_PROXY_PAIRS {
            return Err(ObjError::invalid(
                "pairs",
                format!("{} pairs; at most {MAX_PROXY_PAIRS}", pairs.len()),
            ));
        }
        let (files, blocks) = (self.map.files(), reg.layout.num_blocks());
        match pairs.iter().find(|p| p.file >= files || p.block >= blocks) {
            Some(p) => Err(ObjError::invalid(
                "pairs",
                format!("(file {}, block {}) is outside {files} files and {blocks} blocks", p.file, p.block),
            )),
            None => Ok(()),
        }
    }

    pub fn register_pairs(&mut self, pairs: &[Pair]) -> Result<Option<u64>> {
        self.check(pairs)?;
        let h = self.io.register_pairs(pairs)?;
        self.lists.extend(h);
        Ok(h)
    }

    pub fn unregister_pairs(&mut self, handle: u64) -> Result<()> {
        if !self.lists.contains(&handle) {
            return Err(ObjError::Unknown { what: "pair list", id: handle });
        }
        self.io.unregister_pairs(handle)?;
        self.lists.retain(|&h| h != handle);
        Ok(())
    }

    pub fn submit(
        &mut self,
        layer: u32,
        pairs: &[Pair],
        dir: Direction,
        registered: Option<u64>,
    ) -> Result<Option<u64>> {
        if layer >= self.geometry.layers {
            return Err(ObjError::invalid("layer", format!("{layer} is not below {}", self.geometry.layers)));
        }
        if registered.is_some_and(|h| !self.lists.contains(&h)) {
            return Err(ObjError::invalid("registered", "not a pair list of this engine"));
        }
        self.check(pairs)?;
        let token = self.io.submit(LayerRequest { layer, pairs, dir, registered })?;
        self.in_flight.extend(token);
        Ok(token)
    }

    pub fn poll(&mut self, token: u64) -> Result<Option<LayerOutcome>> {
        if !self.in_flight.contains(&token) {
            return Err(ObjError::Unknown { what: "transfer", id: token });
        }
        let out = self.io.poll(token)?;
        if out.is_some() {
            self.in_flight.retain(|&t| t != token);
        }
        Ok(out)
    }

    /// Transfers not finished yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Waits (bounded by `within`) for every transfer in flight to finish,
    /// e.g. before the engine's files are given back when it went away.
    /// Returns whether all finished: a transfer still running after that
    /// may yet move data (its commands timed out and were not recovered).
    pub fn drain(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.in_flight.is_empty() && Instant::now() < deadline {
            let tokens = self.in_flight.clone();
            for t in tokens {
                match self.io.poll(t) {
                    Ok(Some(_)) | Err(_) => self.in_flight.retain(|&x| x != t),
                    Ok(None) => {}
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        self.in_flight.is_empty()
    }
}
