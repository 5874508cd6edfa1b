//! An imported model and its rendering as a `model` block of the Tessel language.

use tessel_grammar::{MlpKind, ModelSpec, NormKind, PositionKind};

use super::error::ImportError;
use super::note::Note;
use crate::number_format::{short_count, thousands};

/// Comment lines are wrapped to this width.
const WRAP: usize = 96;

/// Words the language reserves; a model may not be named after one.
const RESERVED: &[&str] = &[
    "gpu", "cluster", "model", "train", "strategy", "search", "use", "let", "extends", "true",
    "false", "auto",
];

/// The result of `tessel import hf`: the model, where it came from, and what was approximated.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportedModel {
    pub spec: ModelSpec,
    /// The file name given to the importer, echoed in the header comment.
    pub source_name: String,
    /// Hugging Face `model_type` (or the one implied by `architectures`).
    pub model_type: String,
    /// First entry of `architectures`, when present.
    pub architecture: Option<String>,
    /// Remarks, in the order the importer made them.
    pub notes: Vec<Note>,
}

/// Whether `name` is a Tessel identifier that is not a reserved word.
pub fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let starts_well = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_');
    starts_well && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') && !RESERVED.contains(&name)
}

/// A model name from a file name: `…/Meta-Llama-3-8B/config.json` → `meta_llama_3_8b`,
/// `fixtures/gpt2.json` → `gpt2`; `fallback` when nothing usable is left.
pub(crate) fn name_from_source(source_name: &str, fallback: &str) -> String {
    let parts: Vec<&str> = source_name
        .split(['/', '\\'])
        .filter(|p| !p.is_empty())
        .collect();
    let stem_of = |part: &str| -> String {
        match part.rsplit_once('.') {
            Some((stem, _)) if !stem.is_empty() => stem.to_string(),
            _ => part.to_string(),
        }
    };
    let mut raw = parts.last().map(|p| stem_of(p)).unwrap_or_default();
    if raw == "config" {
        raw = if parts.len() >= 2 {
            parts[parts.len() - 2].to_string()
        } else {
            String::new()
        };
    }
    let mut name = String::new();
    for c in raw.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            name.push(c);
        } else if !name.ends_with('_') {
            name.push('_');
        }
    }
    let name = name.trim_matches('_').to_string();
    let name = match name.chars().next() {
        None => fallback.to_string(),
        Some(c) if c.is_ascii_digit() => format!("m_{name}"),
        Some(_) => name,
    };
    if RESERVED.contains(&name.as_str()) {
        format!("{name}_hf")
    } else {
        name
    }
}

/// Appends `text` as `#` comment lines, wrapped; continuation lines get `rest` after the `#`.
fn push_comment(out: &mut String, indent: &str, first: &str, rest: &str, text: &str) {
    let mut line = format!("{indent}#{first}");
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && line.len() + 1 + word.len() > WRAP {
            out.push_str(&line);
            out.push('\n');
            line = format!("{indent}#{rest}");
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
}

fn mlp_name(mlp: MlpKind) -> &'static str {
    match mlp {
        MlpKind::Gelu => "gelu",
        MlpKind::Swiglu => "swiglu",
    }
}

fn norm_name(norm: NormKind) -> &'static str {
    match norm {
        NormKind::Layernorm => "layernorm",
        NormKind::Rmsnorm => "rmsnorm",
    }
}

fn position_name(position: PositionKind) -> &'static str {
    match position {
        PositionKind::Rope => "rope",
        PositionKind::Learned => "learned",
    }
}

/// A float as the language writes it, always with a decimal point.
fn float_literal(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

impl ImportedModel {
    /// Gives the model another name (the CLI's `--name`).
    pub fn rename(&mut self, name: &str) -> Result<(), ImportError> {
        if !is_valid_name(name) {
            return Err(ImportError::InvalidName {
                name: name.to_string(),
            });
        }
        self.spec.name = name.to_string();
        Ok(())
    }

    /// The fields of the `model` block, in the language's order, as `(key, value)`.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let m = &self.spec;
        let mut fields = vec![
            ("layers", m.layers.to_string()),
            ("hidden", m.hidden.to_string()),
            ("heads", m.heads.to_string()),
            ("kv_heads", m.kv_heads.to_string()),
        ];
        if m.heads == 0 || !m.hidden.is_multiple_of(m.heads) || m.head_dim != m.hidden / m.heads {
            fields.push(("head_dim", m.head_dim.to_string()));
        }
        fields.extend([
            ("ffn_hidden", m.ffn_hidden.to_string()),
            ("vocab", m.vocab.to_string()),
            ("mlp", mlp_name(m.mlp).to_string()),
            ("norm", norm_name(m.norm).to_string()),
            ("tie_embeddings", m.tie_embeddings.to_string()),
            ("bias", m.bias.to_string()),
        ]);
        if let Some(len) = m.max_seq_len {
            fields.push(("max_seq_len", len.to_string()));
        }
        fields.push(("position", position_name(m.position).to_string()));
        if let Some(moe) = &m.moe {
            fields.push((
                "moe",
                format!(
                    "{{ experts = {}, top_k = {}, every = {}, expert_ffn_hidden = {}, \
                     shared_experts = {}, capacity_factor = {}, first_dense = {} }}",
                    moe.experts,
                    moe.top_k,
                    moe.every,
                    moe.expert_ffn_hidden,
                    moe.shared_experts,
                    float_literal(moe.capacity_factor),
                    moe.first_dense
                ),
            ));
        }
        fields
    }

    /// The model as a commented `model NAME { ... }` block. Deterministic: the same input
    /// gives the same bytes.
    pub fn to_tsl(&self) -> String {
        let fields = self.fields();
        let written: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
        let (field_notes, general_notes): (Vec<&Note>, Vec<&Note>) = self
            .notes
            .iter()
            .partition(|n| n.field.is_some_and(|f| written.contains(&f)));

        let mut out = String::new();
        push_comment(
            &mut out,
            "",
            " ",
            " ",
            &format!("Imported by `tessel import hf` from {}.", self.source_name),
        );
        let architecture = self
            .architecture
            .as_deref()
            .map(|a| format!(", architecture {a}"))
            .unwrap_or_default();
        push_comment(
            &mut out,
            "",
            " ",
            " ",
            &format!(
                "Hugging Face model_type \"{}\"{architecture}.",
                self.model_type
            ),
        );
        let count = self.spec.parameter_count();
        let count_text = if self.spec.moe.is_some() {
            format!(
                "Parameters by Tessel's count: {} total ({}), {} active per token ({}).",
                thousands(count.total),
                short_count(count.total),
                thousands(count.active),
                short_count(count.active)
            )
        } else {
            format!(
                "Parameters by Tessel's count: {} ({}).",
                thousands(count.total),
                short_count(count.total)
            )
        };
        push_comment(&mut out, "", " ", " ", &count_text);
        if !general_notes.is_empty() {
            out.push_str("#\n# Approximations:\n");
            for note in &general_notes {
                push_comment(&mut out, "", "   - ", "     ", &note.text);
            }
        }
        out.push_str(&format!("model {} {{\n", self.spec.name));
        let width = written.iter().map(|k| k.len()).max().unwrap_or(0);
        for (key, value) in &fields {
            for note in field_notes.iter().filter(|n| n.field == Some(*key)) {
                push_comment(&mut out, "  ", " ", " ", &note.text);
            }
            out.push_str(&format!("  {key:<width$} = {value}\n"));
        }
        out.push_str("}\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_sources() {
        assert_eq!(
            name_from_source("models/Meta-Llama-3-8B/config.json", "llama"),
            "meta_llama_3_8b"
        );
        assert_eq!(name_from_source("fixtures/gpt2-xl.json", "gpt2"), "gpt2_xl");
        assert_eq!(name_from_source("config.json", "mistral"), "mistral");
        assert_eq!(name_from_source("7b.json", "qwen2"), "m_7b");
        assert_eq!(name_from_source("model.json", "llama"), "model_hf");
        assert_eq!(name_from_source("-", "llama"), "llama");
    }

    #[test]
    fn valid_names() {
        assert!(is_valid_name("llama3_8b"));
        assert!(is_valid_name("_x"));
        assert!(!is_valid_name("3b"));
        assert!(!is_valid_name("a-b"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("model"));
    }

    #[test]
    fn comments_wrap_at_the_width() {
        let mut out = String::new();
        let text = "word ".repeat(60);
        push_comment(&mut out, "  ", " ", " ", &text);
        assert!(out.lines().count() > 2);
        assert!(out
            .lines()
            .all(|l| l.len() <= WRAP && l.starts_with("  # ")));
    }
}
