//! Serving plans through the binary: `plan` writes one, `plan --check` finds it current and
//! then stale, `diff` compares two, `export` writes vLLM's and SGLang's launch commands, and a
//! trace workload plans from its file.

mod common;

use common::{stdout, tessel};

fn path(dir: &tempfile::TempDir, name: &str) -> String {
    dir.path().join(name).display().to_string()
}

#[test]
fn a_serving_plan_checks_diffs_and_exports() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = path(&dir, "serve.json");
    stdout(&tessel(&[
        "plan",
        "specs/serve-llama3-70b.tsl",
        "-o",
        &plan,
        "--top",
        "1",
    ]));
    let text = std::fs::read_to_string(&plan).unwrap();
    assert!(text.contains("\"format\": \"tessel-plan/serve-1\""));
    let check = stdout(&tessel(&[
        "plan",
        "specs/serve-llama3-70b.tsl",
        "--check",
        &plan,
    ]));
    assert!(check.starts_with("current:"), "{check}");
    // Another spec's plan is stale by its digest.
    let stale = tessel(&["plan", "specs/serve-llama3-8b.tsl", "--check", &plan]);
    assert_eq!(stale.status.code(), Some(3));

    let same = stdout(&tessel(&[
        "diff",
        &plan,
        &plan,
        "--fail-on-regression",
        "1",
    ]));
    assert!(same.contains("deployment unchanged"), "{same}");
    let training = tessel(&[
        "diff",
        &plan,
        "tests/workflow/plans/llama3-70b-selective-recompute.json",
    ]);
    assert_eq!(training.status.code(), Some(1));

    for (target, launcher, count) in [
        ("vllm", "vllm serve", "--tensor-parallel-size"),
        ("sglang", "sglang.launch_server", "--tp-size"),
    ] {
        let out = tessel(&["export", &plan, "--to", target]);
        let script = stdout(&out);
        assert!(script.starts_with("#!/bin/bash"), "{script}");
        assert!(
            script.contains(launcher) && script.contains(count),
            "{script}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("set MODEL"), "{stderr}");
    }
    let wrong = tessel(&["export", &plan, "--to", "megatron"]);
    assert_eq!(wrong.status.code(), Some(1));
}

#[test]
fn a_trace_workload_plans_from_its_file() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("interop/tests/data/serving/azure_llm_code_head.csv");
    std::fs::copy(trace, dir.path().join("requests.csv")).unwrap();
    let spec = path(&dir, "trace.tsl");
    let specs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/llama3-8b.tsl");
    std::fs::write(
        &spec,
        format!(
            "use \"{}\"\nserve {{\n  model = llama3_8b; cluster = dgx_h100\n  \
             workload = {{ trace = \"requests.csv\", rate = 2/s }}\n  \
             slo = {{ ttft = 1 s, tpot = 50 ms }}\n}}\n",
            specs.display()
        ),
    )
    .unwrap();
    let shown = stdout(&tessel(&["plan", &spec, "--format", "json"]));
    let plan: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(plan["workload"]["trace"], "requests.csv");
    assert_eq!(plan["workload"]["requests"], 60);
    assert_eq!(plan["workload"]["rate"], 2);

    // A damaged trace names its line.
    std::fs::write(
        dir.path().join("requests.csv"),
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,12,x\n",
    )
    .unwrap();
    let bad = tessel(&["plan", &spec]);
    assert_eq!(bad.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("requests.csv:2:"), "{stderr}");
}

#[test]
fn served_plans_generate_the_tokens_of_a_single_rank() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let specs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("specs");
    // The 70B job again, disaggregated (the spec's choice is colocated, by 1.7 % of goodput).
    let disaggregated = path(&dir, "disaggregated.tsl");
    let text = std::fs::read_to_string(specs.join("serve-llama3-70b.tsl"))
        .unwrap()
        .replace(
            "use \"llama3-70b.tsl\"",
            &format!("use \"{}\"", specs.join("llama3-70b.tsl").display()),
        )
        .replace(
            "precision = bf16",
            "precision = bf16; deployment = disaggregated",
        );
    std::fs::write(&disaggregated, text).unwrap();
    let cases = [
        ("specs/serve-llama3-8b.tsl".to_string(), "colocated tp1 pp1"),
        (
            "specs/serve-mixtral-8x7b.tsl".to_string(),
            "colocated tp2 pp1",
        ),
        (
            "specs/serve-llama3-70b.tsl".to_string(),
            "colocated tp4 pp1",
        ),
        (
            disaggregated,
            "disaggregated: prefill tp1 pp2 → decode tp4 pp1",
        ),
    ];
    for (i, (spec, deployment)) in cases.iter().enumerate() {
        let plan = path(&dir, &format!("plan{i}.json"));
        stdout(&tessel(&["plan", spec, "-o", &plan]));
        let report = stdout(&tessel(&[
            "launch",
            &plan,
            "--backend",
            "cpu",
            "--steps",
            "8",
            "--format",
            "json",
        ]));
        let report: serde_json::Value = serde_json::from_str(&report).unwrap();
        assert_eq!(report["deployment"], *deployment, "{spec}");
        assert_eq!(report["matches_single_rank"], true, "{spec}");
        let tokens = report["tokens"].as_array().unwrap();
        assert_eq!(tokens.len(), 4);
        assert!(tokens.iter().all(|t| t.as_array().unwrap().len() == 8));
        if deployment.starts_with("disaggregated") {
            assert!(report["kv_bytes_handed_over"].as_u64().unwrap() > 0);
        }
    }
}
