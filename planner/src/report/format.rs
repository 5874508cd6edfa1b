//! Fixed number formatting for the report, so the same plan gives the same bytes.

use tessel_grammar::{Offload, Recompute};

/// Seconds in s or ms with four significant-ish digits: `2.505 s`, `812.3 ms`, `41.25 us`.
pub fn seconds(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude == 0.0 {
        "0 s".to_string()
    } else if magnitude >= 1.0 {
        format!("{value:.3} s")
    } else if magnitude >= 1e-3 {
        format!("{:.1} ms", value * 1e3)
    } else {
        format!("{:.2} us", value * 1e6)
    }
}

/// GiB with two decimals.
pub fn gib(value: f64) -> String {
    format!("{value:.2} GiB")
}

/// A fraction as a percentage with one decimal.
pub fn percent(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

/// Tokens per second with thousands separators.
pub fn rate(value: f64) -> String {
    let whole = value.max(0.0).round() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A coordinate in the SVG: two decimals, no trailing zeros.
pub fn coord(value: f64) -> String {
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_string()
    } else {
        text.to_string()
    }
}

pub fn recompute(value: &Recompute) -> String {
    match value {
        Recompute::None => "none".to_string(),
        Recompute::Selective => "selective".to_string(),
        Recompute::Full => "full".to_string(),
        Recompute::Partial { full_layers } => format!("{full_layers} layers full"),
        Recompute::Modules(modules) => format!("modules ({modules})"),
    }
}

pub fn offload(value: &Offload) -> String {
    if value.is_none() {
        return "none".to_string();
    }
    let parts = [
        ("optimizer", value.optimizer),
        ("weights", value.weights),
        ("gradients", value.gradients),
        ("activations", value.activations),
    ];
    parts
        .iter()
        .filter(|(_, f)| *f > 0.0)
        .map(|(name, f)| format!("{name} {}", percent(*f)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_have_fixed_forms() {
        assert_eq!(seconds(2.50489), "2.505 s");
        assert_eq!(seconds(0.0), "0 s");
        assert_eq!(seconds(0.8123), "812.3 ms");
        assert_eq!(seconds(4.125e-5), "41.25 us");
        assert_eq!(rate(1_234_567.4), "1,234,567");
        assert_eq!(coord(12.5), "12.5");
        assert_eq!(coord(-0.001), "0");
        assert_eq!(percent(0.4567), "45.7%");
    }
}
