//! Exact output of the table, Markdown and explanation of a fixed plan.

mod common;

use common::synthetic_model::SyntheticModel;
use common::*;
use tessel_grammar::{Recompute, Strategy};
use tessel_planner::{plan_fixed, render_explain, render_markdown, render_table};

fn fixed_plan() -> tessel_planner::Plan {
    let spec = spec(
        dense_model(
            "small",
            10,
            2048,
            16,
            16,
            8192,
            32000,
            tessel_grammar::MlpKind::Gelu,
        ),
        h100_cluster(1, 8, 80.0),
        2048,
        16,
    );
    let model = SyntheticModel::new(spec.clone());
    let strategy = Strategy {
        name: "snapshot".to_string(),
        dp: 2,
        tp: 2,
        pp: 2,
        microbatch: 2,
        recompute: Recompute::Selective,
        sequence_parallel: true,
        zero: 1,
        stages: Some(vec![6, 4]),
        ..Strategy::default()
    };
    plan_fixed(&spec, &model, &strategy).expect("a plan")
}

const TABLE: &str = r#"plan for small on h100_8 (8 GPUs, 8 per node)
  degrees      dp 2 · tp 2 · pp 2 · cp 1 · ep 1 · interleave 1
  batching     micro-batch 2 × 4 per step, ZeRO 1, sequence parallel on
  stages       recompute selective, offload none
  step time    0.067 s   tokens/s 488877   MFU 24.2%   HFU 24.4%
  memory       peak 4.6 of 76.0 GiB per GPU
  solver       fixed strategy (objective 0.067 s)

  stage  layers  model layers              weights      grads      optim      activ    buffers      total
      0       6  0–5                          0.34       0.34       1.03       1.35       1.50       4.57
      1       4  6–9                          0.25       0.25       0.75       0.45       1.74       3.44
  memory in GiB per GPU; capacity 76.00 GiB
"#;

const MARKDOWN: &str = r#"### Plan: small on h100_8 (8 GPUs)

| | |
|---|---|
| degrees | dp 2 · tp 2 · pp 2 · cp 1 · ep 1 · interleave 1 |
| batching | micro-batch 2 × 4 per step, ZeRO 1, sequence parallel on |
| stages | recompute selective, offload none |
| step time | 0.067 s |
| tokens/s | 488877 |
| MFU / HFU | 24.2% / 24.4% |
| peak memory | 4.6 of 76.0 GiB |
| solver | fixed strategy |
| spec digest | `DIGEST` |

| stage | layers | model layers | weights | gradients | optimizer | activations | buffers | total (GiB) |
|---:|---:|---|---:|---:|---:|---:|---:|---:|
| 0 | 6 | 0–5 | 0.34 | 0.34 | 1.03 | 1.35 | 1.50 | 4.57 |
| 1 | 4 | 6–9 | 0.25 | 0.25 | 0.75 | 0.45 | 1.74 | 3.44 |
"#;

const EXPLAIN: &str = r#"compute binds: every stage has memory to spare (the fullest, stage 0, uses 4.6 of 76.0 GiB, 6%).
  the strategy uses recompute selective, offload none anyway (1.3 ms recompute, 0.0 ms offload per step).
step time 0.067 s on the critical path:
  compute                                49.2 ms   73.4%
  recompute                               1.3 ms    1.9%
  tensor-parallel communication           2.8 ms    4.2%
  pipeline communication                  1.3 ms    2.0%
  data-parallel communication             0.1 ms    0.2%
  pipeline bubble                        11.7 ms   17.4%
  optimizer step                          0.7 ms    1.0%
layers per stage: [6, 4]
solver: fixed strategy (objective 0.067 s).
"#;

#[test]
fn renders_match_their_snapshots() {
    let plan = fixed_plan();
    assert_eq!(render_table(&plan), TABLE);
    // The digest follows the Spec type's JSON; it has its own test.
    assert_eq!(
        render_markdown(&plan).replace(&plan.spec_digest, "DIGEST"),
        MARKDOWN
    );
    assert_eq!(render_explain(&plan), EXPLAIN);
}
