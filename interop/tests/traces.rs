//! The trace parsers on real, cited samples (`tests/traces/*/README.md`).

use std::path::PathBuf;

use tessel_interop::traces::parse_nccl_tests;

fn sample(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/traces/nccl-tests")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_two_node_all_reduce_sweep_with_its_device_list() {
    let run = parse_nccl_tests(&sample("a3mega-all-reduce-2x8.txt")).unwrap();
    assert_eq!(run.collective, None, "this version prints no test name");
    assert_eq!(run.ranks(), Some(16));
    assert_eq!(run.ranks_per_host(), Some(8));
    assert_eq!(run.gpu(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(run.devices[9].host, "ztan-mig-gq73");
    // 8 B to 8 GiB by factors of two.
    assert_eq!(run.rows.len(), 31);
    assert_eq!(run.rows[0].bytes, 8);
    assert_eq!(run.rows[0].out_of_place_us, 135.8);
    let last = run.rows.last().unwrap();
    assert_eq!(last.bytes, 8_589_934_592);
    assert_eq!(last.out_of_place_us, 47535.0);
    assert_eq!(last.in_place_us, Some(47743.0));
    assert_eq!(run.gpus_per_thread, Some(1));
}

#[test]
fn one_process_driving_eight_gpus() {
    let run = parse_nccl_tests(&sample("oci-a100-all-reduce-1x8-g8.txt")).unwrap();
    assert_eq!(run.gpus_per_thread, Some(8));
    assert_eq!(run.ranks(), Some(8));
    assert_eq!(run.gpu(), Some("NVIDIA A100-SXM4-40GB"));
    assert_eq!(run.rows.len(), 1);
    assert_eq!(run.rows[0].bytes, 10_737_418_240);
    assert_eq!(run.rows[0].out_of_place_us, 79751.0);
}

#[test]
fn tagged_mpi_output_with_the_test_name() {
    let run = parse_nccl_tests(&sample("rtx5090-all-reduce-tagged-1x2.txt")).unwrap();
    assert_eq!(run.collective.as_deref(), Some("all_reduce"));
    assert_eq!(run.ranks(), Some(2));
    assert_eq!(run.ranks_per_host(), Some(2));
    assert_eq!(run.gpu(), Some("NVIDIA GeForce RTX 5090"));
    assert_eq!(run.rows.len(), 8);
    assert_eq!(run.rows[2].bytes, 4_194_304);
    assert_eq!(run.rows[2].out_of_place_us, 4375.00);
}

#[test]
fn tables_cut_from_their_header_and_zero_byte_rows() {
    let run = parse_nccl_tests(&sample("h800-all-reduce-1x8.txt")).unwrap();
    assert_eq!(run.ranks(), None);
    assert_eq!(run.gpus_per_thread, None);
    assert_eq!(run.rows.len(), 31);
    // all-to-all prints its smallest sizes as 0 bytes: nothing to fit.
    let run = parse_nccl_tests(&sample("h800-alltoall-4x8.txt")).unwrap();
    assert_eq!(run.rows.len(), 27);
    assert_eq!(run.rows[0].bytes, 128);
}

#[test]
fn other_formats_are_refused() {
    let readme = sample("README.md");
    let err = parse_nccl_tests(&readme).unwrap_err();
    assert!(err.message.starts_with("not nccl-tests output"), "{err}");
    let json =
        r#"{"traceEvents": [{"name": "ncclKernel_AllReduce_RING_LL_Sum_float", "ph": "X"}]}"#;
    assert!(parse_nccl_tests(json).is_err());
}

fn kineto_sample(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/traces/kineto")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_pytorch_profiler_trace_s_nccl_kernels() {
    let trace =
        tessel_interop::traces::parse_kineto_trace(&kineto_sample("hta-nccl-a100-2ranks.json"))
            .unwrap();
    assert_eq!(trace.gpu.as_deref(), Some("NVIDIA A100-PG509-200"));
    assert_eq!((trace.rank, trace.world_size), (Some(0), Some(2)));
    // 15 all-reduces and 6 broadcasts, of float and int64 buffers.
    assert_eq!(trace.collectives.len(), 21);
    let first = &trace.collectives[0];
    assert_eq!(first.name, "allreduce");
    assert_eq!(first.bytes, 6_637_568 * 4);
    assert_eq!(first.group_size, 2);
    assert_eq!(first.group_ranks, [0, 1]);
    assert_eq!(first.duration_us, 2636.669);
    assert_eq!(
        trace
            .collectives
            .iter()
            .filter(|c| c.name == "broadcast")
            .count(),
        6
    );
}

#[test]
fn a_profiler_trace_with_shapes_gives_its_bf16_gemms() {
    let trace = tessel_interop::traces::parse_kineto_trace(&kineto_sample(
        "tracelens-qwen1.5-0.5b-h100-gemms.json",
    ))
    .unwrap();
    assert_eq!(trace.gpu.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    // 169 matrix products with shapes: 96 bf16 `mm` and 72 bf16 `addmm`, and one fp32 `bmm`
    // (left out: the GEMM primitive is bf16/fp16, one matrix).
    assert_eq!(trace.gemms.len(), 168);
    assert!(trace.gemms.iter().all(|g| g.dtype == "bf16"));
    // `aten::addmm(bias, [8944, 1024], [1024, 1024])`, one 31.97 µs kernel.
    let first = &trace.gemms[0];
    assert_eq!((first.m, first.k, first.n), (8944, 1024, 1024));
    assert_eq!(first.duration_us, 31.967);
    assert!(trace.collectives.is_empty());
}
