//! nccl-tests output (`all_reduce_perf`, `all_gather_perf`, `reduce_scatter_perf`,
//! `alltoall_perf`, ...): the device list under `# Using devices`, the results table, and, in
//! newer versions, the `# Collective test starting: all_reduce_perf` line that names the test.
//!
//! The layout is the one nccl-tests prints (its `src/common.cu`): comment lines start with `#`;
//! the table's header names the columns (`size count type redop root time algbw busbw #wrong`,
//! once per placement, out-of-place then in-place); each result row is those columns as
//! whitespace-separated fields. Output gathered by `mpirun --tag-output` prefixes every line
//! with `[1,0]<stdout>:`, and NCCL's own log lines may fall between rows: both are read past.
//! Samples: `tests/traces/nccl-tests/`.

use super::TraceError;

/// One GPU of the run, from the `# Using devices` list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcclTestsDevice {
    pub rank: u64,
    pub host: String,
    /// The GPU's name as the driver reports it (`NVIDIA H100 80GB HBM3`).
    pub gpu: String,
}

/// One row of the results table.
#[derive(Clone, Debug, PartialEq)]
pub struct NcclTestsRow {
    /// nccl-tests' `size` column: bytes of the buffer the collective works on.
    pub bytes: u64,
    /// Out-of-place time, microseconds.
    pub out_of_place_us: f64,
    /// In-place time, microseconds, when the table has that placement.
    pub in_place_us: Option<f64>,
}

/// What one nccl-tests run printed.
#[derive(Clone, Debug, PartialEq)]
pub struct NcclTestsRun {
    /// The collective (`all_reduce`, `all_gather`, `reduce_scatter`, `alltoall`, `sendrecv`,
    /// ...) when the output names its test.
    pub collective: Option<String>,
    /// The ranks under `# Using devices`; empty when the output was cut to its table.
    pub devices: Vec<NcclTestsDevice>,
    /// GPUs each thread drives (`-g N`, printed as `nGpus N` in the first comment line), when
    /// that line was kept.
    pub gpus_per_thread: Option<u64>,
    pub rows: Vec<NcclTestsRow>,
}

impl NcclTestsRun {
    /// Ranks in the run, when the device list was kept.
    pub fn ranks(&self) -> Option<u64> {
        (!self.devices.is_empty()).then_some(self.devices.len() as u64)
    }

    /// The most ranks on one host, when the device list was kept.
    pub fn ranks_per_host(&self) -> Option<u64> {
        let mut hosts: Vec<&str> = self.devices.iter().map(|d| d.host.as_str()).collect();
        hosts.sort_unstable();
        hosts
            .chunk_by(|a, b| a == b)
            .map(|same| same.len() as u64)
            .max()
    }

    /// The GPU of rank 0, when the device list was kept.
    pub fn gpu(&self) -> Option<&str> {
        self.devices.first().map(|d| d.gpu.as_str())
    }
}

/// The columns every results table has, in order, for one placement.
const PLACEMENT_COLUMNS: [&str; 4] = ["time", "algbw", "busbw", "#wrong"];
const LEADING_COLUMNS: [&str; 5] = ["size", "count", "type", "redop", "root"];

/// Reads nccl-tests output.
pub fn parse_nccl_tests(text: &str) -> Result<NcclTestsRun, TraceError> {
    let mut collective = None;
    let mut devices = Vec::new();
    let mut gpus_per_thread = None;
    let mut columns: Option<usize> = None;
    let mut rows = Vec::new();
    let mut last_line = 0;
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        last_line = number;
        let line = without_mpi_tag(raw).trim();
        let error = |message: String| TraceError {
            line: number,
            message,
        };
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim();
            if let Some(test) = comment.strip_prefix("Collective test starting:") {
                collective = Some(collective_of_test(test.trim()));
            } else if comment.starts_with("Rank ") {
                devices.push(device(comment).ok_or_else(|| {
                    error(format!("`{comment}` is not a `Rank N Group G Pid P on HOST device D [bus] GPU` line"))
                })?);
            } else if let Some(count) = table_header(comment) {
                columns = Some(count);
            } else if comment.starts_with("nThread ") {
                let mut words = comment.split_whitespace();
                gpus_per_thread = words
                    .find(|w| *w == "nGpus")
                    .and_then(|_| words.next())
                    .and_then(|n| n.parse().ok());
            }
            continue;
        }
        let Some(width) = columns else {
            continue;
        };
        let fields: Vec<&str> = line.split_whitespace().collect();
        // NCCL's own log lines and blank lines may sit between rows.
        if fields.first().is_none_or(|f| f.parse::<u64>().is_err()) {
            continue;
        }
        if fields.len() != width {
            return Err(error(format!(
                "a result row has {} fields, but the table's header names {width} columns",
                fields.len()
            )));
        }
        let time = |at: usize| -> Result<f64, TraceError> {
            fields[at]
                .parse::<f64>()
                .ok()
                .filter(|t| t.is_finite() && *t > 0.0)
                .ok_or_else(|| {
                    error(format!(
                        "`{}` is not a time in microseconds (column {})",
                        fields[at],
                        at + 1
                    ))
                })
        };
        let bytes = fields[0].parse::<u64>().expect("checked above");
        // nccl-tests prints its smallest sizes as 0 bytes for collectives whose per-rank
        // count rounds down to nothing: nothing was measured.
        if bytes == 0 {
            continue;
        }
        let first_time = LEADING_COLUMNS.len();
        let second_time = first_time + PLACEMENT_COLUMNS.len();
        rows.push(NcclTestsRow {
            bytes,
            out_of_place_us: time(first_time)?,
            in_place_us: if width > second_time {
                Some(time(second_time)?)
            } else {
                None
            },
        });
    }
    if columns.is_none() {
        return Err(TraceError {
            line: last_line.max(1),
            message: "not nccl-tests output: no results table (a `#  size  count  type  redop  \
                      root  time  algbw  busbw  #wrong` header line)"
                .to_string(),
        });
    }
    if rows.is_empty() {
        return Err(TraceError {
            line: last_line.max(1),
            message: "the results table has no rows with a size above 0".to_string(),
        });
    }
    Ok(NcclTestsRun {
        collective,
        devices,
        gpus_per_thread,
        rows,
    })
}

/// `[1,0]<stdout>:# nThread …` → `# nThread …` (Open MPI's `--tag-output`).
fn without_mpi_tag(line: &str) -> &str {
    if line.starts_with('[') {
        if let Some(end) = line.find(">:") {
            if line[..end].contains("]<") {
                return &line[end + 2..];
            }
        }
    }
    line
}

/// `all_reduce_perf_mpi` → `all_reduce`.
fn collective_of_test(test: &str) -> String {
    let name = test.split_whitespace().next().unwrap_or_default();
    let name = name.strip_suffix("_mpi").unwrap_or(name);
    name.strip_suffix("_perf").unwrap_or(name).to_string()
}

/// The number of columns when `comment` is the table's header line, else `None`.
fn table_header(comment: &str) -> Option<usize> {
    let names: Vec<&str> = comment.split_whitespace().collect();
    let leading = names.len() >= LEADING_COLUMNS.len() + PLACEMENT_COLUMNS.len()
        && names[..LEADING_COLUMNS.len()] == LEADING_COLUMNS;
    let placements = &names[LEADING_COLUMNS.len().min(names.len())..];
    let whole = placements.len().is_multiple_of(PLACEMENT_COLUMNS.len())
        && placements
            .chunks(PLACEMENT_COLUMNS.len())
            .all(|chunk| chunk == PLACEMENT_COLUMNS);
    (leading && whole).then_some(names.len())
}

/// `Rank  0 Group  0 Pid   6899 on ztan-mig-235z device  0 [0000:04:00] NVIDIA H100 80GB HBM3`.
fn device(comment: &str) -> Option<NcclTestsDevice> {
    let fields: Vec<&str> = comment.split_whitespace().collect();
    let rank = fields.get(1)?.parse().ok()?;
    let on = fields.iter().position(|f| *f == "on")?;
    let host = fields.get(on + 1)?.to_string();
    // After `device D` comes the bus id in brackets, then the GPU's name.
    let bus = fields.iter().position(|f| f.starts_with('['))?;
    let gpu = fields.get(bus + 1..)?.join(" ");
    (!gpu.is_empty()).then_some(NcclTestsDevice { rank, host, gpu })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_and_broken_files_are_errors_with_their_line() {
        let err = parse_nccl_tests("step,time\n1,2\n").unwrap_err();
        assert!(err.message.starts_with("not nccl-tests output"), "{err}");
        let header = "#  size count type redop root time algbw busbw #wrong\n";
        let err = parse_nccl_tests(&format!("{header}  8 2 float sum -1 12.5 0.00\n")).unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.message.contains("7 fields"), "{err}");
        let err =
            parse_nccl_tests(&format!("{header}  8 2 float sum -1 fast 0 0 0\n")).unwrap_err();
        assert!(err.message.contains("`fast` is not a time"), "{err}");
        let err = parse_nccl_tests(header).unwrap_err();
        assert!(err.message.contains("no rows"), "{err}");
    }
}
