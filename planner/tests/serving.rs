//! The serving model: its cost model and simulator against published measurements, the
//! simulator against the cost model on cases worked by hand, and the deployment search
//! against DistServe's finding (disaggregation pays for long prompts under a tight first-token
//! target, not for short prompts under loose targets).

use tessel_grammar::{load_job_str, Job, Request, ServingSpec};
use tessel_planner::serving::deployment::{cost_model, simulate, Deployment, Phase};
use tessel_planner::serving::engine::{
    simulate_instance, Arrival, BatchLimits, Role, Timing, BLOCK_TOKENS,
};
use tessel_planner::serving::plan::plan_serving;
use tessel_planner::serving::validation::{default_measurements_path, read_measurements, score};
use tessel_symbolic::serving::{InstanceShape, IterationBatch};

const MODEL_AND_NODE: &str = r#"
model llama3_8b {
  layers = 32; hidden = 4096; heads = 32; kv_heads = 8; ffn_hidden = 14336; vocab = 128256
  mlp = swiglu; norm = rmsnorm; tie_embeddings = false; max_seq_len = 8192
}
cluster node { gpu = H100_SXM; nodes = 1; gpus_per_node = 8
               intra_node = { bandwidth = 450 GB/s, latency = 3 us } }
cluster two_nodes extends node { nodes = 2; inter_node = { bandwidth = 400 Gb/s } }
"#;

fn serving(serve: &str) -> ServingSpec {
    serving_on("node", serve)
}

fn serving_on(cluster: &str, serve: &str) -> ServingSpec {
    let text =
        format!("{MODEL_AND_NODE}\nserve {{ model = llama3_8b; cluster = {cluster}\n{serve}\n}}");
    match load_job_str("serve.tsl", &text).unwrap_or_else(|d| panic!("{d}")) {
        Job::Serve(spec) => *spec,
        Job::Train(_) => panic!("a serving spec"),
    }
}

fn chat() -> ServingSpec {
    serving(
        "workload = { rate = 8/s, prompt = { mean = 1000 }, output = { mean = 200 } }\n\
         slo = { ttft = 1 s, tpot = 50 ms }",
    )
}

const LIMITS: BatchLimits = BatchLimits {
    max_sequences: 256,
    max_batched_tokens: 8192,
};

#[test]
fn published_measurements_are_reproduced() {
    let rows = read_measurements(&default_measurements_path()).unwrap();
    assert_eq!(rows.len(), 87);
    let scored = score(&rows);
    // Every FP16/BF16 row of a known model and GPU: all but the three FP8 ones.
    assert_eq!(scored.len(), 84);
    let within: Vec<_> = scored.iter().filter(|s| s.error.abs() <= 0.15).collect();
    let mut errors: Vec<f64> = scored.iter().map(|s| s.error.abs()).collect();
    errors.sort_by(f64::total_cmp);
    let median = errors[errors.len() / 2];
    assert!(within.len() >= 60, "{} rows within 15 %", within.len());
    assert!(median <= 0.10, "median error {median}");
    // Within 15 % for each kind of measurement: static prefill, static decode, whole static
    // batches, offline runs and online runs replayed request by request by the simulator.
    for kind in [
        "prefill_latency",
        "decode_step_latency",
        "end_to_end_latency",
        "throughput_output_tokens",
        "throughput_output_tokens_online",
        "itl_mean",
        "tpot_mean",
    ] {
        assert!(
            within.iter().filter(|s| s.row.kind == kind).count() >= 3,
            "{kind}"
        );
    }
    let offline = within
        .iter()
        .filter(|s| s.row.requests.is_some() && s.row.batch.is_none())
        .count();
    assert!(offline >= 10, "{offline} offline runs within 15 %");
}

#[test]
fn one_request_takes_one_prefill_then_one_decode_per_token() {
    let spec = chat();
    let cost = cost_model(&spec, InstanceShape { tp: 1, pp: 1 });
    let arrivals = [Arrival {
        id: 0,
        at: 0.5,
        prompt: 1000,
        output: 5,
    }];
    let mut timings = vec![Timing::default()];
    simulate_instance(&cost, Role::Both, LIMITS, 1 << 20, &arrivals, &mut timings).unwrap();
    let prefill = cost.iteration_time(&IterationBatch::prefill(1000));
    assert!((timings[0].first_token - (0.5 + prefill)).abs() < 1e-12);
    // Each later token reads the cache of the prompt and the tokens before it.
    let decodes: f64 = (0..4)
        .map(|k| cost.iteration_time(&IterationBatch::decode(1, 1000 + k)))
        .sum();
    assert!((timings[0].finished - timings[0].first_token - decodes).abs() < 1e-12);
}

#[test]
fn chunked_prefill_splits_a_long_prompt_at_the_token_budget() {
    let spec = chat();
    let cost = cost_model(&spec, InstanceShape { tp: 1, pp: 1 });
    let limits = BatchLimits {
        max_sequences: 256,
        max_batched_tokens: 2048,
    };
    let arrivals = [Arrival {
        id: 0,
        at: 0.0,
        prompt: 5000,
        output: 1,
    }];
    let mut timings = vec![Timing::default()];
    simulate_instance(&cost, Role::Both, limits, 1 << 20, &arrivals, &mut timings).unwrap();
    let chunk = |tokens: u64, cached: u64| {
        let mut batch = IterationBatch::default();
        batch.add_chunk(tokens, cached, cached + tokens == 5000);
        cost.iteration_time(&batch)
    };
    let expected = chunk(2048, 0) + chunk(2048, 2048) + chunk(904, 4096);
    assert!((timings[0].first_token - expected).abs() < 1e-12);
}

#[test]
fn a_small_cache_preempts_and_still_finishes_every_request() {
    let spec = chat();
    let cost = cost_model(&spec, InstanceShape { tp: 1, pp: 1 });
    let arrivals: Vec<Arrival> = (0..20)
        .map(|id| Arrival {
            id,
            at: 0.0,
            prompt: 300,
            output: 300,
        })
        .collect();
    let mut small = vec![Timing::default(); 20];
    // Room for four requests' whole lives: the running batch outgrows it.
    let capacity = 4 * 600 + BLOCK_TOKENS;
    simulate_instance(&cost, Role::Both, LIMITS, capacity, &arrivals, &mut small).unwrap();
    let mut large = vec![Timing::default(); 20];
    simulate_instance(&cost, Role::Both, LIMITS, 1 << 20, &arrivals, &mut large).unwrap();
    for (s, l) in small.iter().zip(&large) {
        assert!(s.finished >= s.first_token && s.first_token > 0.0);
        assert!(l.finished > 0.0);
    }
    let makespan = |t: &[Timing]| t.iter().map(|t| t.finished).fold(0.0, f64::max);
    assert!(makespan(&small) > 1.5 * makespan(&large));
    // A request longer than the whole cache is refused.
    let long = [Arrival {
        id: 0,
        at: 0.0,
        prompt: capacity,
        output: 10,
    }];
    assert!(simulate_instance(&cost, Role::Both, LIMITS, capacity, &long, &mut small).is_none());
}

#[test]
fn attainment_falls_as_the_rate_rises() {
    let spec = chat();
    let phase = Phase {
        shape: InstanceShape { tp: 1, pp: 1 },
        limits: LIMITS,
        instances: 1,
    };
    let source = tessel_planner::serving::search::RequestSource {
        spec: &spec,
        trace: None,
    };
    let attained: Vec<f64> = [2.0, 8.0, 24.0, 64.0]
        .iter()
        .map(|&rate| {
            let requests = source.requests(rate, 600);
            simulate(&spec, &Deployment::Colocated(phase), &requests)
                .unwrap()
                .attainment(&spec.serve.slo)
                .0
        })
        .collect();
    assert!(attained.windows(2).all(|w| w[0] >= w[1]), "{attained:?}");
    assert!(attained[0] > 0.99 && attained[3] < 0.5, "{attained:?}");
}

#[test]
fn plans_are_deterministic() {
    let spec = chat();
    let first = plan_serving(&spec, None, Some(2)).unwrap().to_json();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let single = pool.install(|| plan_serving(&spec, None, Some(2)).unwrap().to_json());
    assert_eq!(first, single);
    assert!(first.contains("\"format\": \"tessel-plan/serve-1\""));
}

/// Goodput per GPU of the best colocated and the best disaggregated deployment on two nodes.
fn colocated_and_disaggregated(workload: &str) -> (f64, f64) {
    let best = |deployment: &str| {
        let spec = serving_on(
            "two_nodes",
            &format!("deployment = {deployment}\n{workload}"),
        );
        plan_serving(&spec, None, Some(0)).unwrap().chosen
    };
    let colocated = best("colocated");
    let disaggregated = best("disaggregated");
    assert_eq!(colocated.kind, "colocated");
    assert_eq!(disaggregated.kind, "disaggregated");
    (colocated.goodput_per_gpu, disaggregated.goodput_per_gpu)
}

#[test]
fn disaggregation_pays_for_long_prompts_under_a_tight_first_token() {
    // Long prompts, tight TTFT and TPOT: a colocated instance's prefills stall its decodes,
    // so it needs more GPUs per request than prefill and decode instances apart.
    let (colocated, disaggregated) = colocated_and_disaggregated(
        "workload = { rate = 20/s, prompt = { mean = 4000, max = 7000, shape = uniform }, \
                      output = { mean = 200, max = 1000 } }\n\
         slo = { ttft = 300 ms, tpot = 12 ms }",
    );
    assert!(
        disaggregated > 1.15 * colocated,
        "{disaggregated} vs {colocated}"
    );
    // Short prompts, loose targets: a prefill instance of its own sits mostly idle.
    let (colocated, disaggregated) = colocated_and_disaggregated(
        "workload = { rate = 8/s, prompt = { mean = 200, max = 1000 }, \
                      output = { mean = 400, max = 2000 } }\n\
         slo = { ttft = 2 s, tpot = 100 ms }",
    );
    assert!(
        colocated > 1.2 * disaggregated,
        "{colocated} vs {disaggregated}"
    );
}

#[test]
fn a_trace_workload_replays_its_requests_at_the_rate() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../interop/tests/data/serving/azure_llm_code_head.csv");
    let text = std::fs::read_to_string(dir).unwrap();
    let trace: Vec<Request> = text
        .lines()
        .skip(1)
        .enumerate()
        .map(|(i, line)| {
            let f: Vec<&str> = line.split(',').collect();
            Request {
                arrival: i as f64,
                prompt: f[1].parse().unwrap(),
                output: f[2].parse().unwrap(),
            }
        })
        .collect();
    let spec = chat();
    let source = tessel_planner::serving::search::RequestSource {
        spec: &spec,
        trace: Some(&trace),
    };
    let replayed = source.requests(4.0, 1000);
    assert_eq!(replayed.len(), 60);
    // 59 gaps of 1 s rescaled to 4 per second.
    assert!((replayed[59].arrival - 59.0 / 4.0).abs() < 1e-9);
    assert_eq!(replayed[0].prompt, 4808);
    let plan = plan_serving(&spec, Some(&trace), Some(0)).unwrap();
    assert_eq!(plan.workload.requests, 60);
}

#[test]
fn prompts_that_outgrow_the_cache_together_are_preempted_not_stuck() {
    let spec = chat();
    let cost = cost_model(&spec, InstanceShape { tp: 1, pp: 1 });
    // Each prompt fits alone; chunked side by side they would need 1,200 of 1,008 tokens.
    let arrivals: Vec<Arrival> = (0..2)
        .map(|id| Arrival {
            id,
            at: 0.0,
            prompt: 600,
            output: 4,
        })
        .collect();
    let limits = BatchLimits {
        max_sequences: 8,
        max_batched_tokens: 256,
    };
    let mut timings = vec![Timing::default(); 2];
    simulate_instance(&cost, Role::Both, limits, 1008, &arrivals, &mut timings).unwrap();
    assert!(timings
        .iter()
        .all(|t| t.finished > t.first_token && t.first_token > 0.0));
    // The first admitted finishes first: the second gave its blocks back and started over.
    assert!(timings[0].finished < timings[1].first_token);
}
