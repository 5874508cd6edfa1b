//! The `search` block: the space the planner searches, key by key.

use crate::blocks::strategy::{to_offload, to_recompute, to_zero};
use crate::diagnostic::Problem;
use crate::eval::{format_number, Spanned, Value};
use crate::fields::{to_bool, to_count, Fields};
use crate::spec::{Choice, Objective, SearchSpace};
use crate::units::Dim;

pub const FIELDS: &[&str] = &[
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "etp",
    "dp_shard",
    "microbatch",
    "interleave",
    "recompute",
    "sequence_parallel",
    "zero",
    "offload",
    "objective",
    "memory_limit",
    "time_limit",
    "top",
];

const OBJECTIVES: &[(&str, Objective)] = &[("throughput", Objective::Throughput)];

/// Longest range a search key may expand to.
const MAX_RANGE: u64 = 4096;

type Convert<T> = fn(&str, &Spanned, &mut Vec<Problem>) -> Option<T>;

fn count_at_least_1(key: &str, v: &Spanned, p: &mut Vec<Problem>) -> Option<u64> {
    to_count(key, v, 1, p)
}

/// `auto`, one value, a list of values, or (for whole numbers) an inclusive range.
fn choice<T>(
    f: &mut Fields,
    key: &str,
    convert: Convert<T>,
    range: Option<fn(u64) -> Option<T>>,
) -> Option<Choice<T>> {
    let Some(v) = f.get(key).cloned() else {
        return Some(Choice::Auto);
    };
    let problems = &mut *f.problems;
    match &v.value {
        Value::Invalid => None,
        Value::Ident(name) if name == "auto" => Some(Choice::Auto),
        Value::List(elements) => {
            if elements.is_empty() {
                problems.push(
                    Problem::new(v.span, format!("`{key}` lists no values"))
                        .with_help("write `auto` to let the planner choose"),
                );
                return None;
            }
            let mut values = Vec::new();
            let mut ok = true;
            for e in elements {
                if matches!(&e.value, Value::Ident(n) if n == "auto") {
                    problems.push(
                        Problem::new(e.span, "`auto` cannot be one of a list's values")
                            .with_help(format!("write `{key} = auto` on its own")),
                    );
                    ok = false;
                    continue;
                }
                match convert(key, e, problems) {
                    Some(value) => values.push(value),
                    None => ok = false,
                }
            }
            ok.then_some(Choice::Values(values))
        }
        Value::Range { low, high } => {
            let Some(make) = range else {
                problems.push(Problem::new(
                    v.span,
                    format!("`{key}` takes a value or a list, not a range"),
                ));
                return None;
            };
            let ends: Vec<Option<u64>> = [low, high]
                .iter()
                .map(|&&n| {
                    let end = Spanned {
                        value: Value::number(n),
                        span: v.span,
                    };
                    to_count(key, &end, 0, problems)
                })
                .collect();
            let (Some(low), Some(high)) = (ends[0], ends[1]) else {
                return None;
            };
            if high - low >= MAX_RANGE {
                problems.push(Problem::new(
                    v.span,
                    format!(
                        "`{key}` ranges over {} values; at most {MAX_RANGE} are searched",
                        format_number((high - low + 1) as f64)
                    ),
                ));
                return None;
            }
            let mut values = Vec::new();
            for n in low..=high {
                match make(n) {
                    Some(value) => values.push(value),
                    None => {
                        problems.push(Problem::new(
                            v.span,
                            format!("`{key}` cannot be {n}, which this range includes"),
                        ));
                        return None;
                    }
                }
            }
            Some(Choice::Values(values))
        }
        _ => convert(key, &v, problems).map(|value| Choice::Values(vec![value])),
    }
}

pub fn lower(f: &mut Fields) -> Option<SearchSpace> {
    let before = f.problems.len();
    if let Some(at) = f.get("stages").map(|v| v.span) {
        f.problems.push(
            Problem::new(
                at,
                "`stages` cannot be searched; the planner places layers itself",
            )
            .with_help("fix the layers of each stage in a `strategy` block"),
        );
    }
    let known: Vec<&str> = FIELDS.iter().copied().chain(["stages"]).collect();
    f.reject_unknown(&known);
    let positive = |n: u64| (n >= 1).then_some(n);
    let dp = choice(f, "dp", count_at_least_1, Some(positive));
    let tp = choice(f, "tp", count_at_least_1, Some(positive));
    let pp = choice(f, "pp", count_at_least_1, Some(positive));
    let cp = choice(f, "cp", count_at_least_1, Some(positive));
    let ep = choice(f, "ep", count_at_least_1, Some(positive));
    let etp = choice(f, "etp", count_at_least_1, Some(positive));
    let dp_shard = choice(f, "dp_shard", count_at_least_1, Some(positive));
    let microbatch = choice(f, "microbatch", count_at_least_1, Some(positive));
    let interleave = choice(f, "interleave", count_at_least_1, Some(positive));
    let recompute = choice(f, "recompute", to_recompute, None);
    let sequence_parallel = choice(f, "sequence_parallel", to_bool, None);
    let zero = choice(f, "zero", to_zero, Some(|n| (n <= 3).then_some(n as u8)));
    let offload = choice(f, "offload", to_offload, None);
    let objective = f
        .choice("objective", OBJECTIVES)
        .unwrap_or(Objective::Throughput);
    let memory_limit = f.get("memory_limit").cloned().and_then(|v| {
        if v.value == Value::Invalid {
            return None;
        }
        let fraction = crate::fields::to_fraction("memory_limit", &v, f.problems)?;
        if fraction == 0.0 {
            f.problems
                .push(Problem::new(v.span, "`memory_limit` must be above 0"));
            return None;
        }
        Some(fraction)
    });
    let time_limit = f.quantity("time_limit", Dim::TIME, true);
    let top = f.count("top", 1);
    if f.problems.len() > before {
        return None;
    }
    Some(SearchSpace {
        dp: dp?,
        tp: tp?,
        pp: pp?,
        cp: cp?,
        ep: ep?,
        etp: etp?,
        dp_shard: dp_shard?,
        microbatch: microbatch?,
        interleave: interleave?,
        recompute: recompute?,
        sequence_parallel: sequence_parallel?,
        zero: zero?,
        offload: offload?,
        objective,
        memory_limit: memory_limit.unwrap_or(0.95),
        time_limit,
        top,
    })
}
