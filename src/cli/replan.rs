//! `tessel replan PLAN (--gpus N | --nodes N | --remove-nodes K | --add POOL:NODES)
//! [--remaining-steps S] [--objective expected|pessimistic] [-o FILE] [--format table|json]`:
//! the best plan for the job's new resources, the cost of moving there counted. Two
//! candidates: the plan the search finds for the new cluster, and the current shape with as many data-parallel replicas as the new cluster
//! (or, on pools, the current plan's pool) holds (the least to move). Each is charged the time to
//! move every rank's shards to where the new plan needs them (the resharding map the runtime's
//! checkpoints follow, `tessel_runtime::checkpoint::reshard_sources`, over the links between
//! the GPUs involved) plus its predicted step time over the remaining steps; the cheaper wins.
//! `--add POOL:NODES` grows a pool of the cluster of pools the plan was made for (one the plan
//! did not use brings it in); a GPU keeps its place in its pool from one plan to the next.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;
use tessel_grammar::{ClusterSpec, Spec};
use tessel_planner::{plan_fixed, Objective, Plan, PlanError, PoolPlacement, ACROSS_POOLS};
use tessel_runtime::checkpoint::{reshard_sources, ReshardSource};
use tessel_runtime::ExecutionPlan;
use tessel_symbolic::cost::{pool_spec, CostModel};

use super::diff::read_plan;
use super::TableOrJson as Format;
use super::{ClusterArgs, EXIT_BAD_INPUT, EXIT_NO_FIT};

/// Bytes of one element of a checkpointed state (the runtime's f32 parameters and moments;
/// 12 bytes a parameter in all, as a bf16 job's fp32 master and Adam moments).
const BYTES_PER_ELEMENT: f64 = 4.0;

#[derive(clap::Args)]
pub struct Args {
    /// The current plan file.
    pub plan: PathBuf,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Nodes taken away (the last ones).
    #[arg(long, conflicts_with_all = ["gpus", "nodes"])]
    pub remove_nodes: Option<u64>,
    /// Nodes added to a pool of the plan's cluster of pools, as `POOL:NODES`.
    #[arg(long, value_name = "POOL:NODES", conflicts_with_all = ["gpus", "nodes", "remove_nodes"])]
    pub add: Option<String>,
    /// What the search ranks the new cluster's configurations by, as for `tessel plan`.
    #[arg(long, default_value = "pessimistic", value_parser = super::plan::parse_objective)]
    pub objective: Objective,
    /// Optimizer steps left to train: what a faster plan saves is its gain over these.
    #[arg(long, default_value_t = 1000)]
    pub remaining_steps: u64,
    /// Write the chosen plan here.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

/// One way to continue: a plan and what moving to it costs.
struct Candidate {
    label: &'static str,
    plan: Plan,
    sources: Vec<ReshardSource>,
    moved_bytes: f64,
    transfer_s: f64,
}

impl Candidate {
    fn total_s(&self, steps: u64) -> f64 {
        self.transfer_s + steps as f64 * self.plan.prediction.step_time_s
    }
}

fn bad_input(message: String) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_BAD_INPUT)
}

pub fn run(args: &Args) -> ExitCode {
    let current = match read_plan(&args.plan) {
        Ok(plan) => plan,
        Err(code) => return code,
    };
    let spec = match &args.add {
        Some(add) => grown(&current, add),
        None => resized(&current, args),
    };
    let spec = match spec {
        Ok(spec) => spec,
        Err(message) => return bad_input(message),
    };
    let old = match ExecutionPlan::from_plan(&current) {
        Ok(old) => old,
        Err(error) => return bad_input(format!("`{}`: {error}", args.plan.display())),
    };
    let mut candidates = Vec::new();
    let mut refused = Vec::new();
    let model = match CostModel::new(&spec) {
        Ok(model) => model,
        Err(error) => return bad_input(error.to_string()),
    };
    match super::plan::search(&spec, &model, None, args.objective, false) {
        Ok(plan) => candidates.push(("searched best", plan)),
        Err(error) => refused.push(format!("searched best: {error}")),
    }
    let label = "current shape, other replicas";
    match same_shape_spec(&current, &spec) {
        Err(why) => refused.push(format!("{label}: {why}")),
        Ok((on, placement)) => {
            let mut same_shape = current.strategy();
            let per_replica = same_shape.tp * same_shape.pp * same_shape.cp;
            same_shape.dp = on.cluster.total_gpus() / per_replica.max(1);
            same_shape.name = "same_shape".into();
            if same_shape.dp == 0 {
                refused.push(format!("{label}: one replica needs {per_replica} GPUs"));
            } else {
                match CostModel::new(&on)
                    .map_err(|e| PlanError::CostModel {
                        message: e.to_string(),
                    })
                    .and_then(|model| plan_fixed(&on, &model, &same_shape))
                {
                    Ok(plan) if plan.prediction.fits => {
                        candidates.push((label, Plan { placement, ..plan }))
                    }
                    Ok(_) => refused.push(format!("{label}: does not fit")),
                    Err(error) => refused.push(format!("{label}: {error}")),
                }
            }
        }
    }
    if candidates.is_empty() {
        eprintln!(
            "error: no plan runs on the new cluster: {}",
            refused.join("; ")
        );
        return ExitCode::from(EXIT_NO_FIT);
    }
    let mut costed: Vec<Candidate> = Vec::new();
    for (label, plan) in candidates {
        let new = match ExecutionPlan::from_plan(&plan) {
            Ok(new) => new,
            Err(error) => return bad_input(format!("{label}: {error}")),
        };
        let sources = reshard_sources(&spec.model, &old, &new);
        let (moved_bytes, transfer_s) = transfer(&sources, &current, &plan);
        costed.push(Candidate {
            label,
            plan,
            sources,
            moved_bytes,
            transfer_s,
        });
    }
    let steps = args.remaining_steps;
    let chosen = (0..costed.len())
        .min_by(|&a, &b| {
            costed[a]
                .total_s(steps)
                .total_cmp(&costed[b].total_s(steps))
        })
        .unwrap_or(0);
    if let Some(path) = &args.output {
        let text = costed[chosen].plan.to_json();
        if let Err(error) = std::fs::write(path, text) {
            return bad_input(format!("cannot write `{}`: {error}", path.display()));
        }
    }
    match args.format {
        Format::Table => print_table(&current, &costed, chosen, steps, &refused),
        Format::Json => print_json(&costed, chosen, steps, &refused),
    }
    ExitCode::SUCCESS
}

/// The new resources after `--gpus`, `--nodes` or `--remove-nodes`: the plan's own cluster
/// resized.
fn resized(current: &Plan, args: &Args) -> Result<Spec, String> {
    let mut spec = current.spec.clone();
    let resize = match args.remove_nodes {
        Some(k) if k >= spec.cluster.nodes => {
            return Err(format!(
                "--remove-nodes {k} leaves nothing of {}'s {} nodes",
                spec.cluster.name, spec.cluster.nodes
            ))
        }
        Some(k) => ClusterArgs {
            gpus: None,
            nodes: Some(spec.cluster.nodes - k),
        },
        None if args.cluster.gpus.is_none() && args.cluster.nodes.is_none() => {
            return Err(
                "say what changed: --gpus N, --nodes N, --remove-nodes K or --add POOL:NODES"
                    .into(),
            )
        }
        None => ClusterArgs {
            gpus: args.cluster.gpus,
            nodes: args.cluster.nodes,
        },
    };
    resize.apply(&mut spec)?;
    Ok(spec)
}

/// The new resources after `--add POOL:NODES`: the cluster of pools the plan was made for,
/// with `NODES` more nodes in `POOL`.
fn grown(current: &Plan, add: &str) -> Result<Spec, String> {
    let (name, nodes) = add
        .split_once(':')
        .and_then(|(name, nodes)| Some((name, nodes.parse::<u64>().ok().filter(|&n| n > 0)?)))
        .ok_or_else(|| format!("--add {add}: write POOL:NODES, e.g. --add loan:4"))?;
    let placement = current.placement.as_ref().ok_or_else(|| {
        format!(
            "--add {add}: the plan's cluster `{}` has no pools; write the pool into the spec's \
             cluster (`pool {name} {{ … }}`) and plan it",
            current.spec.cluster.name
        )
    })?;
    let cluster = &placement.cluster;
    let mut pools = cluster.pools.clone();
    let Some(pool) = pools.iter_mut().find(|p| p.name == name) else {
        let known: Vec<&str> = cluster.pools.iter().map(|p| p.name.as_str()).collect();
        return Err(format!(
            "--add {add}: cluster `{}` has no pool `{name}`; its pools are {}",
            cluster.name,
            known.join(", ")
        ));
    };
    pool.nodes += nodes;
    let between = cluster
        .between_pools
        .clone()
        .unwrap_or_else(|| cluster.inter_node.clone());
    let mut spec = current.spec.clone();
    spec.cluster = ClusterSpec::of_pools(&cluster.name, pools, between);
    Ok(spec)
}

/// The spec the current shape is re-costed on: the new cluster, or on pools the pool the plan
/// ran on (a fixed strategy runs on one GPU type), with that placement.
fn same_shape_spec(current: &Plan, spec: &Spec) -> Result<(Spec, Option<PoolPlacement>), String> {
    if spec.cluster.pools.is_empty() {
        return Ok((spec.clone(), None));
    }
    let placement = current
        .placement
        .as_ref()
        .filter(|p| p.placement != ACROSS_POOLS)
        .ok_or("the current plan runs across pools; a fixed shape runs on one GPU type")?;
    let name = &placement.pools[0].name;
    let pool = spec
        .cluster
        .pool(name)
        .ok_or_else(|| format!("the new cluster has no pool `{name}`"))?;
    let placed = PoolPlacement::one_pool(&spec.cluster, pool, current.config.pp);
    Ok((pool_spec(spec, pool), Some(placed)))
}

/// Where a rank of `plan` runs, as the same GPU is named in any plan of the job: its pool (none
/// on one GPU type), its index in the pool, and the pool (or cluster) whose links reach it.
fn gpu_of<'a>(
    plan: &'a Plan,
    rank: u64,
    cluster: &'a ClusterSpec,
) -> (&'a str, u64, &'a ClusterSpec) {
    match plan.placement.as_ref().and_then(|p| p.gpu_of(rank)) {
        Some((pool, index)) => (pool.name.as_str(), index, pool),
        None => ("", rank, cluster),
    }
}

/// Bytes that change rank, and the time to move them: over NVLink between GPUs of one node,
/// over the network between nodes of one pool (a GPU of a removed node included, its shards
/// read from where the checkpoint is), and over the link between pools otherwise; every rank
/// sending and receiving at once, the busiest one's sends or receives taking longest.
fn transfer(sources: &[ReshardSource], old: &Plan, new: &Plan) -> (f64, f64) {
    let cluster = &new.spec.cluster;
    let between = new
        .placement
        .as_ref()
        .or(old.placement.as_ref())
        .and_then(|p| p.cluster.between_pools.as_ref())
        .unwrap_or(&cluster.inter_node);
    let mut received: BTreeMap<u64, f64> = BTreeMap::new();
    let mut sent: BTreeMap<u64, f64> = BTreeMap::new();
    let mut moved = 0.0;
    for s in sources.iter().filter(|s| s.from != s.to) {
        let bytes = s.elements as f64 * BYTES_PER_ELEMENT;
        moved += bytes;
        let (from_pool, from, _) = gpu_of(old, s.from, cluster);
        let (to_pool, to, pool) = gpu_of(new, s.to, cluster);
        let per_node = pool.gpus_per_node.max(1);
        let link = if from_pool != to_pool {
            between
        } else if from / per_node == to / per_node {
            &pool.intra_node
        } else {
            &pool.inter_node
        };
        *received.entry(s.to).or_default() += bytes / link.bandwidth;
        *sent.entry(s.from).or_default() += bytes / link.bandwidth;
    }
    let busiest = received
        .values()
        .chain(sent.values())
        .fold(0.0, |a, &b| f64::max(a, b));
    (moved, busiest)
}

fn gb(bytes: f64) -> String {
    format!("{:.2} GB", bytes / 1e9)
}

fn print_table(
    current: &Plan,
    costed: &[Candidate],
    chosen: usize,
    steps: u64,
    refused: &[String],
) {
    let new = &costed[chosen].plan;
    println!(
        "replan {} from {} to {} GPUs, {steps} steps left",
        current.model, current.gpus, new.gpus
    );
    println!(
        "  current      {}   {:.3} s/step",
        tessel_planner::describe_strategy(&current.strategy()),
        current.prediction.step_time_s
    );
    for (i, c) in costed.iter().enumerate() {
        println!(
            "  {} {:<30} {}   {:.3} s/step; moves {} in {}; {steps} steps in {:.1} h",
            if i == chosen { "*" } else { " " },
            c.label,
            tessel_planner::describe_strategy(&c.plan.strategy()),
            c.plan.prediction.step_time_s,
            gb(c.moved_bytes),
            super::duration(c.transfer_s),
            c.total_s(steps) / 3600.0
        );
    }
    for why in refused {
        println!("    not a candidate: {why}");
    }
    let sources = &costed[chosen].sources;
    println!("\nresharding map (new rank ← old rank), largest moves first:");
    let mut moves: Vec<&ReshardSource> = sources.iter().filter(|s| s.from != s.to).collect();
    moves.sort_by(|a, b| {
        b.elements
            .cmp(&a.elements)
            .then((a.to, a.from).cmp(&(b.to, b.from)))
    });
    for s in moves.iter().take(20) {
        println!(
            "  {:>5} ← {:<5} {}",
            s.to,
            s.from,
            gb(s.elements as f64 * BYTES_PER_ELEMENT)
        );
    }
    if moves.len() > 20 {
        println!(
            "  … {} more (--format json lists them all)",
            moves.len() - 20
        );
    }
    let kept: u64 = sources
        .iter()
        .filter(|s| s.from == s.to)
        .map(|s| s.elements)
        .sum();
    println!(
        "  kept where they are: {}",
        gb(kept as f64 * BYTES_PER_ELEMENT)
    );
}

fn print_json(costed: &[Candidate], chosen: usize, steps: u64, refused: &[String]) {
    let candidates: Vec<serde_json::Value> = costed
        .iter()
        .map(|c| {
            json!({
                "label": c.label,
                "strategy": tessel_planner::describe_strategy(&c.plan.strategy()),
                "gpus": c.plan.gpus,
                "step_time_s": c.plan.prediction.step_time_s,
                "moved_bytes": c.moved_bytes,
                "transfer_s": c.transfer_s,
                "total_s": c.total_s(steps),
            })
        })
        .collect();
    let map: Vec<serde_json::Value> = costed[chosen]
        .sources
        .iter()
        .map(|s| {
            json!({
                "from": s.from,
                "to": s.to,
                "elements": s.elements,
                "bytes": s.elements as f64 * BYTES_PER_ELEMENT,
            })
        })
        .collect();
    let out = json!({
        "remaining_steps": steps,
        "chosen": chosen,
        "candidates": candidates,
        "not_candidates": refused,
        "resharding": map,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
}
