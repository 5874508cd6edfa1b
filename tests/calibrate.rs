//! `tessel calibrate` through the binary, on the cited nccl-tests samples of
//! `tests/traces/nccl-tests/`.

mod common;

use common::{stdout, tessel};

const SPEC: &str = "tests/specs/a3mega-h100-16.tsl";
const A3MEGA: &str = "tests/traces/nccl-tests/a3mega-all-reduce-2x8.txt";
const H800_TABLE: &str = "tests/traces/nccl-tests/h800-all-reduce-1x8.txt";

fn calibration(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["calibrate"];
    all.extend_from_slice(args);
    serde_json::from_str(&stdout(&tessel(&all))).expect("the calibration is JSON")
}

#[test]
fn a_two_node_sweep_fits_the_collectives_closer_than_the_published_fit() {
    let cal = calibration(&[A3MEGA, "--spec", SPEC]);
    assert_eq!(cal["format"], "tessel-calibration/1");
    assert_eq!(cal["cluster"], "a3mega_16");
    let input = &cal["inputs"][0];
    assert_eq!(input["collective"], "all_reduce");
    assert_eq!(input["ranks"], 16);
    assert_eq!(input["ranks_per_node"], 8);
    assert_eq!(input["rows"], 31);
    let before = cal["fit"]["median_error_before"].as_f64().unwrap();
    let after = cal["fit"]["median_error_after"].as_f64().unwrap();
    assert!(after < 0.6 * before, "{before} → {after}");
    assert!(after < 0.2, "{after}");
    // Same input, same bytes.
    assert_eq!(cal, calibration(&[A3MEGA, "--spec", SPEC]));
}

#[test]
fn explain_names_the_parameters_and_the_file_is_written() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("cluster.cal.json");
    let out = out.to_str().expect("utf-8 path");
    let text = stdout(&tessel(&[
        "calibrate",
        A3MEGA,
        "--spec",
        SPEC,
        "-o",
        out,
        "--explain",
    ]));
    assert!(
        text.contains("calibrated cluster a3mega_16 from 1 file (31 measurements)"),
        "{text}"
    );
    for name in ["call_latency_s", "inter_efficiency", "ll_intra_step_s"] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
    assert_eq!(written["fit"]["rows"], 31);
}

#[test]
fn a_table_without_its_device_list_needs_the_rank_count() {
    let output = tessel(&["calibrate", H800_TABLE, "--spec", SPEC]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("give --ranks N"), "{stderr}");
    // The collective comes from the file name.
    let cal = calibration(&[H800_TABLE, "--spec", SPEC, "--ranks", "8"]);
    assert_eq!(cal["inputs"][0]["collective"], "all_reduce");
    assert_eq!(cal["inputs"][0]["ranks_per_node"], 8);
}

#[test]
fn foreign_files_are_refused_with_a_reason() {
    let output = tessel(&[
        "calibrate",
        "tests/traces/nccl-tests/README.md",
        "--spec",
        SPEC,
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("README.md: line"), "{stderr}");
    assert!(stderr.contains("not nccl-tests output"), "{stderr}");
    let output = tessel(&["calibrate", "no/such/file.txt", "--spec", SPEC]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read it"));
}
