mod common;

use common::synthetic_model::SyntheticModel;
use common::*;
use tessel_planner::{plan, PlanOptions};

#[test]
fn plans_gpt3_on_1024_gpus() {
    let spec = spec(gpt3_175b(), h100_cluster(128, 8, 80.0), 2048, 1536);
    let model = SyntheticModel::new(spec.clone());
    let outcome = plan(&spec, &model, &PlanOptions::default()).expect("a plan");
    println!("{}", tessel_planner::render_table(&outcome.plan));
    println!("{}", tessel_planner::render_explain(&outcome.plan));
    println!("{:?} {:?}", outcome.plan.search, outcome.timings);
}
