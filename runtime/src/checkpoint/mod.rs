//! Checkpoints that a run resumes under another plan: other tensor, pipeline, data or expert
//! degrees, another ZeRO stage, another rank count.
//!
//! A checkpoint is a folder: one `rank{r}.bin` per writing rank (little-endian f32, the pieces
//! one after another) and `manifest.json`, which describes every piece as PyTorch's distributed
//! checkpoint (DCP) describes a shard of a tensor: the state's name, the tensor's global shape,
//! the piece's offsets in it and its shape, and where its bytes are. Each rank writes the
//! rectangle of each parameter it holds under tensor parallelism, with the parameter and both
//! Adam moments (ZeRO's flat shards gathered back into that rectangle first); of the
//! data-parallel ranks holding the same rectangle only the first writes it. A rank of the new
//! plan reads each rectangle it needs from the pieces that overlap it, so any split of the same
//! model reads any other.

mod reshard;

pub use reshard::{reshard_sources, ReshardSource};

use crate::error::RuntimeError;
use crate::model::layout::ParamSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The `format` of `manifest.json`.
pub const CHECKPOINT_FORMAT: &str = "tessel-checkpoint/1";
const MANIFEST: &str = "manifest.json";
/// In a folder of snapshots, the file naming the newest complete one.
const LATEST: &str = "latest";

/// A rank made to fail as a step starts (`TESSEL_INJECT_FAILURE=RANK:STEP` for `tessel
/// launch`), to test recovery from the last snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InjectedFailure {
    pub rank: usize,
    /// 1-based, as the steps are printed.
    pub step: u64,
}

impl InjectedFailure {
    /// `RANK:STEP`.
    pub fn parse(text: &str) -> Result<InjectedFailure, String> {
        let bad = || format!("expected RANK:STEP (such as `1:5`), not `{text}`");
        let (rank, step) = text.split_once(':').ok_or_else(bad)?;
        Ok(InjectedFailure {
            rank: rank.trim().parse().map_err(|_| bad())?,
            step: step.trim().parse().map_err(|_| bad())?,
        })
    }
}

/// Which state of a parameter a piece holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    Param,
    /// Adam's first moment.
    AdamM,
    /// Adam's second moment.
    AdamV,
}

impl StateKind {
    pub const ALL: [StateKind; 3] = [StateKind::Param, StateKind::AdamM, StateKind::AdamV];

    fn name(self) -> &'static str {
        match self {
            StateKind::Param => "param",
            StateKind::AdamM => "adam_m",
            StateKind::AdamV => "adam_v",
        }
    }
}

/// One rectangle of one state of one parameter, and where its bytes are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardRecord {
    /// The parameter's global name (the same under every plan).
    pub name: String,
    /// The rank that wrote it.
    pub rank: u64,
    pub state: StateKind,
    /// Rows and columns of the whole tensor.
    pub global_shape: [u64; 2],
    /// First row and column of the piece.
    pub offsets: [u64; 2],
    /// Rows and columns of the piece.
    pub shape: [u64; 2],
    /// The file in the checkpoint's folder.
    pub file: String,
    pub byte_offset: u64,
}

/// `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    /// Optimizer steps taken: training resumes at the next one (its data and Adam's bias
    /// correction).
    pub step: u64,
    /// The model's name, for the message when another model resumes from it.
    pub model: String,
    pub shards: Vec<ShardRecord>,
}

/// A piece one rank writes.
pub struct StatePiece {
    pub param: ParamSpec,
    pub state: StateKind,
    /// Row-major, the parameter's local rectangle.
    pub data: Vec<f32>,
}

fn io_error(path: &Path, error: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Checkpoint {
        reason: format!("{}: {error}", path.display()),
    }
}

/// Creates `dir` (and what leads to it) for checkpoints.
pub fn create_folder(dir: &Path) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))
}

/// The folder of snapshot `step` in `dir`, created.
pub fn snapshot_folder(dir: &Path, step: u64) -> Result<PathBuf, RuntimeError> {
    let folder = dir.join(format!("step{step}"));
    create_folder(&folder)?;
    Ok(folder)
}

/// Writes one rank's pieces to `rank{rank}.bin` in `dir` and returns their records (no file
/// when it writes none).
pub fn write_rank(
    dir: &Path,
    rank: usize,
    pieces: &[StatePiece],
) -> Result<Vec<ShardRecord>, RuntimeError> {
    if pieces.is_empty() {
        return Ok(Vec::new());
    }
    let file = format!("rank{rank}.bin");
    let mut bytes = Vec::new();
    let mut records = Vec::with_capacity(pieces.len());
    for piece in pieces {
        let p = &piece.param;
        let ((r0, r1), (c0, c1)) = (p.row_range(), p.col_range());
        records.push(ShardRecord {
            name: p.name.clone(),
            rank: rank as u64,
            state: piece.state,
            global_shape: [p.rows, p.cols],
            offsets: [r0, c0],
            shape: [r1 - r0, c1 - c0],
            file: file.clone(),
            byte_offset: bytes.len() as u64,
        });
        bytes.extend(piece.data.iter().flat_map(|x| x.to_le_bytes()));
    }
    let path = dir.join(&file);
    std::fs::write(&path, bytes).map_err(|e| io_error(&path, e))?;
    Ok(records)
}

/// Writes one rank's records beside its pieces, for [`commit`].
pub fn write_records(dir: &Path, rank: usize, records: &[ShardRecord]) -> Result<(), RuntimeError> {
    let path = dir.join(format!("rank{rank}.json"));
    let text = serde_json::to_string(records).map_err(|e| io_error(&path, e))?;
    std::fs::write(&path, text).map_err(|e| io_error(&path, e))
}

/// Commits snapshot `step` of `dir` once all `ranks` wrote theirs: its manifest from their
/// records, then `latest` naming it (replaced in one rename, so a failure leaves the previous
/// snapshot named), then the older snapshots removed.
pub fn commit(dir: &Path, step: u64, model: &str, ranks: usize) -> Result<(), RuntimeError> {
    let name = format!("step{step}");
    let folder = dir.join(&name);
    let mut shards = Vec::new();
    for rank in 0..ranks {
        let path = folder.join(format!("rank{rank}.json"));
        let text = std::fs::read_to_string(&path).map_err(|e| io_error(&path, e))?;
        let records: Vec<ShardRecord> =
            serde_json::from_str(&text).map_err(|e| io_error(&path, e))?;
        shards.extend(records);
        std::fs::remove_file(&path).map_err(|e| io_error(&path, e))?;
    }
    write_manifest(&folder, step, model, shards)?;
    let (latest, written) = (dir.join(LATEST), dir.join(format!("{LATEST}.tmp")));
    std::fs::write(&written, format!("{name}\n")).map_err(|e| io_error(&written, e))?;
    std::fs::rename(&written, &latest).map_err(|e| io_error(&latest, e))?;
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(dir, e))?;
    for entry in entries.flatten() {
        let older = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_prefix("step"))
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|s| s < step);
        if older {
            std::fs::remove_dir_all(entry.path()).map_err(|e| io_error(&entry.path(), e))?;
        }
    }
    Ok(())
}

/// Writes `manifest.json`, its pieces in a fixed order whatever order the ranks finished in.
pub fn write_manifest(
    dir: &Path,
    step: u64,
    model: &str,
    mut shards: Vec<ShardRecord>,
) -> Result<(), RuntimeError> {
    shards.sort_by(|a, b| {
        (&a.name, a.state, a.offsets, a.rank).cmp(&(&b.name, b.state, b.offsets, b.rank))
    });
    let manifest = Manifest {
        format: CHECKPOINT_FORMAT.to_string(),
        step,
        model: model.to_string(),
        shards,
    };
    let path = dir.join(MANIFEST);
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| io_error(&path, e))?;
    std::fs::write(&path, text + "\n").map_err(|e| io_error(&path, e))
}

/// A checkpoint read back: its manifest and the values of its files.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub manifest: Manifest,
    files: BTreeMap<String, Vec<f32>>,
    /// Each (name, state)'s pieces, as indices into the manifest's shards.
    index: BTreeMap<(String, StateKind), Vec<usize>>,
}

impl Checkpoint {
    /// Reads the newest snapshot `latest` names in `dir` (or `dir`'s own `manifest.json`)
    /// and the files it names; an error names what is missing or wrong.
    pub fn read(dir: &Path) -> Result<Checkpoint, RuntimeError> {
        let latest = dir.join(LATEST);
        if latest.exists() {
            let name = std::fs::read_to_string(&latest).map_err(|e| io_error(&latest, e))?;
            return Checkpoint::read_snapshot(&dir.join(name.trim()));
        }
        Checkpoint::read_snapshot(dir)
    }

    fn read_snapshot(dir: &Path) -> Result<Checkpoint, RuntimeError> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|e| io_error(&path, e))?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| io_error(&path, format!("not a manifest: {e}")))?;
        if manifest.format != CHECKPOINT_FORMAT {
            return Err(io_error(
                &path,
                format!(
                    "format `{}`, this runtime reads `{CHECKPOINT_FORMAT}`",
                    manifest.format
                ),
            ));
        }
        let mut files = BTreeMap::new();
        let mut index: BTreeMap<(String, StateKind), Vec<usize>> = BTreeMap::new();
        for (i, shard) in manifest.shards.iter().enumerate() {
            if !files.contains_key(&shard.file) {
                let file = dir.join(&shard.file);
                let bytes = std::fs::read(&file).map_err(|e| io_error(&file, e))?;
                let values = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect::<Vec<f32>>();
                files.insert(shard.file.clone(), values);
            }
            let len = shard.shape[0] * shard.shape[1];
            let fits = shard.byte_offset % 4 == 0
                && shard.byte_offset / 4 + len <= files[&shard.file].len() as u64
                && shard.offsets[0] + shard.shape[0] <= shard.global_shape[0]
                && shard.offsets[1] + shard.shape[1] <= shard.global_shape[1];
            if !fits {
                return Err(io_error(
                    &path,
                    format!(
                        "the {} piece of `{}` at {:?} does not fit its tensor or its file `{}`",
                        shard.state.name(),
                        shard.name,
                        shard.offsets,
                        shard.file
                    ),
                ));
            }
            index
                .entry((shard.name.clone(), shard.state))
                .or_default()
                .push(i);
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            manifest,
            files,
            index,
        })
    }

    /// Checks that the checkpoint holds every state of each of `params` (whole tensors) at
    /// its shape, naming the first it does not.
    pub fn check(&self, params: &[ParamSpec], states: &[StateKind]) -> Result<(), RuntimeError> {
        for p in params {
            for &state in states {
                let pieces = self.index.get(&(p.name.clone(), state));
                let shape = pieces
                    .and_then(|pieces| pieces.first())
                    .map(|&i| self.manifest.shards[i].global_shape);
                let why = match shape {
                    None => format!("it has no {} of `{}`", state.name(), p.name),
                    Some(shape) if shape != [p.rows, p.cols] => format!(
                        "its `{}` is {}×{}, this plan's model (`{}` there) has it {}×{}: resume \
                         with the model and `--scale` it was saved with",
                        p.name, shape[0], shape[1], self.manifest.model, p.rows, p.cols
                    ),
                    Some(_) => continue,
                };
                return Err(io_error(&self.dir, why));
            }
        }
        Ok(())
    }

    /// Whether the checkpoint holds `state` of the parameter `name`.
    pub fn has(&self, name: &str, state: StateKind) -> bool {
        self.index.contains_key(&(name.to_string(), state))
    }

    /// `state` of the parameter's local rectangle, row-major, assembled from the pieces that
    /// overlap it, and how many of its elements came from each writing rank; an error when
    /// the checkpoint lacks the parameter, holds it at another shape, or does not cover the
    /// rectangle. Of pieces with the same rectangle (replicated key/value heads, a tied
    /// embedding's copy) the lowest rank's is read, as [`reshard_sources`] counts.
    pub fn block_with_sources(
        &self,
        p: &ParamSpec,
        state: StateKind,
    ) -> Result<(Vec<f32>, BTreeMap<u64, u64>), RuntimeError> {
        let missing = |why: String| io_error(&self.dir, why);
        let pieces = self
            .index
            .get(&(p.name.clone(), state))
            .ok_or_else(|| missing(format!("no {} of `{}`", state.name(), p.name)))?;
        let ((r0, r1), (c0, c1)) = (p.row_range(), p.col_range());
        let width = (c1 - c0) as usize;
        let mut out = vec![0.0f32; (r1 - r0) as usize * width];
        let mut covered = vec![false; out.len()];
        let mut sources = BTreeMap::new();
        let mut seen = Vec::new();
        for &i in pieces {
            let s = &self.manifest.shards[i];
            if seen.contains(&(s.offsets, s.shape)) {
                continue;
            }
            seen.push((s.offsets, s.shape));
            if s.global_shape != [p.rows, p.cols] {
                return Err(missing(format!(
                    "`{}` is {}×{} there, {}×{} in this model",
                    p.name, s.global_shape[0], s.global_shape[1], p.rows, p.cols
                )));
            }
            let values = &self.files[&s.file];
            let base = (s.byte_offset / 4) as usize;
            let rows = r0.max(s.offsets[0])..r1.min(s.offsets[0] + s.shape[0]);
            let (lo, hi) = (c0.max(s.offsets[1]), c1.min(s.offsets[1] + s.shape[1]));
            if hi <= lo || rows.is_empty() {
                continue;
            }
            *sources.entry(s.rank).or_insert(0) += (rows.end - rows.start) * (hi - lo);
            for r in rows {
                let src = base + ((r - s.offsets[0]) * s.shape[1] + (lo - s.offsets[1])) as usize;
                let dst = (r - r0) as usize * width + (lo - c0) as usize;
                let n = (hi - lo) as usize;
                out[dst..dst + n].copy_from_slice(&values[src..src + n]);
                covered[dst..dst + n].iter_mut().for_each(|c| *c = true);
            }
        }
        if covered.iter().all(|&c| c) {
            Ok((out, sources))
        } else {
            Err(missing(format!(
                "its pieces of `{}` ({}) do not cover rows {r0}–{r1}, columns {c0}–{c1}",
                p.name,
                state.name()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::Init;
    use crate::model::layout::Split;

    fn param(split: Split) -> ParamSpec {
        ParamSpec {
            name: "w".into(),
            rows: 4,
            cols: 6,
            split,
            init: Init::Constant(0.0),
            sp_partial: false,
            tp_replicas: 1,
        }
    }

    fn global(r: u64, c: u64) -> f32 {
        (r * 6 + c) as f32
    }

    fn local(p: &ParamSpec) -> Vec<f32> {
        let ((r0, r1), (c0, c1)) = (p.row_range(), p.col_range());
        (r0..r1)
            .flat_map(|r| (c0..c1).map(move |c| global(r, c)))
            .collect()
    }

    #[test]
    fn column_pieces_read_back_as_row_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let mut shards = Vec::new();
        for index in 0..3 {
            let p = param(Split::Cols { parts: 3, index });
            let piece = StatePiece {
                param: p.clone(),
                state: StateKind::AdamV,
                data: local(&p),
            };
            shards.extend(write_rank(dir.path(), index as usize, &[piece]).unwrap());
        }
        write_manifest(dir.path(), 7, "tiny", shards).unwrap();
        let checkpoint = Checkpoint::read(dir.path()).unwrap();
        assert_eq!(checkpoint.manifest.step, 7);
        for index in 0..2 {
            let p = param(Split::Rows { parts: 2, index });
            assert_eq!(
                checkpoint
                    .block_with_sources(&p, StateKind::AdamV)
                    .unwrap()
                    .0,
                local(&p)
            );
        }
        let missing = checkpoint.block_with_sources(&param(Split::Replicated), StateKind::Param);
        assert!(missing.is_err());
    }

    #[test]
    fn a_piece_missing_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = param(Split::Cols { parts: 2, index: 0 });
        let piece = StatePiece {
            param: p.clone(),
            state: StateKind::Param,
            data: local(&p),
        };
        let shards = write_rank(dir.path(), 0, &[piece]).unwrap();
        write_manifest(dir.path(), 1, "tiny", shards).unwrap();
        let checkpoint = Checkpoint::read(dir.path()).unwrap();
        let err = checkpoint
            .block_with_sources(&param(Split::Replicated), StateKind::Param)
            .unwrap_err()
            .to_string();
        assert!(err.contains("do not cover rows 0–4, columns 0–6"), "{err}");
    }
}
