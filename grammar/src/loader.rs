//! Reading a spec and every file it `use`s, depth first, each file once.

use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use crate::ast::{Block, Item, Let};
use crate::diagnostic::Problem;
use crate::parser::parse_file;
use crate::source::{FileId, SourceFile, SourceMap, Span};

/// The embedded catalog's file name in diagnostics.
pub const CATALOG_NAME: &str = "<catalog>";
const CATALOG: &str = include_str!("../catalog/gpus.tsl");

/// One top-level item, with the file it came from.
pub enum Entry {
    Let(FileId, Let),
    Block(FileId, Block),
}

/// Every parsed file of a spec: the catalog first, then the root file and what it uses.
pub struct Loaded {
    pub sources: SourceMap,
    /// Top-level `let`s and blocks in load order: a used file's items come where its `use` is.
    pub entries: Vec<Entry>,
    pub problems: Vec<Problem>,
}

impl Loaded {
    fn new() -> Loaded {
        let mut loaded = Loaded {
            sources: SourceMap::default(),
            entries: Vec::new(),
            problems: Vec::new(),
        };
        let id = loaded.sources.add(SourceFile {
            name: CATALOG_NAME.into(),
            path: None,
            text: CATALOG.into(),
        });
        // The catalog is the same for every spec: parse it once per process.
        static CATALOG_ITEMS: OnceLock<(Vec<Item>, Vec<Problem>)> = OnceLock::new();
        let (items, problems) = CATALOG_ITEMS.get_or_init(|| parse_file(id, CATALOG));
        loaded.problems.extend(problems.iter().cloned());
        for item in items {
            match item.clone() {
                Item::Let(l) => loaded.entries.push(Entry::Let(id, l)),
                Item::Block(b) => loaded.entries.push(Entry::Block(id, b)),
                // The catalog uses nothing.
                Item::Use { .. } => {}
            }
        }
        loaded
    }

    /// Loads the file at `path`; `path` as given is its name in diagnostics.
    pub fn from_path(path: &Path) -> Loaded {
        let mut loaded = Loaded::new();
        let name = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let id = loaded.sources.add(SourceFile {
                    name,
                    path: path.canonicalize().ok(),
                    text,
                });
                let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
                let mut stack = vec![id];
                loaded.parse(id, &dir, &mut stack);
            }
            Err(error) => loaded.problems.push(Problem {
                span: None,
                message: format!("cannot read `{name}`: {}", describe_io_error(&error)),
                help: None,
                file_name: Some(name),
            }),
        }
        loaded
    }

    /// Loads `text` as a file named `name`; its `use`s are relative to the current directory.
    pub fn from_str(name: &str, text: &str) -> Loaded {
        let mut loaded = Loaded::new();
        let id = loaded.sources.add(SourceFile {
            name: name.into(),
            path: None,
            text: text.into(),
        });
        let mut stack = vec![id];
        loaded.parse(id, Path::new(""), &mut stack);
        loaded
    }

    /// Parses file `id` (already in the source map), following its `use`s. `dir` is the
    /// directory its `use` paths are relative to, as the user would write it; `stack` holds the
    /// files being loaded, outermost first, for cycle reports.
    fn parse(&mut self, id: FileId, dir: &Path, stack: &mut Vec<FileId>) {
        let text = self.sources.file(id).text.clone();
        let (items, problems) = parse_file(id, &text);
        self.problems.extend(problems);
        for item in items {
            match item {
                Item::Let(l) => self.entries.push(Entry::Let(id, l)),
                Item::Block(b) => self.entries.push(Entry::Block(id, b)),
                Item::Use { path, span } => self.use_file(&path, span, dir, stack),
            }
        }
    }

    fn use_file(&mut self, relative: &str, span: Span, dir: &Path, stack: &mut Vec<FileId>) {
        if relative.is_empty() {
            self.problems.push(Problem::new(
                span,
                "`use` needs a file name, such as `\"clusters/dgx-h100.tsl\"`",
            ));
            return;
        }
        let joined = normalize(&dir.join(relative));
        let name = joined.display().to_string();
        let canonical = match joined.canonicalize() {
            Ok(c) => c,
            Err(error) => {
                self.problems.push(Problem::new(
                    span,
                    format!("cannot read `{name}`: {}", describe_io_error(&error)),
                ));
                return;
            }
        };
        if let Some(position) = stack
            .iter()
            .position(|&f| self.sources.file(f).path.as_ref() == Some(&canonical))
        {
            let mut chain: Vec<String> = stack[position..]
                .iter()
                .map(|&f| format!("`{}`", self.sources.file(f).name))
                .collect();
            chain.push(format!("`{name}`"));
            self.problems.push(
                Problem::new(span, format!("`use` cycle: {}", chain.join(" uses ")))
                    .with_help("remove one of these `use` lines; each file is read once"),
            );
            return;
        }
        if self
            .sources
            .files
            .iter()
            .any(|f| f.path.as_ref() == Some(&canonical))
        {
            // Already loaded through another `use`: its blocks are already in.
            return;
        }
        let text = match std::fs::read_to_string(&joined) {
            Ok(text) => text,
            Err(error) => {
                self.problems.push(Problem::new(
                    span,
                    format!("cannot read `{name}`: {}", describe_io_error(&error)),
                ));
                return;
            }
        };
        let id = self.sources.add(SourceFile {
            name,
            path: Some(canonical),
            text,
        });
        let sub_dir = joined.parent().unwrap_or(Path::new("")).to_path_buf();
        stack.push(id);
        self.parse(id, &sub_dir, stack);
        stack.pop();
    }
}

/// `a/./b/../c` → `a/c`, without touching the file system, keeping leading `..`.
fn normalize(path: &Path) -> PathBuf {
    let mut out: Vec<Component> = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir) => {}
                _ => out.push(c),
            },
            _ => out.push(c),
        }
    }
    out.iter().collect()
}

/// The same words on every platform, without OS error numbers.
fn describe_io_error(error: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::NotFound => "no such file".into(),
        ErrorKind::PermissionDenied => "permission denied".into(),
        ErrorKind::IsADirectory => "it is a directory".into(),
        ErrorKind::InvalidData => "it is not UTF-8 text".into(),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_lexically() {
        assert_eq!(
            normalize(Path::new("specs/./clusters/../a.tsl")),
            PathBuf::from("specs/a.tsl")
        );
        assert_eq!(
            normalize(Path::new("../x/a.tsl")),
            PathBuf::from("../x/a.tsl")
        );
        assert_eq!(normalize(Path::new("a.tsl")), PathBuf::from("a.tsl"));
    }
}
