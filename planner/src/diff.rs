//! What changed between two plan files, and whether the change is a regression: the
//! configuration (degrees, micro-batching, ZeRO, recompute, offload, stage boundaries, rank
//! mapping), the embedded spec field by field, and the predicted step time, throughput, MFU and
//! per-stage memory. [`diff_plans`] compares; [`render_diff_text`], [`render_diff_markdown`] and
//! [`PlanDiff::to_json`] format the result.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::canonical_json::to_canonical_string;
use crate::plan::Plan;
use crate::space::{offload_label, per_stage_label, recompute_label};

/// The format tag of `tessel diff --format json` output.
pub const DIFF_FORMAT: &str = "tessel-diff/1";

/// Relative throughput changes smaller than this (in percent) read as "unchanged".
const UNCHANGED_PCT: f64 = 0.05;

/// One field that differs, with both values as a reviewer reads them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FieldChange {
    pub field: String,
    pub old: String,
    pub new: String,
}

/// One predicted quantity before and after.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricChange {
    /// `step_time_s`, `tokens_per_s`, `mfu`, `peak_memory_gib`, and the ends of the step
    /// time's interval, `step_time_s_low` and `step_time_s_high`, when both plans have one.
    pub metric: String,
    pub old: f64,
    pub new: f64,
    pub change: f64,
    /// Relative change in percent; absent when the old value is zero.
    pub change_pct: Option<f64>,
    pub higher_is_better: bool,
}

impl MetricChange {
    fn new(metric: &str, old: f64, new: f64, higher_is_better: bool) -> MetricChange {
        MetricChange {
            metric: metric.to_string(),
            old,
            new,
            change: new - old,
            change_pct: (old != 0.0).then(|| (new - old) / old.abs() * 100.0),
            higher_is_better,
        }
    }

    /// Whether the new value is worse, better, or the same.
    fn direction(&self) -> Direction {
        if self.change == 0.0 {
            Direction::Same
        } else if (self.change > 0.0) == self.higher_is_better {
            Direction::Better
        } else {
            Direction::Worse
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Better,
    Worse,
    Same,
}

/// One pipeline stage's memory per GPU in each plan (absent where the plan has no such stage).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageMemory {
    pub stage: u64,
    pub old_gib: Option<f64>,
    pub new_gib: Option<f64>,
    pub old_fits: Option<bool>,
    pub new_fits: Option<bool>,
}

/// How many ranks changed their place in the parallel mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RankMapChange {
    pub old_ranks: u64,
    pub new_ranks: u64,
    /// Ranks present in both plans whose coordinates differ.
    pub moved: u64,
}

impl RankMapChange {
    pub fn is_unchanged(&self) -> bool {
        self.old_ranks == self.new_ranks && self.moved == 0
    }

    /// `unchanged`, `12 of 64 ranks moved`, or `64 → 128 ranks`.
    pub fn summary(&self) -> String {
        if self.old_ranks != self.new_ranks {
            format!("{} → {} ranks", self.old_ranks, self.new_ranks)
        } else if self.moved == 0 {
            "unchanged".to_string()
        } else {
            format!("{} of {} ranks moved", self.moved, self.new_ranks)
        }
    }
}

/// The difference between two plans.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanDiff {
    /// `tessel-diff/1`: the schema of this JSON.
    pub format: String,
    /// What the old and new plans are called (their file names).
    pub old_label: String,
    pub new_label: String,
    pub old_spec_digest: String,
    pub new_spec_digest: String,
    pub spec_changed: bool,
    /// Fields of the embedded specs that differ, by dotted path (`train.global_batch`).
    pub spec_changes: Vec<FieldChange>,
    /// Degrees, micro-batching, ZeRO, recompute, offload and stage boundaries that differ.
    pub config_changes: Vec<FieldChange>,
    pub rank_map: RankMapChange,
    pub metrics: Vec<MetricChange>,
    pub old_capacity_gib: f64,
    pub new_capacity_gib: f64,
    pub stages: Vec<StageMemory>,
    /// Stages that fitted (or were new in a plan that fitted) and no longer fit.
    pub no_longer_fit: Vec<u64>,
    /// Stages that did not fit and now do.
    pub now_fit: Vec<u64>,
    /// The largest throughput loss, in percent, that is not a failure; absent: none is.
    pub fail_on_regression_pct: Option<f64>,
    /// The one-line summary.
    pub verdict: String,
    /// Why the change fails the check, one sentence each; empty when it passes.
    pub failures: Vec<String>,
}

impl PlanDiff {
    /// Whether the plans differ in nothing a reviewer would look at.
    pub fn is_unchanged(&self) -> bool {
        !self.spec_changed
            && self.spec_changes.is_empty()
            && self.config_changes.is_empty()
            && self.rank_map.is_unchanged()
            && self.metrics.iter().all(|m| m.change == 0.0)
            && self.stages.iter().all(|s| s.old_gib == s.new_gib)
    }

    /// The canonical JSON of the diff (sorted keys, six significant digits).
    pub fn to_json(&self) -> String {
        match serde_json::to_value(self) {
            Ok(value) => to_canonical_string(&value),
            Err(error) => format!("{{\"error\": {:?}}}\n", error.to_string()),
        }
    }

    fn metric(&self, name: &str) -> Option<&MetricChange> {
        self.metrics.iter().find(|m| m.metric == name)
    }
}

/// Compares `old` with `new`. With `fail_on_regression_pct`, a throughput loss larger than it
/// is a failure; a stage that fitted and no longer fits always is.
pub fn diff_plans(
    old: (&str, &Plan),
    new: (&str, &Plan),
    fail_on_regression_pct: Option<f64>,
) -> PlanDiff {
    let (old_label, old) = old;
    let (new_label, new) = new;
    let stages = stage_memory(old, new);
    let no_longer_fit: Vec<u64> = stages
        .iter()
        .filter(|s| s.new_fits == Some(false) && s.old_fits.unwrap_or(old.prediction.fits))
        .map(|s| s.stage)
        .collect();
    let now_fit: Vec<u64> = stages
        .iter()
        .filter(|s| s.old_fits == Some(false) && s.new_fits == Some(true))
        .map(|s| s.stage)
        .collect();
    let mut diff = PlanDiff {
        format: DIFF_FORMAT.to_string(),
        old_label: old_label.to_string(),
        new_label: new_label.to_string(),
        old_spec_digest: old.spec_digest.clone(),
        new_spec_digest: new.spec_digest.clone(),
        spec_changed: old.spec_digest != new.spec_digest,
        spec_changes: spec_changes(old, new),
        config_changes: config_changes(old, new),
        rank_map: rank_map_change(old, new),
        metrics: vec![
            MetricChange::new(
                "step_time_s",
                old.prediction.step_time_s,
                new.prediction.step_time_s,
                false,
            ),
            MetricChange::new(
                "tokens_per_s",
                old.prediction.tokens_per_s,
                new.prediction.tokens_per_s,
                true,
            ),
            MetricChange::new("mfu", old.prediction.mfu, new.prediction.mfu, true),
            MetricChange::new(
                "peak_memory_gib",
                old.prediction.peak_memory_gib,
                new.prediction.peak_memory_gib,
                false,
            ),
        ],
        old_capacity_gib: old.prediction.memory_capacity_gib,
        new_capacity_gib: new.prediction.memory_capacity_gib,
        stages,
        no_longer_fit,
        now_fit,
        fail_on_regression_pct,
        verdict: String::new(),
        failures: Vec::new(),
    };
    diff.metrics.extend(interval_changes(old, new));
    diff.failures = failures(&diff);
    diff.verdict = verdict(&diff);
    diff
}

/// The ends of the step time's interval, when both plans have one.
fn interval_changes(old: &Plan, new: &Plan) -> Vec<MetricChange> {
    let ends = |p: &Plan| p.prediction.interval.as_ref().map(|i| i.step_time_s);
    match (ends(old), ends(new)) {
        (Some([old_low, old_high]), Some([new_low, new_high])) => vec![
            MetricChange::new("step_time_s_low", old_low, new_low, false),
            MetricChange::new("step_time_s_high", old_high, new_high, false),
        ],
        _ => Vec::new(),
    }
}

fn stage_memory(old: &Plan, new: &Plan) -> Vec<StageMemory> {
    let count = old.prediction.stages.len().max(new.prediction.stages.len());
    (0..count)
        .map(|i| {
            let old_gib = old.prediction.stages.get(i).map(|s| s.memory.total());
            let new_gib = new.prediction.stages.get(i).map(|s| s.memory.total());
            StageMemory {
                stage: i as u64,
                old_gib,
                new_gib,
                old_fits: old_gib.map(|g| g <= old.prediction.memory_capacity_gib),
                new_fits: new_gib.map(|g| g <= new.prediction.memory_capacity_gib),
            }
        })
        .collect()
}

fn change(field: &str, old: String, new: String) -> Option<FieldChange> {
    (old != new).then(|| FieldChange {
        field: field.to_string(),
        old,
        new,
    })
}

/// One label when every stage agrees, else the per-stage list.
fn layers_per_stage(plan: &Plan) -> String {
    let layers: Vec<String> = plan.stages.iter().map(|s| s.layers.to_string()).collect();
    layers.join("/")
}

fn layer_ranges(plan: &Plan) -> String {
    let stages: Vec<String> = plan
        .stages
        .iter()
        .map(|s| {
            let ranges: Vec<String> = s
                .layer_ranges
                .iter()
                .map(crate::render::layer_range_label)
                .collect();
            ranges.join(",")
        })
        .collect();
    stages.join(" | ")
}

fn config_changes(old: &Plan, new: &Plan) -> Vec<FieldChange> {
    let (a, b) = (&old.config, &new.config);
    let numbers = [
        ("dp", a.dp, b.dp),
        ("tp", a.tp, b.tp),
        ("pp", a.pp, b.pp),
        ("cp", a.cp, b.cp),
        ("ep", a.ep, b.ep),
        ("interleave", a.interleave, b.interleave),
        ("microbatch", a.microbatch, b.microbatch),
        ("microbatches", a.microbatches, b.microbatches),
        ("zero", u64::from(a.zero), u64::from(b.zero)),
    ];
    let mut changes: Vec<FieldChange> = numbers
        .iter()
        .filter_map(|(field, x, y)| change(field, x.to_string(), y.to_string()))
        .collect();
    let on_off = |on: bool| if on { "on" } else { "off" }.to_string();
    changes.extend(change(
        "sequence_parallel",
        on_off(a.sequence_parallel),
        on_off(b.sequence_parallel),
    ));
    let recompute = |p: &Plan| {
        per_stage_label(
            &p.stages
                .iter()
                .map(|s| recompute_label(s.recompute))
                .collect::<Vec<_>>(),
        )
    };
    changes.extend(change("recompute", recompute(old), recompute(new)));
    let offload = |p: &Plan| {
        per_stage_label(
            &p.stages
                .iter()
                .map(|s| offload_label(&s.offload))
                .collect::<Vec<_>>(),
        )
    };
    changes.extend(change("offload", offload(old), offload(new)));
    changes.extend(change(
        "objective",
        old.objective.name().to_string(),
        new.objective.name().to_string(),
    ));
    let interval = |p: &Plan| match &p.prediction.interval {
        Some(_) => "present",
        None => "absent",
    };
    changes.extend(change(
        "step_time_interval",
        interval(old).to_string(),
        interval(new).to_string(),
    ));
    let layers = change(
        "layers_per_stage",
        layers_per_stage(old),
        layers_per_stage(new),
    );
    let same_counts = layers.is_none();
    changes.extend(layers);
    // Equal counts with different ranges: interleaved chunks were redistributed.
    if same_counts {
        changes.extend(change("layer_ranges", layer_ranges(old), layer_ranges(new)));
    }
    changes
}

fn rank_map_change(old: &Plan, new: &Plan) -> RankMapChange {
    let moved = old
        .rank_map
        .ranks
        .iter()
        .zip(&new.rank_map.ranks)
        .filter(|(a, b)| a != b)
        .count();
    RankMapChange {
        old_ranks: old.rank_map.ranks.len() as u64,
        new_ranks: new.rank_map.ranks.len() as u64,
        moved: moved as u64,
    }
}

/// Leaves of a JSON value by dotted path. Arrays of named objects are keyed by name
/// (`strategies[tp2].zero`) so that reordering or adding one does not shift the others; arrays
/// of plain values are one leaf.
fn flatten(value: &Value, path: String, out: &mut BTreeMap<String, String>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                flatten(item, child, out);
            }
        }
        Value::Array(items) if items.iter().any(|i| i.is_object() || i.is_array()) => {
            for (index, item) in items.iter().enumerate() {
                let key = item
                    .get("name")
                    .and_then(Value::as_str)
                    .map_or(index.to_string(), str::to_string);
                flatten(item, format!("{path}[{key}]"), out);
            }
        }
        _ => {
            out.insert(path, leaf_text(value));
        }
    }
}

fn leaf_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "unset".to_string(),
        other => to_canonical_string(other).trim_end().to_string(),
    }
}

fn spec_changes(old: &Plan, new: &Plan) -> Vec<FieldChange> {
    let leaves = |plan: &Plan| {
        let mut out = BTreeMap::new();
        if let Ok(value) = serde_json::to_value(&plan.spec) {
            flatten(&value, String::new(), &mut out);
        }
        out
    };
    let (a, b) = (leaves(old), leaves(new));
    let mut paths: Vec<&String> = a.keys().chain(b.keys()).collect();
    paths.sort();
    paths.dedup();
    let mut changes: Vec<FieldChange> = Vec::new();
    for path in paths {
        // A block added or removed as a whole (a strategy) is one change, not one per field.
        let (field, old_value, new_value) = match (a.get(path), b.get(path)) {
            (Some(x), Some(y)) if x == y => continue,
            (Some(x), Some(y)) => (path.clone(), x.clone(), y.clone()),
            (None, _) => (
                absent_root(path, &a),
                "absent".to_string(),
                "added".to_string(),
            ),
            (_, None) => (
                absent_root(path, &b),
                "present".to_string(),
                "removed".to_string(),
            ),
        };
        if changes.last().is_some_and(|c| c.field == field) {
            continue;
        }
        changes.push(FieldChange {
            field,
            old: old_value,
            new: new_value,
        });
    }
    changes
}

/// The shortest ancestor of `path` (cut at `.` or `[`) of which `leaves` holds nothing.
fn absent_root(path: &str, leaves: &BTreeMap<String, String>) -> String {
    let cuts = path
        .char_indices()
        .filter(|(_, c)| *c == '.' || *c == '[')
        .map(|(i, _)| i)
        .chain([path.len()]);
    for cut in cuts {
        let prefix = &path[..cut];
        let held = leaves.keys().any(|key| {
            key.strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        });
        if !held && !prefix.is_empty() {
            return prefix.to_string();
        }
    }
    path.to_string()
}

/// `stage 3` or `stages 0, 1 and 3`.
fn stage_list(stages: &[u64]) -> String {
    let names: Vec<String> = stages.iter().map(u64::to_string).collect();
    match names.split_last() {
        Some((last, [])) => format!("stage {last}"),
        Some((last, rest)) => format!("stages {} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

fn failures(diff: &PlanDiff) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(allowed), Some(pct)) = (
        diff.fail_on_regression_pct,
        diff.metric("tokens_per_s").and_then(|m| m.change_pct),
    ) {
        if -pct > allowed {
            out.push(format!(
                "throughput fell {}%, more than the allowed {}%",
                fixed(-pct, 1),
                short(allowed)
            ));
        }
    }
    for stage in diff
        .stages
        .iter()
        .filter(|s| diff.no_longer_fit.contains(&s.stage))
    {
        out.push(format!(
            "stage {} no longer fits: {} GiB per GPU of {} GiB",
            stage.stage,
            fixed(stage.new_gib.unwrap_or(0.0), 2),
            fixed(diff.new_capacity_gib, 2)
        ));
    }
    out
}

fn verdict(diff: &PlanDiff) -> String {
    if diff.is_unchanged() {
        return "no change".to_string();
    }
    let mut parts = Vec::new();
    match diff.metric("tokens_per_s").and_then(|m| m.change_pct) {
        Some(pct) if pct.abs() >= UNCHANGED_PCT => {
            let kind = if pct < 0.0 {
                "regression"
            } else {
                "improvement"
            };
            parts.push(format!("throughput {} ({kind})", signed_pct(pct)));
        }
        _ => parts.push("throughput unchanged".to_string()),
    }
    match diff.no_longer_fit.len() {
        0 => {}
        1 => parts.push(format!(
            "{} no longer fits",
            stage_list(&diff.no_longer_fit)
        )),
        _ => parts.push(format!("{} no longer fit", stage_list(&diff.no_longer_fit))),
    }
    match diff.now_fit.len() {
        0 => {}
        1 => parts.push(format!("{} fits now", stage_list(&diff.now_fit))),
        _ => parts.push(format!("{} fit now", stage_list(&diff.now_fit))),
    }
    match diff.spec_changes.len() {
        0 if diff.spec_changed => parts.push("spec digest changed".to_string()),
        0 => {}
        1 => parts.push("spec changed (1 field)".to_string()),
        n => parts.push(format!("spec changed ({n} fields)")),
    }
    parts.join(", ")
}

/// `x` with `decimals` decimals, `-0` printed as `0`.
fn fixed(x: f64, decimals: usize) -> String {
    let text = format!("{x:.decimals$}");
    if text
        .trim_start_matches('-')
        .chars()
        .all(|c| c == '0' || c == '.')
    {
        text.trim_start_matches('-').to_string()
    } else {
        text
    }
}

/// At most two decimals, no trailing zeros.
fn short(x: f64) -> String {
    let text = fixed(x, 2);
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A change with its sign: `+1.5`, `−0.25` (a true minus sign), `0`.
fn signed(text: String) -> String {
    if let Some(magnitude) = text.strip_prefix('-') {
        format!("−{magnitude}")
    } else if text.chars().all(|c| c == '0' || c == '.') {
        text
    } else {
        format!("+{text}")
    }
}

fn signed_pct(pct: f64) -> String {
    format!("{}%", signed(fixed(pct, 1)))
}

/// `615,755` for whole numbers of tokens.
fn grouped(x: f64) -> String {
    let negative = x < 0.0;
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if negative && out.chars().any(|c| c != '0' && c != ',') {
        format!("-{out}")
    } else {
        out
    }
}

/// A metric's name and its values and change, as text.
struct MetricText {
    name: &'static str,
    old: String,
    new: String,
    change: String,
}

fn metric_text(m: &MetricChange) -> MetricText {
    let pct = m.change_pct.map(signed_pct);
    let with_pct = |absolute: String| match &pct {
        Some(p) => format!("{absolute}, {p}"),
        None => absolute,
    };
    let (name, old, new, absolute) = match m.metric.as_str() {
        "step_time_s" => (
            "step time",
            format!("{} s", fixed(m.old, 3)),
            format!("{} s", fixed(m.new, 3)),
            format!("{} s", signed(fixed(m.change, 3))),
        ),
        "step_time_s_low" | "step_time_s_high" => (
            if m.metric.ends_with("low") {
                "step time, interval low"
            } else {
                "step time, interval high"
            },
            format!("{} s", fixed(m.old, 3)),
            format!("{} s", fixed(m.new, 3)),
            format!("{} s", signed(fixed(m.change, 3))),
        ),
        "tokens_per_s" => (
            "tokens/s",
            grouped(m.old),
            grouped(m.new),
            signed(grouped(m.change)),
        ),
        "mfu" => (
            "MFU",
            format!("{}%", fixed(m.old * 100.0, 1)),
            format!("{}%", fixed(m.new * 100.0, 1)),
            format!("{} pt", signed(fixed(m.change * 100.0, 1))),
        ),
        _ => (
            "peak memory",
            format!("{} GiB", fixed(m.old, 2)),
            format!("{} GiB", fixed(m.new, 2)),
            format!("{} GiB", signed(fixed(m.change, 2))),
        ),
    };
    let change = if m.change == 0.0 {
        "unchanged".to_string()
    } else {
        with_pct(absolute)
    };
    MetricText {
        name,
        old,
        new,
        change,
    }
}

fn gib(value: Option<f64>) -> String {
    value.map_or("—".to_string(), |g| fixed(g, 2))
}

fn fits(value: Option<bool>) -> &'static str {
    match value {
        Some(true) => "fits",
        Some(false) => "does NOT fit",
        None => "—",
    }
}

/// The first 12 characters of a digest (by character: a hand-edited file may hold any text).
fn digest_short(digest: &str) -> String {
    digest.chars().take(12).collect()
}

/// The diff as plain text: the verdict first, then what changed.
pub fn render_diff_text(diff: &PlanDiff) -> String {
    let mut out = format!("{}\n", diff.verdict);
    out.push_str(&format!("  {} → {}\n", diff.old_label, diff.new_label));
    if diff.is_unchanged() {
        for line in &diff.failures {
            out.push_str(&format!("FAIL: {line}\n"));
        }
        return out;
    }
    out.push_str("\nconfiguration\n");
    if diff.config_changes.is_empty() {
        out.push_str("  unchanged\n");
    }
    let width = diff
        .config_changes
        .iter()
        .chain(&diff.spec_changes)
        .map(|c| c.field.chars().count())
        .max()
        .unwrap_or(0)
        .max("rank mapping".len());
    for c in &diff.config_changes {
        out.push_str(&format!("  {:width$}  {} → {}\n", c.field, c.old, c.new));
    }
    out.push_str(&format!(
        "  {:width$}  {}\n",
        "rank mapping",
        diff.rank_map.summary()
    ));
    out.push_str("\nspec\n");
    if diff.spec_changed {
        out.push_str(&format!(
            "  digest {} → {}\n",
            digest_short(&diff.old_spec_digest),
            digest_short(&diff.new_spec_digest)
        ));
        for c in &diff.spec_changes {
            out.push_str(&format!("  {:width$}  {} → {}\n", c.field, c.old, c.new));
        }
    } else {
        out.push_str(&format!(
            "  unchanged (digest {})\n",
            digest_short(&diff.new_spec_digest)
        ));
    }
    out.push_str("\nprediction\n");
    let rows: Vec<MetricText> = diff.metrics.iter().map(metric_text).collect();
    let name_width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let old_width = rows
        .iter()
        .map(|r| r.old.chars().count())
        .max()
        .unwrap_or(0);
    let new_width = rows
        .iter()
        .map(|r| r.new.chars().count())
        .max()
        .unwrap_or(0);
    for r in &rows {
        out.push_str(&format!(
            "  {:name_width$}  {:>old_width$} → {:>new_width$}  ({})\n",
            r.name, r.old, r.new, r.change
        ));
    }
    out.push_str(&format!(
        "\nmemory per stage (GiB per GPU; capacity {} → {})\n",
        fixed(diff.old_capacity_gib, 2),
        fixed(diff.new_capacity_gib, 2)
    ));
    for s in &diff.stages {
        let delta = match (s.old_gib, s.new_gib) {
            (Some(a), Some(b)) => format!("{:>7}", signed(fixed(b - a, 2))),
            _ => format!("{:>7}", ""),
        };
        let mut line = format!(
            "  stage {:>2}  {:>7} → {:>7}  {delta}  {}",
            s.stage,
            gib(s.old_gib),
            gib(s.new_gib),
            fits(s.new_fits)
        );
        if diff.no_longer_fit.contains(&s.stage) {
            line.push_str(" (fitted before)");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if !diff.failures.is_empty() {
        out.push('\n');
        for line in &diff.failures {
            out.push_str(&format!("FAIL: {line}\n"));
        }
    }
    out
}

fn arrow(m: &MetricChange) -> &'static str {
    match (m.direction(), m.change > 0.0) {
        (Direction::Same, _) => "=",
        (Direction::Better, true) => "▲ better",
        (Direction::Better, false) => "▼ better",
        (Direction::Worse, true) => "▲ worse",
        (Direction::Worse, false) => "▼ worse",
    }
}

/// Escapes the characters that end a table cell or start markup.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The diff as a pull-request comment: a heading, the verdict, a table of changed fields, a
/// table of metrics with arrows, and per-stage memory in a details block.
pub fn render_diff_markdown(diff: &PlanDiff) -> String {
    let mut out = format!(
        "### Tessel plan diff: `{}` → `{}`\n\n",
        diff.old_label, diff.new_label
    );
    let mark = if diff.failures.is_empty() { "" } else { ":x: " };
    out.push_str(&format!("**{mark}{}**\n\n", diff.verdict));
    for line in &diff.failures {
        out.push_str(&format!("- **FAIL:** {line}\n"));
    }
    if !diff.failures.is_empty() {
        out.push('\n');
    }
    if diff.is_unchanged() {
        out.push_str(&format!(
            "Same configuration, same spec (digest `{}`), same prediction.\n",
            digest_short(&diff.new_spec_digest)
        ));
        return out;
    }
    out.push_str("| changed | old | new |\n|---|---|---|\n");
    for c in &diff.config_changes {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            cell(&c.field),
            cell(&c.old),
            cell(&c.new)
        ));
    }
    out.push_str(&format!(
        "| rank mapping | {} ranks | {} |\n",
        diff.rank_map.old_ranks,
        diff.rank_map.summary()
    ));
    if diff.spec_changed {
        out.push_str(&format!(
            "| spec digest | `{}` | `{}` |\n",
            digest_short(&diff.old_spec_digest),
            digest_short(&diff.new_spec_digest)
        ));
        for c in &diff.spec_changes {
            out.push_str(&format!(
                "| spec: `{}` | {} | {} |\n",
                cell(&c.field),
                cell(&c.old),
                cell(&c.new)
            ));
        }
    } else {
        out.push_str(&format!(
            "| spec | `{}` | unchanged |\n",
            digest_short(&diff.new_spec_digest)
        ));
    }
    out.push_str("\n| metric | old | new | change | |\n|---|---:|---:|---:|---|\n");
    for m in &diff.metrics {
        let t = metric_text(m);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            t.name,
            t.old,
            t.new,
            t.change,
            arrow(m)
        ));
    }
    out.push_str(&format!(
        "\n<details><summary>Memory per stage (GiB per GPU; capacity {} → {})</summary>\n\n",
        fixed(diff.old_capacity_gib, 2),
        fixed(diff.new_capacity_gib, 2)
    ));
    out.push_str("| stage | old | new | change | fits |\n|---:|---:|---:|---:|---|\n");
    for s in &diff.stages {
        let delta = match (s.old_gib, s.new_gib) {
            (Some(a), Some(b)) => signed(fixed(b - a, 2)),
            _ => "—".to_string(),
        };
        let status = if diff.no_longer_fit.contains(&s.stage) {
            "**no longer fits**"
        } else {
            fits(s.new_fits)
        };
        out.push_str(&format!(
            "| {} | {} | {} | {delta} | {status} |\n",
            s.stage,
            gib(s.old_gib),
            gib(s.new_gib)
        ));
    }
    out.push_str("\n</details>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_have_signs_and_no_negative_zero() {
        assert_eq!(signed(fixed(-0.0001, 2)), "0.00");
        assert_eq!(signed(fixed(1.25, 1)), "+1.2");
        assert_eq!(signed(fixed(-7.94, 1)), "−7.9");
        assert_eq!(grouped(615_755.4), "615,755");
        assert_eq!(signed(grouped(-79_405.0)), "−79,405");
        assert_eq!(short(5.0), "5");
        assert_eq!(short(2.5), "2.5");
    }

    #[test]
    fn stage_lists_read_as_english() {
        assert_eq!(stage_list(&[3]), "stage 3");
        assert_eq!(stage_list(&[0, 1]), "stages 0 and 1");
        assert_eq!(stage_list(&[0, 1, 3]), "stages 0, 1 and 3");
    }

    #[test]
    fn named_arrays_flatten_by_name() {
        let value = serde_json::json!({
            "train": {"global_batch": 512, "seq_len": null},
            "search": {"tp": {"values": [1, 2]}},
            "strategies": [{"name": "tp2", "zero": 1}, {"zero": 2}]
        });
        let mut out = BTreeMap::new();
        flatten(&value, String::new(), &mut out);
        let leaves: Vec<(&str, &str)> = out.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            leaves,
            vec![
                ("search.tp.values", "[1, 2]"),
                ("strategies[1].zero", "2"),
                ("strategies[tp2].name", "tp2"),
                ("strategies[tp2].zero", "1"),
                ("train.global_batch", "512"),
                ("train.seq_len", "unset"),
            ]
        );
    }

    #[test]
    fn an_added_block_is_one_change_named_by_its_root() {
        let mut leaves = BTreeMap::new();
        leaves.insert("strategies[tp2].zero".to_string(), "1".to_string());
        leaves.insert("train.global_batch".to_string(), "512".to_string());
        assert_eq!(
            absent_root("strategies[uneven].offload.weights", &leaves),
            "strategies[uneven]"
        );
        assert_eq!(absent_root("train.seq_len", &leaves), "train.seq_len");
        assert_eq!(absent_root("search.tp.values", &leaves), "search");
    }
}
