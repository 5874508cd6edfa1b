//! A small TOML writer: sections of `key = value` lines in the order they were added.

/// A TOML value of the kinds job configs use.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum TomlValue {
    Str(String),
    Int(u64),
    Bool(bool),
    StrList(Vec<String>),
    /// A list of string lists, one inner list per line.
    StrLists(Vec<Vec<String>>),
}

impl TomlValue {
    fn render(&self) -> String {
        match self {
            TomlValue::Str(s) => quote(s),
            TomlValue::Int(n) => n.to_string(),
            TomlValue::Bool(b) => b.to_string(),
            TomlValue::StrList(items) => list(items),
            TomlValue::StrLists(lists) => {
                let lines: Vec<String> = lists
                    .iter()
                    .map(|items| format!("    {},\n", list(items)))
                    .collect();
                format!("[\n{}]", lines.concat())
            }
        }
    }
}

/// A one-line TOML array of strings.
fn list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| quote(s)).collect();
    format!("[{}]", quoted.join(", "))
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[derive(Default)]
pub(crate) struct TomlDoc {
    sections: Vec<(String, Vec<(String, TomlValue)>)>,
}

impl TomlDoc {
    /// A document whose sections render in this order, whenever keys are added to them.
    pub fn with_sections(names: &[&str]) -> Self {
        TomlDoc {
            sections: names.iter().map(|n| (n.to_string(), Vec::new())).collect(),
        }
    }

    /// Sets `key` in `section`, creating the section at the end if it is new.
    pub fn set(&mut self, section: &str, key: &str, value: TomlValue) {
        let index = match self.sections.iter().position(|(name, _)| name == section) {
            Some(i) => i,
            None => {
                self.sections.push((section.to_string(), Vec::new()));
                self.sections.len() - 1
            }
        };
        let entries = &mut self.sections[index].1;
        match entries.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => entries.push((key.to_string(), value)),
        }
    }

    pub fn str(&mut self, section: &str, key: &str, value: impl Into<String>) {
        self.set(section, key, TomlValue::Str(value.into()));
    }

    pub fn int(&mut self, section: &str, key: &str, value: u64) {
        self.set(section, key, TomlValue::Int(value));
    }

    pub fn bool(&mut self, section: &str, key: &str, value: bool) {
        self.set(section, key, TomlValue::Bool(value));
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let filled = self
            .sections
            .iter()
            .filter(|(_, entries)| !entries.is_empty());
        for (i, (name, entries)) in filled.enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push_str(&format!("[{name}]\n"));
            for (key, value) in entries {
                out.push_str(&format!("{key} = {}\n", value.render()));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_sections_in_order() {
        let mut doc = TomlDoc::default();
        doc.str("model", "name", "llama3");
        doc.int("training", "seq_len", 8192);
        doc.bool("model", "tied", false);
        doc.set(
            "model",
            "converters",
            TomlValue::StrList(vec!["float8".into()]),
        );
        doc.int("training", "seq_len", 4096);
        assert_eq!(
            doc.render(),
            "[model]\nname = \"llama3\"\ntied = false\nconverters = [\"float8\"]\n\n\
             [training]\nseq_len = 4096\n"
        );
    }

    #[test]
    fn declared_order_wins_and_empty_sections_are_skipped() {
        let mut doc = TomlDoc::with_sections(&["a", "b", "c"]);
        doc.bool("c", "x", true);
        doc.bool("a", "y", false);
        assert_eq!(doc.render(), "[a]\ny = false\n\n[c]\nx = true\n");
    }

    #[test]
    fn lists_of_lists_take_a_line_each() {
        let mut doc = TomlDoc::default();
        let lists = vec![vec!["a".into()], vec!["b".into(), "c".into()]];
        doc.set("p", "parts", TomlValue::StrLists(lists));
        assert_eq!(
            doc.render(),
            "[p]\nparts = [\n    [\"a\"],\n    [\"b\", \"c\"],\n]\n"
        );
    }

    #[test]
    fn quotes_escape() {
        assert_eq!(quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
    }
}
