//! The fds of one opened device, shared by its BAR0 mapping and its DMA space.

use super::container::Container;
use super::device::Device;
use super::group::Group;
use super::options::IommuMode;

/// The fds of one opened device. Fields drop in order: device, group, container.
pub struct Shared {
    pub(super) device: Device,
    pub(super) group: Group,
    pub(super) container: Container,
    pub(super) name: String,
    pub(super) mode: IommuMode,
}
