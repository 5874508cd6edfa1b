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
