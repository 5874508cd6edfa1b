//! Per-rank memory accounting by category: what the rank holds live on the device (and what
//! offload moved to host memory), and the peaks.

/// What a block of memory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MemoryCategory {
    Weights,
    Grads,
    Optimizer,
    Activations,
}

const CATEGORIES: usize = 4;

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
}

impl MemoryBreakdown {
    pub fn total(&self) -> u64 {
        self.weights + self.grads + self.optimizer + self.activations
    }

    fn from_array(a: [u64; CATEGORIES]) -> Self {
        MemoryBreakdown {
            weights: a[0],
            grads: a[1],
            optimizer: a[2],
            activations: a[3],
        }
    }
}

/// Peaks of one rank: device bytes per category (each category's own peak), the peak of the
/// device total, and the peak of host bytes (offloaded state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryPeaks {
    pub device: MemoryBreakdown,
    pub device_total: u64,
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
    offload: [f64; CATEGORIES],
}

impl MemoryTracker {
    /// `offload` holds the fractions moved to host for weights, grads, optimizer, activations.
    pub fn new(offload: [f64; CATEGORIES]) -> Self {
        MemoryTracker {
            offload,
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
        self.peak_total = self.peak_total.max(self.device.iter().sum());
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
    }
}
