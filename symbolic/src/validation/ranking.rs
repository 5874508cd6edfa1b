//! How well the model ranks configurations of the same job: within each group of runs that
//! train the same model on the same GPUs with the same sequence length and batch, the rank
//! correlation between predicted and measured throughput, and whether the predicted best is
//! the measured best.

use std::collections::BTreeMap;

use super::cases::{Case, Source, Throughput};
use super::evaluate::Outcome;

/// Ranking quality of one source.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankingStats {
    /// Groups with at least three configurations.
    pub groups: usize,
    /// Mean Spearman rank correlation over the groups.
    pub mean_spearman: f64,
    /// Groups whose predicted fastest configuration is the measured fastest.
    pub top1_hits: usize,
}

/// Ranking statistics per source.
pub fn ranking_per_source(cases: &[Case], outcomes: &[Outcome]) -> BTreeMap<Source, RankingStats> {
    // Group key: source, model, GPUs, GPU type, sequence length, global batch, precision.
    let mut groups: BTreeMap<(Source, String), Vec<(f64, f64)>> = BTreeMap::new();
    for (case, outcome) in cases.iter().zip(outcomes) {
        let Some((measured, predicted)) = outcome.throughput else {
            continue;
        };
        // Higher is better for both: tokens/s, or the inverse of the step time.
        let (measured, predicted) = match measured {
            Throughput::StepTime(step) => (1.0 / step, 1.0 / predicted),
            Throughput::TokensPerGpu(tokens) => (tokens, predicted),
        };
        let key = format!(
            "{}|{}|{}|{}|{}|{:?}",
            case.model,
            case.spec.cluster.total_gpus(),
            case.spec.cluster.gpu.name,
            case.spec.train.seq_len,
            case.spec.train.global_batch,
            case.spec.train.precision
        );
        groups
            .entry((case.source, key))
            .or_default()
            .push((measured, predicted));
    }
    let mut per_source: BTreeMap<Source, (usize, f64, usize)> = BTreeMap::new();
    for ((source, _), points) in groups {
        if points.len() < 3 {
            continue;
        }
        let measured: Vec<f64> = points.iter().map(|p| p.0).collect();
        let predicted: Vec<f64> = points.iter().map(|p| p.1).collect();
        let rho = spearman(&measured, &predicted);
        let hit = argmax(&measured) == argmax(&predicted);
        let entry = per_source.entry(source).or_default();
        entry.0 += 1;
        entry.1 += rho;
        entry.2 += usize::from(hit);
    }
    per_source
        .into_iter()
        .map(|(source, (groups, sum, hits))| {
            (
                source,
                RankingStats {
                    groups,
                    mean_spearman: sum / groups as f64,
                    top1_hits: hits,
                },
            )
        })
        .collect()
}

fn argmax(values: &[f64]) -> usize {
    let mut best = 0;
    for (index, value) in values.iter().enumerate() {
        if *value > values[best] {
            best = index;
        }
    }
    best
}

/// Ranks from 1, ties sharing their average rank.
fn ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut ranks = vec![0.0; values.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start;
        while end + 1 < order.len() && values[order[end + 1]] == values[order[start]] {
            end += 1;
        }
        let average = (start + end) as f64 / 2.0 + 1.0;
        for &index in &order[start..=end] {
            ranks[index] = average;
        }
        start = end + 1;
    }
    ranks
}

/// Spearman's rank correlation (Pearson correlation of the ranks); 0 when either side is
/// constant.
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    if n == 0.0 {
        return 0.0;
    }
    let mean_a = ra.iter().sum::<f64>() / n;
    let mean_b = rb.iter().sum::<f64>() / n;
    let mut cov = 0.0;
    let mut var_a = 0.0;
    let mut var_b = 0.0;
    for (x, y) in ra.iter().zip(&rb) {
        cov += (x - mean_a) * (y - mean_b);
        var_a += (x - mean_a) * (x - mean_a);
        var_b += (y - mean_b) * (y - mean_b);
    }
    if var_a == 0.0 || var_b == 0.0 {
        0.0
    } else {
        cov / (var_a * var_b).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::spearman;

    #[test]
    fn spearman_of_known_orders() {
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]), 1.0);
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]), -1.0);
        // Ties share their average rank: ranks (1.5, 1.5, 3) against (1, 2, 3).
        let rho = spearman(&[1.0, 1.0, 2.0], &[1.0, 2.0, 3.0]);
        assert!((rho - 0.866_025_403_784_438_6).abs() < 1e-12, "{rho}");
        assert_eq!(spearman(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]), 0.0);
    }
}
