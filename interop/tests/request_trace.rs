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
