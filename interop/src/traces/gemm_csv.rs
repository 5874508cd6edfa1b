//! A CSV of GEMM timings, the simplest thing a user can measure on their GPUs (a loop over
//! `torch.matmul`, or cuBLAS's own benchmarks, written out). The header names the columns, in
//! any order and case: `m`, `n`, `k` (the product is `m×k · k×n`), and one of `time_us`,
//! `time_ms` or `tflops`; `dtype` (`bf16` or `fp16`, the default `bf16`) when present; other
//! columns are ignored. Sample: `tests/traces/gemm/`.

use super::TraceError;

/// One timed GEMM.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmTiming {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub dtype: String,
    pub seconds: f64,
}

/// How the file gives the time.
#[derive(Clone, Copy)]
enum Rate {
    Microseconds(usize),
    Milliseconds(usize),
    Tflops(usize),
}

/// Reads the CSV.
pub fn parse_gemm_csv(text: &str) -> Result<Vec<GemmTiming>, TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty() && !line.trim_start().starts_with('#'));
    let Some((header_index, header)) = lines.next() else {
        return Err(TraceError {
            line: 1,
            message: "empty: expected a header naming m, n, k and time_us, time_ms or tflops"
                .to_string(),
        });
    };
    let names: Vec<String> = header
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    let column = |name: &str| names.iter().position(|c| c == name);
    let header_error = |message: String| TraceError {
        line: header_index + 1,
        message,
    };
    let (Some(m), Some(n), Some(k)) = (column("m"), column("n"), column("k")) else {
        return Err(header_error(format!(
            "not a GEMM timing CSV: the header `{}` does not name columns m, n and k",
            header.trim()
        )));
    };
    let rate = match (column("time_us"), column("time_ms"), column("tflops")) {
        (Some(c), _, _) => Rate::Microseconds(c),
        (_, Some(c), _) => Rate::Milliseconds(c),
        (_, _, Some(c)) => Rate::Tflops(c),
        _ => {
            return Err(header_error(
                "the header names no time: add a column time_us, time_ms or tflops".to_string(),
            ))
        }
    };
    let dtype = column("dtype");
    let mut timings = Vec::new();
    for (index, line) in lines {
        let error = |message: String| TraceError {
            line: index + 1,
            message,
        };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != names.len() {
            return Err(error(format!(
                "{} fields, but the header names {} columns",
                fields.len(),
                names.len()
            )));
        }
        let size = |at: usize| -> Result<u64, TraceError> {
            fields[at]
                .parse::<u64>()
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| error(format!("{} = `{}` is not a size", names[at], fields[at])))
        };
        let (m, n, k) = (size(m)?, size(n)?, size(k)?);
        let number = |at: usize| -> Result<f64, TraceError> {
            fields[at]
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| {
                    error(format!(
                        "{} = `{}` is not a positive number",
                        names[at], fields[at]
                    ))
                })
        };
        let seconds = match rate {
            Rate::Microseconds(c) => number(c)? * 1e-6,
            Rate::Milliseconds(c) => number(c)? * 1e-3,
            Rate::Tflops(c) => 2.0 * (m as f64) * (n as f64) * (k as f64) / (number(c)? * 1e12),
        };
        let dtype = dtype.map_or("bf16", |c| fields[c]).to_ascii_lowercase();
        if dtype != "bf16" && dtype != "fp16" {
            return Err(error(format!(
                "dtype `{dtype}`: the GEMM primitive describes bf16 and fp16 GEMMs"
            )));
        }
        timings.push(GemmTiming {
            m,
            n,
            k,
            dtype,
            seconds,
        });
    }
    if timings.is_empty() {
        return Err(header_error("the CSV has a header and no rows".to_string()));
    }
    Ok(timings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_rates() {
        let rows = parse_gemm_csv("M,N,K,time_us\n4096,4096,4096,150\n").unwrap();
        assert_eq!((rows[0].m, rows[0].dtype.as_str()), (4096, "bf16"));
        assert!((rows[0].seconds - 150e-6).abs() < 1e-12);
        let rows = parse_gemm_csv("m,n,k,dtype,tflops\n1000,1000,1000,fp16,500\n").unwrap();
        assert!((rows[0].seconds - 4e-6).abs() < 1e-15);
    }

    #[test]
    fn bad_files_say_where() {
        let err = parse_gemm_csv("step,loss\n1,2.5\n").unwrap_err();
        assert!(err.message.starts_with("not a GEMM timing CSV"), "{err}");
        let err = parse_gemm_csv("m,n,k\n1,2,3\n").unwrap_err();
        assert!(err.message.contains("no time"), "{err}");
        let err = parse_gemm_csv("m,n,k,time_us\n1,2,3,4\n8,8,x,4\n").unwrap_err();
        assert_eq!(err.line, 3);
        let err = parse_gemm_csv("m,n,k,dtype,time_us\n8,8,8,fp8,4\n").unwrap_err();
        assert!(err.message.contains("fp8"), "{err}");
    }
}
