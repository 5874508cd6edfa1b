//! A plan made for a framework exports to it with no "not expressible" line: every example spec
//! (its strategy blocks dropped, each was written for one framework) planned under each framework
//! that `tessel export` writes for, then exported to that framework's target. The planner and the
//! exporters read one table (`tessel_grammar::Framework::capabilities`); this is where they are
//! held to it on real models.

use std::path::Path;

use tessel_grammar::{load_job, Framework, Job, Precision, SearchSpace};
use tessel_interop::export::{export, ExportTarget};
use tessel_planner::{plan, Objective, PlanError, PlanOptions};
use tessel_symbolic::cost::CostModel;

/// The target that launches each framework's plans.
fn target(framework: Framework) -> Option<ExportTarget> {
    match framework {
        Framework::Megatron | Framework::MegatronFsdp => Some(ExportTarget::Megatron),
        Framework::Deepspeed => Some(ExportTarget::Deepspeed),
        Framework::Fsdp => Some(ExportTarget::Torchtitan),
        Framework::Tessel => None,
    }
}

#[test]
fn every_example_spec_exports_its_plan_to_each_framework() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("specs/ reads")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "tsl"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 10, "{paths:?}");
    let mut exported = 0;
    let mut failures = Vec::new();
    for path in &paths {
        let mut spec = match load_job(path).unwrap_or_else(|d| panic!("{}: {d}", path.display())) {
            Job::Train(spec) => *spec,
            // Serving plans export to serving engines (tests/serving.rs).
            Job::Serve(_) => continue,
        };
        spec.strategies.clear();
        for framework in Framework::ALL {
            let Some(target) = target(framework) else {
                continue;
            };
            spec.train.framework = framework;
            let model = CostModel::new(&spec).expect("a cost model");
            let options = PlanOptions {
                objective: Objective::Pessimistic,
                ..PlanOptions::default()
            };
            let name = format!("{} under {}", path.display(), framework.name());
            // A search block written for one framework may hold nothing another runs (zero =
            // [0, 1] under torchtitan): then the whole space.
            let planned = match plan(&spec, &model, &options) {
                Err(PlanError::EmptySearchSpace { .. }) => {
                    let mut open = spec.clone();
                    open.search = SearchSpace {
                        memory_limit: spec.search.memory_limit,
                        ..SearchSpace::default()
                    };
                    plan(
                        &open,
                        &CostModel::new(&open).expect("a cost model"),
                        &options,
                    )
                }
                planned => planned,
            };
            match planned {
                Ok(outcome) => {
                    let strategy = outcome.plan.strategy();
                    let out = export(&outcome.plan.spec, &strategy, target);
                    // No framework here runs adapters, Tempo's kernels, compressed gradients or
                    // a modality encoder, and torchtitan trains in bf16, not fp16: a plan with
                    // them says so, and only that.
                    let adapters = spec.train.finetune.is_some_and(|f| f.is_adapter());
                    let tempo = outcome.plan.spec.train.memory_saving_kernels.is_on();
                    let fp16 =
                        framework == Framework::Fsdp && spec.train.precision == Precision::Fp16;
                    let compressed = outcome.plan.spec.train.grad_compression.is_some();
                    let encoders = spec.model.encoders.len();
                    let said = |what: &str| out.unsupported.iter().any(|u| u.starts_with(what));
                    let expected = [adapters, tempo, fp16, compressed]
                        .into_iter()
                        .filter(|x| *x)
                        .count()
                        + encoders;
                    if out.unsupported.len() != expected
                        || (encoders > 0 && !said("encoder `"))
                        || (compressed && !said("grad_compression = "))
                        || (adapters && !said("finetune = "))
                        || (tempo && !said("memory_saving_kernels = "))
                        || (fp16 && !said("precision fp16"))
                    {
                        failures.push(format!("{name} to {target}: {:?}", out.unsupported));
                    }
                    exported += 1;
                }
                // A framework may have no configuration for the job: none that fits, or none
                // that divides it (Megatron-FSDP, without pipelines, cannot split BLOOM's
                // 2,048-sequence batch over 384 GPUs).
                Err(PlanError::NothingFits { .. } | PlanError::EmptySearchSpace { .. }) => {}
                Err(other) => failures.push(format!("{name}: {other}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(exported >= 30, "only {exported} spec × framework plans");
}
