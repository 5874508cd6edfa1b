//! Units and dimensions. Quantities are stored in SI base units: bytes, seconds, FLOP.

use crate::suggest;

/// Exponents of bytes, FLOP and seconds. A size is `B`, a bandwidth `B/s`, a compute rate
/// `FLOP/s`, a time `s`; a plain number has all exponents zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dim {
    pub bytes: i32,
    pub flops: i32,
    pub seconds: i32,
}

impl Dim {
    pub const NUMBER: Dim = Dim::new(0, 0, 0);
    pub const SIZE: Dim = Dim::new(1, 0, 0);
    pub const BANDWIDTH: Dim = Dim::new(1, 0, -1);
    pub const COMPUTE: Dim = Dim::new(0, 1, -1);
    pub const TIME: Dim = Dim::new(0, 0, 1);
    pub const WORK: Dim = Dim::new(0, 1, 0);
    /// Events per second: a request rate, `6/s`.
    pub const RATE: Dim = Dim::new(0, 0, -1);

    const fn new(bytes: i32, flops: i32, seconds: i32) -> Dim {
        Dim {
            bytes,
            flops,
            seconds,
        }
    }

    pub fn times(self, other: Dim) -> Dim {
        Dim::new(
            self.bytes.saturating_add(other.bytes),
            self.flops.saturating_add(other.flops),
            self.seconds.saturating_add(other.seconds),
        )
    }

    pub fn divided_by(self, other: Dim) -> Dim {
        Dim::new(
            self.bytes.saturating_sub(other.bytes),
            self.flops.saturating_sub(other.flops),
            self.seconds.saturating_sub(other.seconds),
        )
    }

    /// "a size", "a bandwidth", ...; other products of units by their base units.
    pub fn describe(self) -> String {
        match self {
            Dim::NUMBER => "a number".into(),
            Dim::SIZE => "a size".into(),
            Dim::BANDWIDTH => "a bandwidth".into(),
            Dim::COMPUTE => "a compute rate".into(),
            Dim::TIME => "a time".into(),
            Dim::WORK => "an amount of work (FLOP)".into(),
            Dim::RATE => "a rate".into(),
            _ => {
                let mut parts = Vec::new();
                for (name, exponent) in
                    [("B", self.bytes), ("FLOP", self.flops), ("s", self.seconds)]
                {
                    match exponent {
                        0 => {}
                        1 => parts.push(name.to_string()),
                        e => parts.push(format!("{name}^{e}")),
                    }
                }
                format!("a quantity in {}", parts.join("·"))
            }
        }
    }

    /// A value of this dimension as a user would write it, for error messages.
    pub fn example(self) -> &'static str {
        match self {
            Dim::SIZE => "`80 GiB`",
            Dim::BANDWIDTH => "`400 GB/s`",
            Dim::COMPUTE => "`989 TFLOPS`",
            Dim::TIME => "`5 us`",
            Dim::RATE => "`6/s`",
            _ => "`8`",
        }
    }
}

/// Every unit the language knows: spelling, dimension, and its size in base units as a
/// fraction `multiplier / divisor` (dividing keeps `10 us` exactly `1e-5`).
pub const UNITS: &[(&str, Dim, f64, f64)] = &[
    ("B", Dim::SIZE, 1.0, 1.0),
    ("KB", Dim::SIZE, 1e3, 1.0),
    ("MB", Dim::SIZE, 1e6, 1.0),
    ("GB", Dim::SIZE, 1e9, 1.0),
    ("TB", Dim::SIZE, 1e12, 1.0),
    ("KiB", Dim::SIZE, 1024.0, 1.0),
    ("MiB", Dim::SIZE, 1024.0 * 1024.0, 1.0),
    ("GiB", Dim::SIZE, 1024.0 * 1024.0 * 1024.0, 1.0),
    ("TiB", Dim::SIZE, 1024.0 * 1024.0 * 1024.0 * 1024.0, 1.0),
    ("MB/s", Dim::BANDWIDTH, 1e6, 1.0),
    ("GB/s", Dim::BANDWIDTH, 1e9, 1.0),
    ("TB/s", Dim::BANDWIDTH, 1e12, 1.0),
    // Network links are quoted in bits; 8 bits to the byte.
    ("Gb/s", Dim::BANDWIDTH, 1e9, 8.0),
    ("Gbps", Dim::BANDWIDTH, 1e9, 8.0),
    ("Tb/s", Dim::BANDWIDTH, 1e12, 8.0),
    ("GFLOPS", Dim::COMPUTE, 1e9, 1.0),
    ("TFLOPS", Dim::COMPUTE, 1e12, 1.0),
    ("PFLOPS", Dim::COMPUTE, 1e15, 1.0),
    ("ns", Dim::TIME, 1.0, 1e9),
    ("us", Dim::TIME, 1.0, 1e6),
    ("ms", Dim::TIME, 1.0, 1e3),
    ("s", Dim::TIME, 1.0, 1.0),
    ("min", Dim::TIME, 60.0, 1.0),
    ("h", Dim::TIME, 3600.0, 1.0),
];

/// The dimension of a unit and the function from a number in it to base units, or a
/// suggestion for a misspelt one.
pub fn lookup(unit: &str) -> Result<(Dim, f64, f64), Option<String>> {
    if let Some(&(_, dim, multiplier, divisor)) = UNITS.iter().find(|(name, ..)| *name == unit) {
        return Ok((dim, multiplier, divisor));
    }
    // Exact case-insensitive matches first (`gib`), then by edit distance (`TFLOP/s`).
    let names = UNITS.iter().map(|(name, ..)| *name);
    if let Some(name) = names.clone().find(|n| n.eq_ignore_ascii_case(unit)) {
        return Err(Some(name.to_string()));
    }
    Err(suggest::closest(unit, names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_to_base_units() {
        let base = |value: f64, unit: &str| {
            let (dim, multiplier, divisor) = lookup(unit).unwrap();
            (value * multiplier / divisor, dim)
        };
        assert_eq!(base(80.0, "GiB"), (85899345920.0, Dim::SIZE));
        assert_eq!(base(2.0, "TB"), (2e12, Dim::SIZE));
        assert_eq!(base(200.0, "Gb/s"), (25e9, Dim::BANDWIDTH));
        assert_eq!(base(400.0, "Gbps"), (50e9, Dim::BANDWIDTH));
        assert_eq!(base(1.6, "Tb/s"), (200e9, Dim::BANDWIDTH));
        assert_eq!(base(989.0, "TFLOPS"), (989e12, Dim::COMPUTE));
        assert_eq!(base(10.0, "us"), (1e-5, Dim::TIME));
        assert_eq!(base(3.0, "ns"), (3e-9, Dim::TIME));
        assert_eq!(base(2.0, "min"), (120.0, Dim::TIME));
    }

    #[test]
    fn unknown_units_get_suggestions() {
        assert_eq!(lookup("gib"), Err(Some("GiB".into())));
        assert_eq!(lookup("TFLOP/s"), Err(Some("TFLOPS".into())));
        assert_eq!(lookup("parsecs"), Err(None));
    }

    #[test]
    fn dimension_algebra() {
        assert_eq!(Dim::SIZE.divided_by(Dim::TIME), Dim::BANDWIDTH);
        assert_eq!(Dim::BANDWIDTH.times(Dim::TIME), Dim::SIZE);
        assert_eq!(Dim::SIZE.divided_by(Dim::SIZE), Dim::NUMBER);
        assert_eq!(Dim::SIZE.times(Dim::SIZE).describe(), "a quantity in B^2");
        assert_eq!(
            Dim::COMPUTE.times(Dim::TIME).describe(),
            "an amount of work (FLOP)"
        );
    }
}
