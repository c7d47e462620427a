//! Device identities (`cpu:0`, `cuda:1`) and the record of an evaluation that moved
//! from one device to another.

use std::fmt;

/// What kind of device an id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The host CPU, or one part of it when the set splits it.
    Cpu,
    /// A CUDA GPU; the index is the driver's ordinal.
    Cuda,
    /// A device from outside ndfuse (an embedder's, a test's), by its kind name.
    Other(&'static str),
}

/// A device's identity: `cpu:0`, `cuda:1`. Outside a device set, `cpu:0` is the whole
/// host.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceId {
    /// The kind.
    pub kind: DeviceKind,
    /// The index among devices of its kind.
    pub index: usize,
}

impl DeviceId {
    /// CPU device `index`.
    pub fn cpu(index: usize) -> DeviceId {
        DeviceId {
            kind: DeviceKind::Cpu,
            index,
        }
    }

    /// CUDA device with driver ordinal `ordinal`.
    pub fn cuda(ordinal: usize) -> DeviceId {
        DeviceId {
            kind: DeviceKind::Cuda,
            index: ordinal,
        }
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Other(name) => name,
        };
        write!(f, "{kind}:{}", self.index)
    }
}

/// An evaluation that left a device, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceMove {
    /// The device that could not run it.
    pub from: DeviceId,
    /// The device it went to next.
    pub to: DeviceId,
    /// The error `from` reported.
    pub reason: String,
}

impl fmt::Display for DeviceMove {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {}: {}", self.from, self.to, self.reason)
    }
}
