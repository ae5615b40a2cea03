//! The P2P probe of a registration of device KV memory: real commands on
//! every drive, bytes checked through the provider (the steps are in
//! [`crate::p2p`]'s module documentation).

use crate::drives::DriveView;
use crate::p2p::DeviceKvMemory;
use crate::registration::Registration;
use tutti_driver::command::DataMode;
use tutti_driver::transport::IovaSegment;

/// Probes every drive of a P2P registration; `Err` is the verdict in words.
pub(crate) fn probe(
    reg: &Registration,
    drives: &[DriveView],
    dev: &DeviceKvMemory,
) -> std::result::Result<(), String> {
    let target = reg.layout.object_addr(0, 0, 0);
    for (d, view) in drives.iter().enumerate() {
        let spec = view
            .spec
            .as_ref()
            .ok_or_else(|| format!("drive {} is not reachable from this store", view.device))?;
        let desc = reg.descriptor(d as u32, 0, 0, 0, 0);
        let n = view.shape.lba_size as usize;
        if (desc.len as usize) < n {
            return Err(format!(
                "the target's first chunk ({} bytes) is smaller than one LBA of {}",
                desc.len, view.device
            ));
        }
        probe_drive(spec, n, target, desc.addr, dev).map_err(|why| {
            format!("P2P probe of {} on {} (iova {:#x}): {why}", dev.provider, view.device, desc.addr)
        })?;
        tracing::info!(drive = %view.device, provider = %dev.provider, iova = desc.addr, "P2P probe passed");
    }
    Ok(())
}

fn probe_drive(
    spec: &crate::drives::DriveSpec,
    n: usize,
    target: u64,
    iova: u64,
    dev: &DeviceKvMemory,
) -> std::result::Result<(), String> {
    let e = |what: &str, err: &dyn std::fmt::Display| format!("{what}: {err}");
    let host = spec.ctrl.dma().alloc(n).map_err(|x| e("allocating host memory for the probe", &x))?;
    let shared = spec.ctrl.shared_io_queue_pair(8).map_err(|x| e("no queue pair for the probe", &x))?;
    let mut qp = shared.lock().map_err(|_| "the probe's queue pair is poisoned".to_string())?;
    let seg = [IovaSegment { iova, len: n as u64 }];
    let nsid = spec.nsid;
    qp.read_buf(nsid, 0, &host, 0, n, DataMode::Auto).map_err(|x| e("reading LBA 0 into host memory", &x))?;
    let mut expected = vec![0u8; n];
    host.copy_out(0, &mut expected).map_err(|x| e("host buffer", &x))?;
    let mut saved = vec![0u8; n];
    dev.access.read(target, &mut saved).map_err(|x| e("reading the target through the provider", &x))?;
    let outcome = (|| {
        let complement: Vec<u8> = expected.iter().map(|b| !b).collect();
        dev.access
            .write(target, &complement)
            .map_err(|x| e("filling the target through the provider", &x))?;
        qp.read(nsid, 0, &seg, DataMode::Auto)
            .map_err(|x| e("the drive's Read into the target failed", &x))?;
        let mut got = vec![0u8; n];
        dev.access
            .read(target, &mut got)
            .map_err(|x| e("reading the target back through the provider", &x))?;
        if let Some(msg) = differ(&got, &expected) {
            return Err(format!(
                "the drive's {n}-byte Read into the target completed with success status, but {msg}: the \
                 platform did not deliver the peer DMA (blocked by the IOMMU, or not routed)"
            ));
        }
        qp.write(nsid, 0, &seg, DataMode::Auto)
            .map_err(|x| e("the drive's Write from the target failed", &x))?;
        host.fill(0);
        qp.read_buf(nsid, 0, &host, 0, n, DataMode::Auto).map_err(|x| e("reading LBA 0 back", &x))?;
        let mut back = vec![0u8; n];
        host.copy_out(0, &mut back).map_err(|x| e("host buffer", &x))?;
        if let Some(msg) = differ(&back, &expected) {
            // Put LBA 0 back as it was before saying why.
            let restored = host
                .copy_in(0, &expected)
                .map_err(|x| x.to_string())
                .and_then(|()| qp.write_buf(nsid, 0, &host, 0, n, DataMode::Auto).map_err(|x| x.to_string()));
            return Err(format!(
                "the drive's {n}-byte Write from the target completed, but LBA 0 then {msg} (the drive did not \
                 read the peer memory); {}",
                match restored {
                    Ok(()) => "LBA 0 was rewritten from host memory".to_string(),
                    Err(r) => format!("rewriting LBA 0 from host memory failed too: {r}"),
                }
            ));
        }
        Ok(())
    })();
    let restore = dev.access.write(target, &saved).map_err(|x| e("restoring the target's bytes", &x));
    outcome.and(restore)
}

/// `None` when equal; else how many bytes differ and the first one.
fn differ(got: &[u8], want: &[u8]) -> Option<String> {
    let bad = got.iter().zip(want).filter(|(a, b)| a != b).count();
    let first = got.iter().zip(want).position(|(a, b)| a != b)?;
    Some(format!(
        "{bad} of {} bytes differ from the drive's data (first at byte {first}: {:#04x}, expected {:#04x})",
        want.len(),
        got[first],
        want[first]
    ))
}
