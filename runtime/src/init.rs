//! Deterministic parameter initialisation: element `i` of the global tensor `name` depends
//! only on (seed, name, i), so every sharding of the model starts from the same global model.

/// SplitMix64 (Steele, Lea & Flood 2014) finaliser: a well-mixed 64-bit hash.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of a parameter name.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How a parameter starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Normal with this standard deviation.
    Normal(f32),
    Constant(f32),
}

/// Element `index` of global tensor `name`.
pub fn init_value(seed: u64, name: &str, index: u64, init: Init) -> f32 {
    match init {
        Init::Constant(c) => c,
        Init::Normal(std) => {
            let h = splitmix64(seed ^ name_hash(name) ^ splitmix64(index));
            let u1 = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let u2 = ((splitmix64(h) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            // Box–Muller.
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (z * f64::from(std)) as f32
        }
    }
}

/// The block `[rows.0, rows.1) × [cols.0, cols.1)` of a global `global_cols`-wide tensor.
pub fn init_block(
    seed: u64,
    name: &str,
    global_cols: u64,
    rows: (u64, u64),
    cols: (u64, u64),
    init: Init,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(((rows.1 - rows.0) * (cols.1 - cols.0)) as usize);
    for r in rows.0..rows.1 {
        for c in cols.0..cols.1 {
            out.push(init_value(seed, name, r * global_cols + c, init));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_reassemble_the_global_tensor() {
        let init = Init::Normal(0.02);
        let full = init_block(3, "w", 6, (0, 4), (0, 6), init);
        let left = init_block(3, "w", 6, (0, 4), (0, 3), init);
        let right = init_block(3, "w", 6, (0, 4), (3, 6), init);
        for r in 0..4 {
            assert_eq!(&full[r * 6..r * 6 + 3], &left[r * 3..r * 3 + 3]);
            assert_eq!(&full[r * 6 + 3..r * 6 + 6], &right[r * 3..r * 3 + 3]);
        }
        assert_ne!(init_block(3, "v", 6, (0, 4), (0, 6), init), full);
    }

    #[test]
    fn normal_init_has_the_requested_spread() {
        let v = init_block(1, "x", 1000, (0, 20), (0, 1000), Init::Normal(0.5));
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var.sqrt() - 0.5).abs() < 0.01, "{var}");
    }
}
