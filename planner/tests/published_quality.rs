//! For published configurations in `shared/data/`, the plan found for the same model, GPUs and
//! batch is at least as good as the published configuration by the pessimistic end of each
//! prediction's interval (what `tessel plan` ranks by), whenever the published configuration is
//! one the default search space holds. A spread sample of the
//! rows runs here; `cargo run --release -p tessel-planner --example published_vs_planned`
//! covers every row and writes docs/PUBLISHED-VS-PLANNED.md.

use tessel_planner::{compare_with_published, describe_strategy};
use tessel_symbolic::validation::{default_data_path, load_cases};

#[test]
fn plans_are_no_slower_than_published_configurations() {
    let path = default_data_path();
    if !path.exists() {
        println!("skipped: {} is absent", path.display());
        return;
    }
    let (cases, _) = load_cases(&path).expect("the published runs load");
    let sample: Vec<_> = cases.iter().filter(|c| !c.oom).step_by(20).collect();
    assert!(sample.len() >= 10, "only {} sampled rows", sample.len());
    let mut compared = 0;
    for case in sample {
        let Some(row) =
            compare_with_published(case.source.label(), &case.spec, &case.strategy, None)
        else {
            continue;
        };
        compared += 1;
        assert!(
            row.planned_is_no_slower() || !row.published_in_space,
            "line {}: planned {} ({:.4} s pessimistic) is slower than published {} ({:.4} s)",
            case.line,
            describe_strategy(&row.planned),
            row.planned_ranked_s,
            describe_strategy(&row.published),
            row.published_ranked_s
        );
    }
    assert!(compared >= 10, "only {compared} rows compared");
}
