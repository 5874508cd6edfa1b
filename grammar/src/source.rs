//! Source files and byte spans into them.

use std::path::PathBuf;

/// Index of a file in a [`SourceMap`].
pub type FileId = usize;

/// A byte range in one source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span {
    pub file: FileId,
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(file: FileId, start: usize, end: usize) -> Span {
        Span { file, start, end }
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span {
            file: self.file,
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// One loaded file: the name diagnostics print, where it lives, and its text.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// As given by the user, or joined onto the including file's directory for `use`.
    pub name: String,
    /// On-disk location, canonicalized, for `use` cycle detection and de-duplication. `None` for
    /// in-memory sources (the catalog, `load_str`).
    pub path: Option<PathBuf>,
    pub text: String,
}

impl SourceFile {
    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_column(&self, offset: usize) -> (usize, usize) {
        let offset = floor_char_boundary(&self.text, offset.min(self.text.len()));
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = self.text[line_start..offset].chars().count() + 1;
        (line, column)
    }

    /// The text of the line holding `offset`, without its newline.
    pub fn line_text(&self, offset: usize) -> &str {
        let offset = floor_char_boundary(&self.text, offset.min(self.text.len()));
        let start = self.text[..offset].rfind('\n').map_or(0, |i| i + 1);
        let end = self.text[offset..]
            .find('\n')
            .map_or(self.text.len(), |i| offset + i);
        self.text[start..end].trim_end_matches('\r')
    }
}

fn floor_char_boundary(text: &str, mut offset: usize) -> usize {
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

/// Every file a spec was read from, in the order they were loaded.
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    pub files: Vec<SourceFile>,
}

impl SourceMap {
    pub fn add(&mut self, file: SourceFile) -> FileId {
        self.files.push(file);
        self.files.len() - 1
    }

    pub fn file(&self, id: FileId) -> &SourceFile {
        &self.files[id]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_count_characters() {
        let file = SourceFile {
            name: "a.tsl".into(),
            path: None,
            text: "ab\n  µx = 1\nlast".into(),
        };
        assert_eq!(file.line_column(0), (1, 1));
        assert_eq!(file.line_column(3), (2, 1));
        // `x` comes after two spaces and a two-byte character.
        assert_eq!(file.line_column(7), (2, 4));
        assert_eq!(file.line_text(7), "  µx = 1");
        assert_eq!(file.line_column(file.text.len()), (3, 5));
        assert_eq!(file.line_text(file.text.len()), "last");
    }
}
