//! Errors in a spec, located and rendered like a compiler's (without colours, so that output is
//! the same on every terminal and snapshots can compare it byte for byte).

use std::fmt;
use std::ops::Range;

use crate::source::{SourceMap, Span};

/// One error, found while parsing or checking, as the parser records it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Problem {
    /// `None` for errors about a whole file that could not be read.
    pub span: Option<Span>,
    pub message: String,
    pub help: Option<String>,
    /// Names the file when there is no span.
    pub file_name: Option<String>,
}

impl Problem {
    pub fn new(span: Span, message: impl Into<String>) -> Problem {
        Problem {
            span: Some(span),
            message: message.into(),
            help: None,
            file_name: None,
        }
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Problem {
        self.help = Some(help.into());
        self
    }

    pub fn with_optional_help(mut self, help: Option<String>) -> Problem {
        self.help = help;
        self
    }
}

/// A located error in a spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file's name as given on the command line, or as reached through `use` from it.
    pub file: String,
    /// 1-based; 0 when the error concerns the whole file (it could not be read).
    pub line: usize,
    /// 1-based, in characters.
    pub column: usize,
    /// Byte range in the file.
    pub span: Range<usize>,
    pub message: String,
    pub help: Option<String>,
    /// The source line the span starts on, tabs expanded, for rendering.
    source_line: String,
    /// Characters of `source_line` the underline covers.
    underline: Range<usize>,
}

/// Every error found in a spec, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }

    /// Locates `problems` in `sources`, sorted by file, position and message, without duplicates
    /// (an inherited field is checked once per block that inherits it).
    pub(crate) fn from_problems(mut problems: Vec<Problem>, sources: &SourceMap) -> Diagnostics {
        problems.sort();
        problems.dedup();
        Diagnostics(problems.into_iter().map(|p| locate(p, sources)).collect())
    }
}

fn locate(problem: Problem, sources: &SourceMap) -> Diagnostic {
    let Some(span) = problem.span else {
        return Diagnostic {
            file: problem.file_name.unwrap_or_default(),
            line: 0,
            column: 0,
            span: 0..0,
            message: problem.message,
            help: problem.help,
            source_line: String::new(),
            underline: 0..0,
        };
    };
    let file = sources.file(span.file);
    let (line, column) = file.line_column(span.start);
    let raw_line = file.line_text(span.start);
    // Underline within the first line of the span, at least one character wide.
    let line_start_offset = span.start - (column_bytes(raw_line, column - 1));
    let end_in_line = span
        .end
        .saturating_sub(line_start_offset)
        .min(raw_line.len());
    let end_column = raw_line
        .get(..end_in_line)
        .map_or(column - 1, |s| s.chars().count());
    let (source_line, underline) = expand_tabs(raw_line, column - 1, end_column.max(column));
    Diagnostic {
        file: file.name.clone(),
        line,
        column,
        span: span.start..span.end,
        message: problem.message,
        help: problem.help,
        source_line,
        underline,
    }
}

/// Bytes taken by the first `chars` characters of `line`.
fn column_bytes(line: &str, chars: usize) -> usize {
    line.char_indices()
        .nth(chars)
        .map_or(line.len(), |(i, _)| i)
}

/// The line with tabs as four spaces, and the character range `start..end` mapped onto it.
fn expand_tabs(line: &str, start: usize, end: usize) -> (String, Range<usize>) {
    let mut out = String::new();
    let (mut new_start, mut new_end) = (None, None);
    for (i, c) in line.chars().enumerate() {
        if i == start {
            new_start = Some(out.chars().count());
        }
        if i == end {
            new_end = Some(out.chars().count());
        }
        if c == '\t' {
            out.push_str("    ");
        } else {
            out.push(c);
        }
    }
    let len = out.chars().count();
    let s = new_start.unwrap_or(len);
    let e = new_end.unwrap_or(len).max(s + 1);
    (out, s..e)
}

impl Diagnostic {
    /// An error about a whole file rather than a place in it.
    pub(crate) fn whole_file(file: &str, message: String) -> Diagnostic {
        Diagnostic {
            file: file.to_string(),
            line: 0,
            column: 0,
            span: 0..0,
            message,
            help: None,
            source_line: String::new(),
            underline: 0..0,
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        if self.line == 0 {
            writeln!(f, " --> {}", self.file)?;
        } else {
            let gutter = " ".repeat(self.line.to_string().len());
            writeln!(f, "{gutter}--> {}:{}:{}", self.file, self.line, self.column)?;
            writeln!(f, "{gutter} |")?;
            writeln!(f, "{} | {}", self.line, self.source_line.trim_end())?;
            writeln!(
                f,
                "{gutter} | {}{}",
                " ".repeat(self.underline.start),
                "^".repeat(self.underline.end - self.underline.start)
            )?;
        }
        if let Some(help) = &self.help {
            writeln!(f, "  = help: {help}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SourceFile;

    fn sources(text: &str) -> SourceMap {
        let mut map = SourceMap::default();
        map.add(SourceFile {
            name: "x.tsl".into(),
            path: None,
            text: text.into(),
        });
        map
    }

    #[test]
    fn renders_location_line_and_underline() {
        let map = sources("cluster c {\n  gpu = H100-SXM\n}\n");
        let start = map.files[0].text.find("H100").unwrap();
        let problem = Problem::new(Span::new(0, start, start + 8), "unknown GPU `H100-SXM`")
            .with_help("did you mean `H100_SXM`?");
        let d = Diagnostics::from_problems(vec![problem], &map);
        assert_eq!(
            d.to_string(),
            "error: unknown GPU `H100-SXM`\n \
             --> x.tsl:2:9\n  |\n2 |   gpu = H100-SXM\n  |         ^^^^^^^^\n  \
             = help: did you mean `H100_SXM`?\n"
        );
    }

    #[test]
    fn tabs_and_empty_spans_still_underline() {
        let map = sources("\tx = \n");
        let end = map.files[0].text.len() - 1;
        let d = Diagnostics::from_problems(vec![Problem::new(Span::new(0, end, end), "m")], &map);
        assert_eq!(
            d.to_string(),
            "error: m\n --> x.tsl:1:6\n  |\n1 |     x =\n  |         ^\n"
        );
    }
}
