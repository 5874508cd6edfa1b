//! Fixed number formatting for generated text, so output is byte-identical everywhere.

/// `8030261248` → `8,030,261,248`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `8030261248` → `8.03 B`; `124439808` → `124.4 M`.
pub fn short_count(n: u64) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.2} B", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.1} M", x / 1e6)
    } else {
        thousands(n)
    }
}

/// A signed percentage with two decimals: `+0.04%`, `-40.00%`.
pub fn percent_change(ours: f64, reference: f64) -> String {
    if reference == 0.0 {
        return "n/a".to_string();
    }
    format!("{:+.2}%", (ours - reference) / reference * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(8_030_261_248), "8,030,261,248");
    }

    #[test]
    fn short_counts() {
        assert_eq!(short_count(8_030_261_248), "8.03 B");
        assert_eq!(short_count(124_439_808), "124.4 M");
        assert_eq!(short_count(512), "512");
    }

    #[test]
    fn percent_changes() {
        assert_eq!(percent_change(12288.0, 20480.0), "-40.00%");
        assert_eq!(percent_change(187_170_816.0, 187_105_280.0), "+0.04%");
        assert_eq!(percent_change(1.0, 0.0), "n/a");
    }
}
