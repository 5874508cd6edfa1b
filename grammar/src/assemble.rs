//! Resolved blocks to typed definitions and the [`Spec`] of the `train` block, with the checks
//! that span blocks (references, precision support, sequence length, strategies).

use std::collections::HashMap;

use crate::blocks::cluster::{self, GpuLookup};
use crate::blocks::gpu::{self, GpuDef};
use crate::blocks::strategy::{self, Context};
use crate::blocks::{model, search, serve, train};
use crate::diagnostic::{Diagnostics, Problem};
use crate::fields::{Fields, ResolvedField};
use crate::loader::Loaded;
use crate::resolve::{Kind, Resolver, ROOT_FILE};
use crate::spec::{
    ClusterSpec, EncoderPlacement, GpuSpec, ModelSpec, Precision, SearchSpace, ServingSpec, Spec,
    Strategy,
};

/// Everything a spec file defines, checked. `spec` is present when the file has a `train`
/// block, `serving` when it has a `serve` block.
#[derive(Clone, Debug, PartialEq)]
pub struct Definitions {
    /// GPUs the spec defines itself (the built-in catalog is [`crate::gpu_catalog`]).
    pub gpus: Vec<GpuSpec>,
    pub clusters: Vec<ClusterSpec>,
    pub models: Vec<ModelSpec>,
    pub spec: Option<Spec>,
    pub serving: Option<ServingSpec>,
    /// The built-in GPUs, in catalog order.
    pub(crate) catalog: Vec<GpuSpec>,
}

fn fields_of(
    resolver: &mut Resolver,
    index: usize,
    problems: &mut Vec<Problem>,
) -> Option<Vec<ResolvedField>> {
    resolver.fields(index, problems).map(|f| f.to_vec())
}

/// The definition a job's `model` or `cluster` field names; a problem when none has that name.
/// `None` also when the definition itself is broken (its own errors are reported).
fn referenced<T: Clone>(
    definitions: &HashMap<String, Option<T>>,
    name: Option<&crate::ast::Name>,
    kind: Kind,
    resolver: &Resolver,
    problems: &mut Vec<Problem>,
) -> Option<T> {
    let name = name?;
    match definitions.get(&name.text) {
        Some(definition) => definition.clone(),
        None => {
            problems.push(resolver.unknown(kind, name, ""));
            None
        }
    }
}

/// A problem when the cluster's GPU has no tensor cores of `precision`.
fn missing_precision(
    cluster: &ClusterSpec,
    precision: Precision,
    span: crate::source::Span,
    written: bool,
) -> Option<Problem> {
    if cluster.gpu.peak.for_precision(precision) != 0.0 {
        return None;
    }
    let name = train::PRECISIONS
        .iter()
        .find(|(_, p)| *p == precision)
        .map_or("", |(n, _)| n);
    Some(
        Problem::new(
            span,
            format!(
                "GPU `{}` of cluster `{}` has no {} tensor cores (its `{name}` is 0)",
                cluster.gpu.name,
                cluster.name,
                name.to_uppercase()
            ),
        )
        .with_help(if written {
            "choose another `precision`"
        } else {
            "`precision` defaults to `bf16`; set another, such as `precision = fp16`"
        }),
    )
}

/// The loader reads the catalog first, then the spec itself.
const CATALOG_FILE: usize = 0;

pub fn assemble(loaded: Loaded, require_job: bool) -> Result<Definitions, Diagnostics> {
    let mut problems = Vec::new();
    let (mut resolver, sources) = Resolver::new(loaded, &mut problems);

    let mut gpus: HashMap<String, Option<GpuDef>> = HashMap::new();
    let mut user_gpus = Vec::new();
    let mut catalog = Vec::new();
    for index in resolver.indices(Kind::Gpu) {
        let lowered = fields_of(&mut resolver, index, &mut problems).and_then(|fields| {
            let def = &resolver.blocks[index];
            let mut f = Fields::new(def.owner(), def.block.header, fields, &mut problems);
            gpu::lower(&def.name, &mut f)
        });
        let def = &resolver.blocks[index];
        if let Some(g) = &lowered {
            if def.file == CATALOG_FILE {
                catalog.push(g.spec.clone());
            } else {
                user_gpus.push(g.spec.clone());
            }
        }
        gpus.insert(def.name.clone(), lowered);
    }

    // Files a spec names (a cluster's calibration) are relative to the spec itself.
    let spec_dir = sources
        .files
        .get(ROOT_FILE)
        .and_then(|f| f.path.as_ref())
        .and_then(|p| p.parent())
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let mut clusters: HashMap<String, Option<ClusterSpec>> = HashMap::new();
    let mut cluster_list = Vec::new();
    for index in resolver.indices(Kind::Cluster) {
        let lowered = fields_of(&mut resolver, index, &mut problems).and_then(|fields| {
            let def = &resolver.blocks[index];
            let find_gpu = |name: &crate::ast::Name| match gpus.get(&name.text) {
                Some(Some(g)) => GpuLookup::Found(g),
                Some(None) => GpuLookup::Broken,
                None => GpuLookup::Unknown(resolver.unknown(Kind::Gpu, name, "")),
            };
            let mut f = Fields::new(def.owner(), def.block.header, fields, &mut problems);
            cluster::lower(&def.name, &mut f, &find_gpu, &spec_dir)
        });
        if let Some(c) = &lowered {
            cluster_list.push(c.clone());
        }
        clusters.insert(resolver.blocks[index].name.clone(), lowered);
    }

    let mut models: HashMap<String, Option<ModelSpec>> = HashMap::new();
    let mut model_list = Vec::new();
    for index in resolver.indices(Kind::Model) {
        let lowered = fields_of(&mut resolver, index, &mut problems).and_then(|fields| {
            let def = &resolver.blocks[index];
            let mut f = Fields::new(def.owner(), def.block.header, fields, &mut problems);
            model::lower(&def.name, &mut f)
        });
        if let Some(m) = &lowered {
            model_list.push(m.clone());
        }
        models.insert(resolver.blocks[index].name.clone(), lowered);
    }

    // The job: one `train` block, its model and cluster.
    let trains = resolver.indices(Kind::Train);
    for &extra in trains.iter().skip(1) {
        problems.push(
            Problem::new(
                resolver.blocks[extra].block.header,
                "a spec has one `train` block; this is another",
            )
            .with_help("move other jobs to their own files"),
        );
    }
    let mut job = None;
    if let Some(&index) = trains.first() {
        if let Some(fields) = fields_of(&mut resolver, index, &mut problems) {
            let def = &resolver.blocks[index];
            let mut f = Fields::new(def.owner(), def.block.header, fields, &mut problems);
            let t = train::lower(&mut f);
            let precision_span = f.get("precision").map_or(f.anchor, |v| v.span);
            let precision_written = f.has("precision");
            let seq_len_span = f.get("seq_len").map_or(f.anchor, |v| v.span);
            let multimodal_span = f.get("multimodal").map_or(f.anchor, |v| v.span);
            let model = referenced(
                &models,
                t.model.as_ref(),
                Kind::Model,
                &resolver,
                &mut problems,
            );
            let mut cluster = referenced(
                &clusters,
                t.cluster.as_ref(),
                Kind::Cluster,
                &resolver,
                &mut problems,
            );
            if let (Some(spec), Some(m)) = (&t.spec, &model) {
                if spec.multimodal.is_some() && m.encoders.is_empty() {
                    problems.push(
                        Problem::new(
                            multimodal_span,
                            format!("`multimodal` places encoders, and model `{}` has none", m.name),
                        )
                        .with_help("add an `encoder NAME { … }` block to the model, or remove `multimodal`"),
                    );
                }
            }
            // The encoders' own GPUs come out of the cluster: strategies count the rest.
            if let (Some(gpus), Some(c)) = (
                t.spec
                    .as_ref()
                    .and_then(|s| s.multimodal)
                    .filter(|m| m.placement == EncoderPlacement::Separate)
                    .and_then(|m| m.encoder_gpus),
                cluster.as_mut(),
            ) {
                match c.without_encoder_gpus(gpus) {
                    Ok(rest) => *c = rest,
                    Err(message) => problems
                        .push(Problem::new(multimodal_span, message).with_help(
                            "give the encoders whole nodes, fewer than the cluster has",
                        )),
                }
            }
            if let (Some(spec), Some(cluster)) = (&t.spec, &cluster) {
                problems.extend(missing_precision(
                    cluster,
                    spec.precision,
                    precision_span,
                    precision_written,
                ));
            }
            if let (Some(spec), Some(m)) = (&t.spec, &model) {
                // Attention FLOPs grow with layers·seq_len·heads·head_dim; keep them in `u64`.
                let attention = m.layers as f64 * spec.seq_len as f64 * m.q_dim() as f64;
                if attention > 1e17 {
                    problems.push(Problem::new(
                        seq_len_span,
                        format!(
                            "`seq_len` ({}) is too long for model `{}` to count its FLOPs",
                            spec.seq_len, m.name
                        ),
                    ));
                }
                if let Some(max) = m.max_seq_len {
                    if spec.seq_len > max {
                        problems.push(Problem::new(
                            seq_len_span,
                            format!(
                                "`seq_len` ({}) exceeds the `max_seq_len` ({max}) of model `{}`",
                                spec.seq_len, m.name
                            ),
                        ));
                    }
                }
            }
            job = Some((model, cluster, t.spec));
        }
    }

    let serves = resolver.indices(Kind::Serve);
    for &extra in serves.iter().skip(1) {
        problems.push(
            Problem::new(
                resolver.blocks[extra].block.header,
                "a spec has one `serve` block; this is another",
            )
            .with_help("move other deployments to their own files"),
        );
    }
    if let (Some(&train_at), Some(&serve_at)) = (trains.first(), serves.first()) {
        let train = &resolver.blocks[train_at];
        let file = sources.file(train.file);
        let (line, column) = file.line_column(train.block.header.start);
        problems.push(
            Problem::new(
                resolver.blocks[serve_at].block.header,
                "a spec has a `train` block or a `serve` block, not both",
            )
            .with_help(format!(
                "move the serving job to a file of its own (the `train` block is at {}:{line}:{column})",
                file.name
            )),
        );
    }
    let mut serving = None;
    if let Some(&index) = serves.first() {
        if let Some(fields) = fields_of(&mut resolver, index, &mut problems) {
            let def = &resolver.blocks[index];
            let mut f = Fields::new(def.owner(), def.block.header, fields, &mut problems);
            let s = serve::lower(&mut f, &spec_dir);
            let precision_span = f.get("precision").map_or(f.anchor, |v| v.span);
            let kv_span = f.get("kv_precision").map_or(precision_span, |v| v.span);
            let precision_written = f.has("precision");
            let model = referenced(
                &models,
                s.model.as_ref(),
                Kind::Model,
                &resolver,
                &mut problems,
            );
            let cluster = referenced(
                &clusters,
                s.cluster.as_ref(),
                Kind::Cluster,
                &resolver,
                &mut problems,
            );
            if let (Some(serve), Some(cluster)) = (&s.serve, &cluster) {
                problems.extend(missing_precision(
                    cluster,
                    serve.precision,
                    precision_span,
                    precision_written,
                ));
                // An FP8 cache is stored in FP8 and read back into the weights' precision: it
                // needs no FP8 tensor cores.
                if serve.kv_precision != serve.precision && serve.kv_precision != Precision::Fp8 {
                    problems.extend(missing_precision(
                        cluster,
                        serve.kv_precision,
                        kv_span,
                        true,
                    ));
                }
                if !cluster.pools.is_empty() {
                    problems.push(
                        Problem::new(
                            resolver.blocks[index].block.header,
                            format!(
                                "cluster `{}` has pools; serving is planned on one GPU type",
                                cluster.name
                            ),
                        )
                        .with_help("serve on a cluster without `pool` blocks"),
                    );
                }
            }
            if let (Some(serve), Some(model), Some(cluster)) = (s.serve, model, cluster) {
                serving = Some(ServingSpec {
                    model,
                    cluster,
                    serve,
                });
            }
        }
    }

    let mut strategies: Vec<Strategy> = Vec::new();
    for index in resolver.indices(Kind::Strategy) {
        let Some(fields) = fields_of(&mut resolver, index, &mut problems) else {
            continue;
        };
        let def = &resolver.blocks[index];
        let context = match &job {
            Some((Some(model), Some(cluster), Some(train))) => Some(Context {
                model,
                cluster,
                train,
            }),
            _ => None,
        };
        let mut f = Fields::new(def.owner(), def.block.header, fields, &mut problems);
        if let Some(s) = strategy::lower(&def.name, &mut f, context.as_ref()) {
            strategies.push(s);
        }
    }

    let searches = resolver.indices(Kind::Search);
    for &extra in searches.iter().skip(1) {
        problems.push(Problem::new(
            resolver.blocks[extra].block.header,
            "a spec has one `search` block; this is another",
        ));
    }
    let mut search_space = Some(SearchSpace::default());
    if let Some(&index) = searches.first() {
        search_space = fields_of(&mut resolver, index, &mut problems).and_then(|fields| {
            let def = &resolver.blocks[index];
            let mut f = Fields::new(def.owner(), def.block.header, fields, &mut problems);
            search::lower(&mut f)
        });
    }

    if job.is_none() && serves.is_empty() && require_job && problems.is_empty() {
        let name = sources.files.get(ROOT_FILE).map_or("", |f| f.name.as_str());
        problems.push(Problem {
            span: None,
            message: format!("`{name}` has no `train` block"),
            help: Some(
                "add `train { model = ..., cluster = ..., seq_len = ..., global_batch = ... }`, \
                 or `serve { model = ..., cluster = ..., workload = ..., slo = ... }`"
                    .into(),
            ),
            file_name: Some(name.to_string()),
        });
    }
    if !problems.is_empty() {
        return Err(Diagnostics::from_problems(problems, &sources));
    }
    let spec = match (job, search_space) {
        (Some((Some(model), Some(cluster), Some(train))), Some(search)) => Some(Spec {
            model,
            cluster,
            train,
            strategies,
            search,
        }),
        _ => None,
    };
    Ok(Definitions {
        gpus: user_gpus,
        clusters: cluster_list,
        models: model_list,
        spec,
        serving,
        catalog,
    })
}
