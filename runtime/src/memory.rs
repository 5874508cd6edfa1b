//! Per-rank memory accounting by category: what the rank holds live on the device (and what
//! offload moved to host memory), and the peaks.

/// What a block of memory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MemoryCategory {
    Weights,
    Grads,
    Optimizer,
    Activations,
    /// Transient full-size copies that ZeRO-2/3 keep only while one layer is in use: the
    /// gathered ZeRO-3 weights and a layer's unsharded gradients before their reduce-scatter.
    /// The cost model counts these under its buffers, apart from its four state components.
    Buffers,
}

const CATEGORIES: usize = 5;

impl MemoryCategory {
    fn index(self) -> usize {
        self as usize
    }
}

/// Bytes by category.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryBreakdown {
    pub weights: u64,
    pub grads: u64,
    pub optimizer: u64,
    pub activations: u64,
    pub buffers: u64,
}

impl MemoryBreakdown {
    /// Weights, gradients, optimizer states and activations: the components the cost model
    /// predicts one by one (buffers are left out).
    pub fn total(&self) -> u64 {
        self.weights + self.grads + self.optimizer + self.activations
    }

    fn from_array(a: [u64; CATEGORIES]) -> Self {
        MemoryBreakdown {
            weights: a[0],
            grads: a[1],
            optimizer: a[2],
            activations: a[3],
            buffers: a[4],
        }
    }
}

/// Peaks of one rank: device bytes per category (each category's own peak), the peak of the
/// device total without and with the transient buffers, and the peak of host bytes
/// (offloaded state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryPeaks {
    pub device: MemoryBreakdown,
    /// Peak of weights + gradients + optimizer states + activations.
    pub device_total: u64,
    /// Peak of everything on the device, buffers included.
    pub device_total_with_buffers: u64,
    pub host: MemoryBreakdown,
}

/// Live and peak bytes of one rank. Offload fractions split each allocation between device
/// and host; on the CPU backend that is an accounting distinction only.
#[derive(Clone, Debug, Default)]
pub struct MemoryTracker {
    device: [u64; CATEGORIES],
    host: [u64; CATEGORIES],
    peak_device: [u64; CATEGORIES],
    peak_host: [u64; CATEGORIES],
    peak_total: u64,
    peak_total_with_buffers: u64,
    offload: [f64; CATEGORIES],
}

impl MemoryTracker {
    /// `offload` holds the fractions moved to host for weights, grads, optimizer, activations;
    /// buffers are never offloaded.
    pub fn new(offload: [f64; 4]) -> Self {
        let [w, g, o, a] = offload;
        MemoryTracker {
            offload: [w, g, o, a, 0.0],
            ..Default::default()
        }
    }

    fn split(&self, category: MemoryCategory, bytes: u64) -> (u64, u64) {
        let host = (bytes as f64 * self.offload[category.index()]).round() as u64;
        (bytes - host, host)
    }

    pub fn alloc(&mut self, category: MemoryCategory, bytes: u64) {
        let (dev, host) = self.split(category, bytes);
        let i = category.index();
        self.device[i] += dev;
        self.host[i] += host;
        self.peak_device[i] = self.peak_device[i].max(self.device[i]);
        self.peak_host[i] = self.peak_host[i].max(self.host[i]);
        let buffers = MemoryCategory::Buffers.index();
        let with_buffers: u64 = self.device.iter().sum();
        self.peak_total = self.peak_total.max(with_buffers - self.device[buffers]);
        self.peak_total_with_buffers = self.peak_total_with_buffers.max(with_buffers);
    }

    pub fn free(&mut self, category: MemoryCategory, bytes: u64) {
        let (dev, host) = self.split(category, bytes);
        let i = category.index();
        self.device[i] = self.device[i].saturating_sub(dev);
        self.host[i] = self.host[i].saturating_sub(host);
    }

    pub fn live(&self) -> MemoryBreakdown {
        MemoryBreakdown::from_array(self.device)
    }

    pub fn peaks(&self) -> MemoryPeaks {
        MemoryPeaks {
            device: MemoryBreakdown::from_array(self.peak_device),
            device_total: self.peak_total,
            device_total_with_buffers: self.peak_total_with_buffers,
            host: MemoryBreakdown::from_array(self.peak_host),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_peaks_and_offload_split() {
        let mut m = MemoryTracker::new([0.0, 0.0, 0.5, 0.0]);
        m.alloc(MemoryCategory::Weights, 100);
        m.alloc(MemoryCategory::Activations, 40);
        m.free(MemoryCategory::Activations, 40);
        m.alloc(MemoryCategory::Optimizer, 200);
        let p = m.peaks();
        assert_eq!(p.device.weights, 100);
        assert_eq!(p.device.activations, 40);
        assert_eq!(p.device.optimizer, 100);
        assert_eq!(p.host.optimizer, 100);
        assert_eq!(p.device_total, 200);
        assert_eq!(m.live().activations, 0);
        m.alloc(MemoryCategory::Buffers, 1000);
        let p = m.peaks();
        assert_eq!(p.device.buffers, 1000);
        assert_eq!(p.device_total, 200);
        assert_eq!(p.device_total_with_buffers, 1200);
    }
}
