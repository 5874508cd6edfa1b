//! "Did you mean ...?" by edit distance.

/// Edit distance between two strings, by characters: insertions, deletions, substitutions and
/// swaps of two neighbours (`bf61` is one edit from `bf16`).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // d[i][j]: distance between the first i characters of a and the first j of b.
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// Case and `-`/`_` differences are the cheapest typos: compare without them first.
fn normalize(s: &str) -> String {
    s.to_ascii_lowercase().replace('-', "_")
}

/// The candidate closest to `word`, if it is close enough to be what the user meant. Ties go to
/// the candidate listed first, so the answer does not depend on hashing.
pub fn closest<'a, I>(word: &str, candidates: I) -> Option<String>
where
    I: IntoIterator<Item = &'a str>,
{
    let normalized = normalize(word);
    let candidates: Vec<&str> = candidates.into_iter().collect();
    // `A100` means one of the `A100_...` GPUs more likely than `A800`.
    if normalized.len() >= 3 {
        if let Some(c) = candidates
            .iter()
            .find(|c| **c != word && normalize(c).starts_with(&normalized))
        {
            return Some(c.to_string());
        }
    }
    let limit = (word.chars().count() / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    for candidate in candidates {
        if candidate == word {
            continue;
        }
        let distance = edit_distance(&normalized, &normalize(candidate));
        // One edit turns any one-letter name into any other: not a suggestion.
        let plausible = distance <= limit && distance < word.chars().count();
        if plausible && best.is_none_or(|(d, _)| distance < d) {
            best = Some((distance, candidate));
        }
    }
    best.map(|(_, c)| c.to_string())
}

/// `Some("did you mean `x`?")` when there is a close candidate.
pub fn did_you_mean<'a, I>(word: &str, candidates: I) -> Option<String>
where
    I: IntoIterator<Item = &'a str>,
{
    closest(word, candidates).map(|c| format!("did you mean `{c}`?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("hiden", "hidden"), 1);
        assert_eq!(edit_distance("same", "same"), 0);
        assert_eq!(edit_distance("bf61", "bf16"), 1);
    }

    #[test]
    fn suggestions_ignore_case_and_dashes_and_stay_close() {
        assert_eq!(
            closest("H100-SXM", ["H100_PCIE", "H100_SXM"]).as_deref(),
            Some("H100_SXM")
        );
        assert_eq!(closest("gib", ["GB", "GiB"]).as_deref(), Some("GiB"));
        assert_eq!(
            closest("hiden", ["heads", "hidden"]).as_deref(),
            Some("hidden")
        );
        assert_eq!(closest("zzz", ["heads", "hidden"]), None);
        assert_eq!(
            closest("A100", ["A800", "A100_40GB", "A100_80GB"]).as_deref(),
            Some("A100_40GB")
        );
        // The first of equally close candidates wins.
        assert_eq!(closest("ab", ["ac", "ad"]).as_deref(), Some("ac"));
    }
}
