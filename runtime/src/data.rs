//! Training data: synthetic tokens from a seed, or a binary token file (little-endian u16 or
//! u32, as nanoGPT and Megatron write them). Every plan sees the same global batch.

use crate::error::RuntimeError;
use crate::init::splitmix64;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenWidth {
    U16,
    U32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataSource {
    Synthetic,
    TokenFile { path: PathBuf, width: TokenWidth },
}

/// Hands out the sequences of each step: sequence `i` of step `s` is `seq_len + 1` tokens
/// (inputs and the next-token targets).
#[derive(Clone, Debug)]
pub struct TokenStream {
    tokens: Option<Vec<u32>>,
    seed: u64,
    vocab: u64,
    seq_len: usize,
    global_batch: usize,
}

impl TokenStream {
    pub fn new(
        source: &DataSource,
        seed: u64,
        vocab: u64,
        seq_len: usize,
        global_batch: usize,
    ) -> Result<Self, RuntimeError> {
        let tokens = match source {
            DataSource::Synthetic => None,
            DataSource::TokenFile { path, width } => {
                let tokens = read_token_file(path, *width)?;
                if tokens.len() < seq_len + 2 {
                    return Err(RuntimeError::Data {
                        reason: format!(
                            "{} holds {} tokens, fewer than one sequence of {}",
                            path.display(),
                            tokens.len(),
                            seq_len + 1
                        ),
                    });
                }
                if let Some((i, t)) = tokens
                    .iter()
                    .enumerate()
                    .find(|(_, &t)| u64::from(t) >= vocab)
                {
                    return Err(RuntimeError::Data {
                        reason: format!(
                            "{}: token {t} at position {i} is outside the vocabulary of {vocab}",
                            path.display()
                        ),
                    });
                }
                Some(tokens)
            }
        };
        Ok(TokenStream {
            tokens,
            seed,
            vocab,
            seq_len,
            global_batch,
        })
    }

    /// Sequence `index` (0-based within the global batch) of step `step`.
    pub fn sequence(&self, step: usize, index: usize) -> Vec<u32> {
        let n = self.seq_len + 1;
        let global = (step * self.global_batch + index) as u64;
        match &self.tokens {
            Some(tokens) => {
                // Consecutive windows through the file, wrapping around.
                let starts = (tokens.len() - n) as u64 + 1;
                let start = ((global * self.seq_len as u64) % starts) as usize;
                tokens[start..start + n].to_vec()
            }
            None => {
                // A fixed bigram rule with one token in eight random: learnable in a few steps.
                let mut out = Vec::with_capacity(n);
                let mut prev = 0u64;
                for p in 0..n as u64 {
                    let h =
                        splitmix64(self.seed ^ splitmix64(global.wrapping_mul(0x9E37) ^ (p << 32)));
                    let t = if p == 0 || h.is_multiple_of(8) {
                        (h >> 8) % self.vocab
                    } else {
                        (3 * prev + 1) % self.vocab
                    };
                    out.push(t as u32);
                    prev = t;
                }
                out
            }
        }
    }
}

pub fn read_token_file(path: &Path, width: TokenWidth) -> Result<Vec<u32>, RuntimeError> {
    let bytes = std::fs::read(path).map_err(|e| RuntimeError::Data {
        reason: format!("{}: {e}", path.display()),
    })?;
    let size = match width {
        TokenWidth::U16 => 2,
        TokenWidth::U32 => 4,
    };
    if bytes.len() % size != 0 {
        return Err(RuntimeError::Data {
            reason: format!(
                "{} has {} bytes, not a whole number of {size}-byte tokens",
                path.display(),
                bytes.len()
            ),
        });
    }
    Ok(bytes
        .chunks_exact(size)
        .map(|c| match width {
            TokenWidth::U16 => u32::from(u16::from_le_bytes([c[0], c[1]])),
            TokenWidth::U32 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_u16_and_u32_files() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for t in [1u16, 2, 300, 4] {
            f.write_all(&t.to_le_bytes()).unwrap();
        }
        assert_eq!(
            read_token_file(f.path(), TokenWidth::U16).unwrap(),
            vec![1, 2, 300, 4]
        );
        assert_eq!(
            read_token_file(f.path(), TokenWidth::U32).unwrap(),
            vec![(2 << 16) | 1, (4 << 16) | 300]
        );
    }

    #[test]
    fn token_windows_wrap_and_check_the_vocabulary() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for t in 0u16..10 {
            f.write_all(&t.to_le_bytes()).unwrap();
        }
        let src = DataSource::TokenFile {
            path: f.path().to_path_buf(),
            width: TokenWidth::U16,
        };
        let s = TokenStream::new(&src, 0, 16, 3, 2).unwrap();
        assert_eq!(s.sequence(0, 0), vec![0, 1, 2, 3]);
        assert_eq!(s.sequence(0, 1), vec![3, 4, 5, 6]);
        assert_eq!(s.sequence(1, 0), vec![6, 7, 8, 9]);
        assert_eq!(s.sequence(1, 1), vec![2, 3, 4, 5]);
        let err = TokenStream::new(&src, 0, 5, 3, 2).unwrap_err();
        assert!(err.to_string().contains("token 5 at position 5"), "{err}");
    }

    #[test]
    fn synthetic_tokens_depend_on_seed_only() {
        let a = TokenStream::new(&DataSource::Synthetic, 7, 50, 8, 4).unwrap();
        let b = TokenStream::new(&DataSource::Synthetic, 7, 50, 8, 4).unwrap();
        let c = TokenStream::new(&DataSource::Synthetic, 8, 50, 8, 4).unwrap();
        assert_eq!(a.sequence(2, 3), b.sequence(2, 3));
        assert_ne!(a.sequence(2, 3), c.sequence(2, 3));
        assert!(a.sequence(0, 0).iter().all(|&t| t < 50));
    }
}
