//! A canonical, byte-stable JSON writer: object keys sorted, two-space indentation, arrays of
//! plain values on one line, and floating-point numbers rounded to six significant digits.

use serde_json::{Number, Value};

/// Significant digits kept for floating-point numbers.
pub const SIGNIFICANT_DIGITS: usize = 6;

/// Writes `value` canonically, with a trailing newline.
pub fn to_canonical_string(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, 0, &mut out);
    out.push('\n');
    out
}

/// Rounds to [`SIGNIFICANT_DIGITS`] significant digits. Rounding twice gives the same number,
/// so a plan read back and written again is byte-identical.
pub fn round_significant(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    format!("{:.*e}", SIGNIFICANT_DIGITS - 1, x)
        .parse()
        .unwrap_or(x)
}

fn format_number(number: &Number) -> String {
    if number.is_u64() || number.is_i64() {
        return number.to_string();
    }
    match number.as_f64() {
        // Whole numbers (bytes, bandwidths in a spec) are exact already; printing them whole
        // keeps a spec embedded in a plan identical to the one it came from.
        Some(x) if x.is_finite() && x.fract() == 0.0 && x.abs() < 9.007_199_254_740_992e15 => {
            // `abs` keeps a negative zero from printing as `-0`.
            format!("{:.0}", if x == 0.0 { x.abs() } else { x })
        }
        Some(x) if x.is_finite() => {
            let rounded = round_significant(x);
            // `-0` and `0` must print the same.
            if rounded == 0.0 {
                "0".to_string()
            } else {
                format!("{rounded}")
            }
        }
        _ => "null".to_string(),
    }
}

fn is_plain(value: &Value) -> bool {
    !matches!(value, Value::Array(_) | Value::Object(_))
}

fn indent(level: usize, out: &mut String) {
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn write_value(value: &Value, level: usize, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&format_number(n)),
        Value::String(s) => out.push_str(&Value::String(s.clone()).to_string()),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
            } else if items.iter().all(is_plain) {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_value(item, level, out);
                }
                out.push(']');
            } else {
                out.push_str("[\n");
                for (i, item) in items.iter().enumerate() {
                    indent(level + 1, out);
                    write_value(item, level + 1, out);
                    if i + 1 < items.len() {
                        out.push(',');
                    }
                    out.push('\n');
                }
                indent(level, out);
                out.push(']');
            }
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push_str("{\n");
            for (i, key) in keys.iter().enumerate() {
                indent(level + 1, out);
                out.push_str(&Value::String((*key).clone()).to_string());
                out.push_str(": ");
                write_value(&map[*key], level + 1, out);
                if i + 1 < keys.len() {
                    out.push(',');
                }
                out.push('\n');
            }
            indent(level, out);
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rounds_to_six_significant_digits() {
        assert_eq!(round_significant(1.234_567_89), 1.23457);
        assert_eq!(round_significant(123_456_789.0), 123_457_000.0);
        assert_eq!(round_significant(-0.000_123_456_78), -0.000_123_457);
        let once = round_significant(std::f64::consts::PI);
        assert_eq!(round_significant(once), once);
    }

    #[test]
    fn sorts_keys_and_inlines_plain_arrays() {
        let value = json!({"b": 1, "a": [1, 2.5, "x"], "c": {"z": 0.1, "y": [[1, 2], [3]]}});
        let text = to_canonical_string(&value);
        assert_eq!(
            text,
            "{\n  \"a\": [1, 2.5, \"x\"],\n  \"b\": 1,\n  \"c\": {\n    \"y\": [\n      [1, 2],\n      [3]\n    ],\n    \"z\": 0.1\n  }\n}\n"
        );
    }

    #[test]
    fn floats_print_without_noise() {
        let value = json!([0.1 + 0.2, 2.0, 1e-9 * 3.0, -0.0, f64::NAN]);
        assert_eq!(
            to_canonical_string(&value),
            "[0.3, 2, 0.000000003, 0, null]\n"
        );
    }

    #[test]
    fn whole_numbers_print_exactly() {
        let eighty_gib = 80.0 * 1024f64.powi(3);
        assert_eq!(
            to_canonical_string(&json!([eighty_gib, 4.5e11, 123_456_789.5])),
            "[85899345920, 450000000000, 123457000]\n"
        );
    }
}
