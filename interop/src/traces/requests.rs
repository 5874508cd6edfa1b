//! Request traces for serving workloads: the Azure LLM inference traces (Patel et al.,
//! "Splitwise", ISCA 2024; Azure/AzurePublicDataset, `AzureLLMInferenceTrace_{code,conv}.csv`
//! and the 2024 week-long traces), a CSV of
//!
//! ```text
//! TIMESTAMP,ContextTokens,GeneratedTokens
//! 2023-11-16 18:17:03.9799600,4808,10
//! ```
//!
//! one request a line: its arrival (wall clock, UTC, up to 100 ns ticks), prompt tokens and
//! output tokens. Arrivals are returned in seconds from the first request, sorted.

use tessel_grammar::Request;

use super::TraceError;

const HEADER: [&str; 3] = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `2023-11-16 18:17:03.9799600` as seconds since the epoch.
fn parse_timestamp(text: &str) -> Option<f64> {
    let (date, time) = text.trim().split_once(' ')?;
    let mut d = date.split('-');
    let year: i64 = d.next()?.parse().ok()?;
    let month: i64 = d.next()?.parse().ok()?;
    let day: i64 = d.next()?.parse().ok()?;
    if d.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let mut t = time.split(':');
    let hour: i64 = t.next()?.parse().ok()?;
    let minute: i64 = t.next()?.parse().ok()?;
    let seconds: f64 = t.next()?.parse().ok()?;
    if t.next().is_some() || hour > 23 || minute > 59 || !(0.0..61.0).contains(&seconds) {
        return None;
    }
    let whole = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60;
    Some(whole as f64 + seconds)
}

/// Reads an Azure LLM inference trace; rows out of time order are sorted.
pub fn parse_request_trace(text: &str) -> Result<Vec<Request>, TraceError> {
    let mut lines = text.lines().enumerate();
    let header = lines
        .next()
        .map(|(_, line)| line.trim_start_matches('\u{feff}').trim())
        .unwrap_or("");
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    if columns != HEADER {
        return Err(TraceError {
            line: 1,
            message: format!(
                "expected the header `{}` of the Azure LLM inference trace, found `{header}`",
                HEADER.join(",")
            ),
        });
    }
    let mut rows = Vec::new();
    for (index, line) in lines {
        let line_number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        let error = |message: String| TraceError {
            line: line_number,
            message,
        };
        if fields.len() != 3 {
            return Err(error(format!(
                "expected 3 fields (TIMESTAMP,ContextTokens,GeneratedTokens), found {}",
                fields.len()
            )));
        }
        let at = parse_timestamp(fields[0]).ok_or_else(|| {
            error(format!(
                "`{}` is not a timestamp like `2023-11-16 18:17:03.9799600`",
                fields[0]
            ))
        })?;
        let count = |name: &str, text: &str| -> Result<u64, TraceError> {
            text.trim()
                .parse::<u64>()
                .map_err(|_| error(format!("{name} `{text}` is not a whole number of tokens")))
        };
        let prompt = count("ContextTokens", fields[1])?;
        let output = count("GeneratedTokens", fields[2])?;
        if prompt == 0 || output == 0 {
            return Err(error(
                "a request needs at least one prompt token and one output token".into(),
            ));
        }
        rows.push((at, prompt, output));
    }
    if rows.is_empty() {
        return Err(TraceError {
            line: 1,
            message: "the trace has no requests".into(),
        });
    }
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let start = rows[0].0;
    Ok(rows
        .into_iter()
        .map(|(at, prompt, output)| Request {
            arrival: at - start,
            prompt,
            output,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_count_days_from_the_epoch() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2023, 11, 16), 19_677);
    }

    #[test]
    fn bad_rows_name_their_line() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,48,10\n\
                    2023-11-16 18:17:04,x,8\n";
        let error = parse_request_trace(text).unwrap_err();
        assert_eq!(error.line, 3);
        assert!(error.message.contains("ContextTokens `x`"), "{error}");
        let error = parse_request_trace("time,prompt,output\n").unwrap_err();
        assert_eq!(error.line, 1);
    }
}
