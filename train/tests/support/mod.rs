//! What the data-parallel tests share.

use ndfuse::{CpuDevice, Device, DeviceSet};
use std::sync::Arc;

/// `n` CPU devices sharing `threads` worker threads.
pub fn cpus(n: usize, threads: usize) -> Arc<DeviceSet> {
    let devices: Vec<Arc<dyn Device>> = CpuDevice::split(n, threads)
        .unwrap()
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect();
    Arc::new(DeviceSet::new(devices, &ndfuse::Config::load().unwrap()).unwrap())
}
