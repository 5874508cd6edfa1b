//! The request-trace reader on a real public sample: the first 60 requests of Azure's 2023 LLM
//! inference trace for code (see `tests/data/serving/README.md`).

use tessel_interop::traces::parse_request_trace;

#[test]
fn reads_the_azure_code_trace() {
    let text = include_str!("data/serving/azure_llm_code_head.csv");
    let requests = parse_request_trace(text).unwrap();
    assert_eq!(requests.len(), 60);
    assert_eq!(requests[0].arrival, 0.0);
    assert_eq!((requests[0].prompt, requests[0].output), (4808, 10));
    // 18:17:42.8671120 − 18:17:03.9799600.
    let last = requests.last().unwrap();
    assert!((last.arrival - 38.887152).abs() < 1e-6, "{}", last.arrival);
    assert_eq!((last.prompt, last.output), (432, 10));
    assert!(requests.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    let prompts: u64 = requests.iter().map(|r| r.prompt).sum();
    let outputs: u64 = requests.iter().map(|r| r.output).sum();
    assert_eq!((prompts, outputs), (131_532, 1_441));
}

mod fuzz {
    use proptest::prelude::*;
    use tessel_interop::traces::parse_request_trace;

    proptest! {
        /// Any text is read or refused with a line number, never a panic.
        #[test]
        fn any_text_is_read_or_refused(text in ".{0,400}") {
            let _ = parse_request_trace(&text);
            let with_header = format!("TIMESTAMP,ContextTokens,GeneratedTokens\n{text}");
            if let Err(error) = parse_request_trace(&with_header) {
                prop_assert!(error.line >= 1);
            }
        }

        /// Rows written in the trace's format come back sorted, from 0, with their lengths.
        #[test]
        fn written_rows_read_back(rows in prop::collection::vec((0u32..86_400, 1u64..100_000, 1u64..5_000), 1..40)) {
            let mut text = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
            for (seconds, prompt, output) in &rows {
                text.push_str(&format!(
                    "2024-05-12 {:02}:{:02}:{:02}.5000000,{prompt},{output}\n",
                    seconds / 3600, seconds / 60 % 60, seconds % 60
                ));
            }
            let read = parse_request_trace(&text).unwrap();
            prop_assert_eq!(read.len(), rows.len());
            prop_assert_eq!(read[0].arrival, 0.0);
            prop_assert!(read.windows(2).all(|w| w[0].arrival <= w[1].arrival));
            let first = rows.iter().map(|r| r.0).min().unwrap();
            let last = rows.iter().map(|r| r.0).max().unwrap();
            prop_assert!((read.last().unwrap().arrival - f64::from(last - first)).abs() < 1e-6);
        }
    }
}
