//! Where this process sits in the job, read from the environment that the local launcher,
//! torchrun-style launchers (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`)
//! or Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NODEID`,
//! `SLURM_JOB_NODELIST`) set.

/// The rendezvous port when none is given (torchrun's default).
pub const DEFAULT_PORT: u16 = 29500;

/// The variable carrying the shared rendezvous token.
pub const TOKEN_VAR: &str = "TESSEL_RDZV_TOKEN";
/// The variable carrying the rendezvous timeout in seconds.
pub const TIMEOUT_VAR: &str = "TESSEL_RDZV_TIMEOUT_S";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorldEnv {
    pub rank: usize,
    pub world_size: usize,
    /// Index of this process on its node (its GPU).
    pub local_rank: usize,
    pub node_rank: usize,
    /// Rank 0's host and rendezvous port.
    pub master_addr: String,
    pub master_port: u16,
    /// Which convention the values came from: `torchrun` or `slurm`.
    pub source: &'static str,
}

/// Reads the job's placement through `var` (a function so tests need not touch the process
/// environment). `Ok(None)` when neither convention is present.
pub fn detect(var: impl Fn(&str) -> Option<String>) -> Result<Option<WorldEnv>, String> {
    let number = |name: &str| -> Result<Option<usize>, String> {
        match var(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| format!("{name}={v:?} is not a whole number")),
        }
    };
    let port = match var("MASTER_PORT") {
        None => DEFAULT_PORT,
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("MASTER_PORT={v:?} is not a port number"))?,
    };
    let (rank, world_size, local_rank, node_rank, master_addr, source) =
        if let (Some(rank), Some(world)) = (number("RANK")?, number("WORLD_SIZE")?) {
            let local = number("LOCAL_RANK")?.unwrap_or(rank);
            let node = number("GROUP_RANK")?.unwrap_or(0);
            let addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
            (rank, world, local, node, addr, "torchrun")
        } else if let (Some(rank), Some(world)) = (number("SLURM_PROCID")?, number("SLURM_NTASKS")?)
        {
            let local = number("SLURM_LOCALID")?.unwrap_or(0);
            let node = number("SLURM_NODEID")?.unwrap_or(0);
            let addr =
                match var("MASTER_ADDR") {
                    Some(a) => a,
                    None => match var("SLURM_JOB_NODELIST").or_else(|| var("SLURM_NODELIST")) {
                        Some(list) => first_host(&list)?,
                        None => return Err(
                            "Slurm sets no SLURM_JOB_NODELIST; set MASTER_ADDR to rank 0's host"
                                .into(),
                        ),
                    },
                };
            (rank, world, local, node, addr, "slurm")
        } else {
            return Ok(None);
        };
    if world_size == 0 || rank >= world_size {
        return Err(format!(
            "rank {rank} does not fit a world of {world_size} ranks"
        ));
    }
    Ok(Some(WorldEnv {
        rank,
        world_size,
        local_rank,
        node_rank,
        master_addr,
        master_port: port,
        source,
    }))
}

/// The first host of a Slurm node list: `gpu[03-05,07],cpu1` → `gpu03`.
pub fn first_host(list: &str) -> Result<String, String> {
    let list = list.trim();
    let first_entry_end = {
        let mut depth = 0;
        list.char_indices()
            .find(|&(_, c)| {
                match c {
                    '[' => depth += 1,
                    ']' => depth -= 1,
                    _ => {}
                }
                c == ',' && depth == 0
            })
            .map_or(list.len(), |(i, _)| i)
    };
    let entry = &list[..first_entry_end];
    let host = match entry.find('[') {
        None => entry.to_string(),
        Some(open) => {
            let prefix = &entry[..open];
            let inside = entry[open + 1..]
                .strip_suffix(']')
                .ok_or_else(|| format!("unbalanced brackets in node list {list:?}"))?;
            let first = inside.split(',').next().unwrap_or("");
            let first = first.split('-').next().unwrap_or("");
            format!("{prefix}{first}")
        }
    };
    if host.is_empty() {
        return Err(format!("no host in node list {list:?}"));
    }
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn torchrun_variables() {
        let w = detect(env(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("GROUP_RANK", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "1234"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            w,
            WorldEnv {
                rank: 5,
                world_size: 8,
                local_rank: 1,
                node_rank: 2,
                master_addr: "10.0.0.1".into(),
                master_port: 1234,
                source: "torchrun",
            }
        );
    }

    #[test]
    fn slurm_variables_and_node_lists() {
        let w = detect(env(&[
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_JOB_NODELIST", "gpu[03-05,07],cpu1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (w.rank, w.world_size, w.local_rank, w.node_rank),
            (9, 16, 1, 1)
        );
        assert_eq!(w.master_addr, "gpu03");
        assert_eq!(w.master_port, DEFAULT_PORT);
        assert_eq!(w.source, "slurm");
        assert_eq!(first_host("node7").unwrap(), "node7");
        assert_eq!(first_host("a1,b[1-2]").unwrap(), "a1");
        assert!(first_host("n[1-2").is_err());
    }

    #[test]
    fn absent_or_bad_values() {
        assert_eq!(detect(env(&[])).unwrap(), None);
        assert!(detect(env(&[("RANK", "x"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .contains("RANK=\"x\""));
        assert!(detect(env(&[("RANK", "2"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .contains("does not fit"));
        assert!(detect(env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]))
            .unwrap_err()
            .contains("MASTER_ADDR"));
    }
}
