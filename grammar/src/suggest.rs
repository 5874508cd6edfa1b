//! "Did you mean ...?" by edit distance.

/// Levenshtein distance between two strings, by characters.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
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
    let limit = (word.chars().count() / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    for candidate in candidates {
        if candidate == word {
            continue;
        }
        let distance = edit_distance(&normalized, &normalize(candidate));
        if distance <= limit && best.is_none_or(|(d, _)| distance < d) {
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
        // The first of equally close candidates wins.
        assert_eq!(closest("ab", ["ac", "ad"]).as_deref(), Some("ac"));
    }
}
