//! From parsed items to evaluated blocks: `let` scopes, block kinds and names, duplicates, and
//! `extends` (a child block starts from its parent's fields and overrides some).

use std::collections::HashMap;
use std::rc::Rc;

use crate::ast::{Block, Member, Name};
use crate::diagnostic::Problem;
use crate::eval::{eval, Scope, Spanned, Value};
use crate::fields::ResolvedField;
use crate::loader::{Entry, Loaded};
use crate::source::{FileId, SourceMap};
use crate::suggest;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Gpu,
    Cluster,
    Model,
    Train,
    Serve,
    Strategy,
    Search,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Gpu,
        Kind::Cluster,
        Kind::Model,
        Kind::Train,
        Kind::Serve,
        Kind::Strategy,
        Kind::Search,
    ];

    pub fn keyword(self) -> &'static str {
        match self {
            Kind::Gpu => "gpu",
            Kind::Cluster => "cluster",
            Kind::Model => "model",
            Kind::Train => "train",
            Kind::Serve => "serve",
            Kind::Strategy => "strategy",
            Kind::Search => "search",
        }
    }

    /// `train`, `serve` and `search` describe the job itself and may go without a name.
    fn name_optional(self) -> bool {
        self.is_job()
    }

    /// Blocks that describe the file's own job rather than define something to reuse.
    fn is_job(self) -> bool {
        matches!(
            self,
            Kind::Train | Kind::Serve | Kind::Search | Kind::Strategy
        )
    }

    /// What references to this kind are called in messages ("unknown GPU `x`").
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Gpu => "GPU",
            other => other.keyword(),
        }
    }
}

/// A block with its kind and name settled, and the `let`s visible where it was written.
pub struct BlockDef {
    pub file: FileId,
    pub kind: Kind,
    /// The block's name; an unnamed `train`/`search` block is named after its kind.
    pub name: String,
    pub block: Block,
    scope: Scope,
}

impl BlockDef {
    /// "model `llama3_70b`", or "the `train` block" for an unnamed one.
    pub fn owner(&self) -> String {
        if self.block.name.is_none() {
            format!("the `{}` block", self.kind.keyword())
        } else {
            format!("{} `{}`", self.kind.keyword(), self.name)
        }
    }
}

/// The spec itself; the loader reads the catalog (file 0) first.
pub const ROOT_FILE: FileId = 1;

/// Every block of a spec, evaluated on demand with `extends` applied.
pub struct Resolver {
    pub blocks: Vec<BlockDef>,
    resolved: HashMap<usize, Option<Rc<Vec<ResolvedField>>>>,
    in_progress: Vec<usize>,
}

impl Resolver {
    /// Settles kinds, names and `let`s; reports unknown kinds, missing names, duplicate names
    /// and duplicate `let`s.
    pub fn new(loaded: Loaded, problems: &mut Vec<Problem>) -> (Resolver, SourceMap) {
        let mut scopes: HashMap<FileId, (Scope, Vec<Name>)> = HashMap::new();
        let mut blocks: Vec<BlockDef> = Vec::new();
        for entry in loaded.entries {
            match entry {
                Entry::Let(file, l) => {
                    let (scope, names) = scopes.entry(file).or_default();
                    if names.iter().any(|n| n.text == l.name.text) {
                        problems.push(
                            Problem::new(
                                l.name.span,
                                format!("`{}` is defined twice", l.name.text),
                            )
                            .with_help("each `let` name is defined once per file"),
                        );
                        continue;
                    }
                    names.push(l.name.clone());
                    if let Some(v) = eval(&l.value, scope, problems) {
                        scope.bind(&l.name.text, v.value);
                    }
                }
                Entry::Block(file, block) => {
                    let Some(kind) = Kind::ALL
                        .into_iter()
                        .find(|k| k.keyword() == block.kind.text)
                    else {
                        let keywords = Kind::ALL.map(Kind::keyword);
                        let help = suggest::did_you_mean(&block.kind.text, keywords)
                            .unwrap_or_else(|| {
                                "blocks are `gpu`, `cluster`, `model`, `train`, `serve`, \
                                 `strategy` and `search`"
                                    .to_string()
                            });
                        problems.push(
                            Problem::new(
                                block.kind.span,
                                format!("unknown block kind `{}`", block.kind.text),
                            )
                            .with_help(help),
                        );
                        continue;
                    };
                    // A used file lends its definitions; its job (`train`, `serve`, `search`,
                    // and the strategies written for that job) stays its own, so a serving or
                    // fine-tuning spec can use a training spec's model.
                    if kind.is_job() && file != ROOT_FILE {
                        continue;
                    }
                    let name = match &block.name {
                        Some(n) => n.text.clone(),
                        None if kind.name_optional() => kind.keyword().to_string(),
                        None => {
                            problems.push(
                                Problem::new(
                                    block.header,
                                    format!("a `{}` block needs a name", kind.keyword()),
                                )
                                .with_help(format!("write `{} NAME {{ ... }}`", kind.keyword())),
                            );
                            continue;
                        }
                    };
                    if let Some(first) = blocks.iter().find(|b| b.kind == kind && b.name == name) {
                        let (line, column) = loaded
                            .sources
                            .file(first.file)
                            .line_column(first.block.header.start);
                        let message = if kind.name_optional() {
                            format!("a spec has one `{}` block; this is another", kind.keyword())
                        } else {
                            format!("{} `{name}` is defined twice", kind.keyword())
                        };
                        problems.push(Problem::new(block.header, message).with_help(format!(
                            "the first is at {}:{line}:{column}",
                            loaded.sources.file(first.file).name
                        )));
                        continue;
                    }
                    let scope = scopes.get(&file).map(|s| s.0.clone()).unwrap_or_default();
                    blocks.push(BlockDef {
                        file,
                        kind,
                        name,
                        block,
                        scope,
                    });
                }
            }
        }
        problems.extend(loaded.problems);
        (
            Resolver {
                blocks,
                resolved: HashMap::new(),
                in_progress: Vec::new(),
            },
            loaded.sources,
        )
    }

    pub fn find(&self, kind: Kind, name: &str) -> Option<usize> {
        self.blocks
            .iter()
            .position(|b| b.kind == kind && b.name == name)
    }

    pub fn names(&self, kind: Kind) -> Vec<&str> {
        self.blocks
            .iter()
            .filter(|b| b.kind == kind)
            .map(|b| b.name.as_str())
            .collect()
    }

    pub fn indices(&self, kind: Kind) -> Vec<usize> {
        (0..self.blocks.len())
            .filter(|&i| self.blocks[i].kind == kind)
            .collect()
    }

    /// An "unknown model `x`" problem for a reference, suggesting a close name.
    pub fn unknown(&self, kind: Kind, name: &Name, context: &str) -> Problem {
        let names = self.names(kind);
        let other_kind = Kind::ALL
            .into_iter()
            .find(|&k| k != kind && self.find(k, &name.text).is_some());
        let help = other_kind
            .map(|k| {
                format!(
                    "`{}` is a {}, not a {}",
                    name.text,
                    k.keyword(),
                    kind.keyword()
                )
            })
            .or_else(|| suggest::did_you_mean(&name.text, names.iter().copied()))
            .or_else(|| {
                if names.is_empty() {
                    Some(format!("no {} is defined", kind.noun()))
                } else {
                    Some(format!("known: {}", crate::fields::list_names(&names)))
                }
            });
        Problem::new(
            name.span,
            format!("unknown {} `{}`{context}", kind.noun(), name.text),
        )
        .with_optional_help(help)
    }

    /// The fields of block `index` after `extends`, or `None` when they could not be settled
    /// (the reasons are in `problems`).
    pub fn fields(
        &mut self,
        index: usize,
        problems: &mut Vec<Problem>,
    ) -> Option<Rc<Vec<ResolvedField>>> {
        if let Some(done) = self.resolved.get(&index) {
            return done.clone();
        }
        let result = self.resolve(index, problems);
        self.resolved.insert(index, result.clone());
        result
    }

    fn resolve(
        &mut self,
        index: usize,
        problems: &mut Vec<Problem>,
    ) -> Option<Rc<Vec<ResolvedField>>> {
        self.in_progress.push(index);
        let inherited = self.inherited(index, problems);
        self.in_progress.pop();
        let own = self.evaluate_own(index, inherited.as_deref().map_or(&[][..], |v| v), problems);
        let mut merged: Vec<ResolvedField> = (*inherited?).clone();
        for field in own {
            match merged.iter_mut().find(|f| f.key.text == field.key.text) {
                Some(slot) => *slot = field,
                None => merged.push(field),
            }
        }
        Some(Rc::new(merged))
    }

    /// The parent's fields (none without `extends`), or `None` when the parent is unknown or
    /// the chain of parents loops.
    fn inherited(
        &mut self,
        index: usize,
        problems: &mut Vec<Problem>,
    ) -> Option<Rc<Vec<ResolvedField>>> {
        let kind = self.blocks[index].kind;
        let Some(parent) = self.blocks[index].block.parent.clone() else {
            return Some(Rc::new(Vec::new()));
        };
        let Some(p) = self.find(kind, &parent.text) else {
            problems.push(self.unknown(kind, &parent, " in `extends`"));
            return None;
        };
        if let Some(start) = self.in_progress.iter().position(|&i| i == p) {
            let mut chain: Vec<String> = self.in_progress[start..]
                .iter()
                .map(|&i| format!("`{}`", self.blocks[i].name))
                .collect();
            chain.push(format!("`{}`", parent.text));
            problems.push(
                Problem::new(
                    parent.span,
                    format!("`extends` cycle: {}", chain.join(" extends ")),
                )
                .with_help("a block cannot inherit from itself, directly or through others"),
            );
            return None;
        }
        self.fields(p, problems)
    }

    /// Evaluates a block's own members, with the parent's fields and its own earlier fields and
    /// `let`s in scope.
    fn evaluate_own(
        &self,
        index: usize,
        inherited: &[ResolvedField],
        problems: &mut Vec<Problem>,
    ) -> Vec<ResolvedField> {
        let def = &self.blocks[index];
        let mut scope = def.scope.clone();
        for f in inherited {
            scope.bind(&f.key.text, f.value.value.clone());
        }
        let mut own: Vec<ResolvedField> = Vec::new();
        let mut local_names: Vec<&Name> = Vec::new();
        for member in &def.block.members {
            let (name, expr, is_field) = match member {
                Member::Field(f) => (&f.key, &f.value, true),
                Member::Let(l) => (&l.name, &l.value, false),
            };
            if local_names.iter().any(|n| n.text == name.text) {
                let what = if is_field { "field" } else { "name" };
                problems.push(
                    Problem::new(
                        name.span,
                        format!("{what} `{}` is set twice in {}", name.text, def.owner()),
                    )
                    .with_help("remove one of the two"),
                );
                continue;
            }
            local_names.push(name);
            // A value that failed to evaluate stays, as `Invalid`, so that it is neither reported
            // missing nor reported again where it is used.
            let value = eval(expr, &scope, problems).unwrap_or(Spanned {
                value: Value::Invalid,
                span: expr.span,
            });
            scope.bind(&name.text, value.value.clone());
            if is_field {
                own.push(ResolvedField {
                    key: name.clone(),
                    value,
                });
            }
        }
        own
    }
}
