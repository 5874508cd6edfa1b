//! `tessel import hf`: a Hugging Face `config.json` to a Tessel `model` block.
//!
//! The family is chosen by `model_type` (or, without one, by the first `architectures` entry).
//! Each family module reads its own field names; what Tessel cannot represent exactly is either
//! approximated with a [`Note`] that says how and by how much, or, when it could change the
//! model's shape in ways the importer cannot judge (an unknown activation, say), refused with an
//! [`ImportError`] naming the field.

mod activation;
mod config;
mod deepseek;
mod error;
mod gpt2;
mod gpt_neox;
mod imported;
mod llama;
mod moe;
mod note;
mod shape;

pub use error::ImportError;
pub use imported::{is_valid_name, ImportedModel};
pub use note::Note;

use serde_json::Value;
use tessel_grammar::ModelSpec;

use config::{describe, HfConfig};

/// `model_type` values the importer reads.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "gpt2",
    "gpt_neox",
    "deepseek_v2",
    "deepseek_v3",
];

/// `architectures` entries recognised when a config has no `model_type`.
pub const SUPPORTED_ARCHITECTURES: &[(&str, &str)] = &[
    ("LlamaForCausalLM", "llama"),
    ("MistralForCausalLM", "mistral"),
    ("MixtralForCausalLM", "mixtral"),
    ("Qwen2ForCausalLM", "qwen2"),
    ("Qwen2MoeForCausalLM", "qwen2_moe"),
    ("GPT2LMHeadModel", "gpt2"),
    ("GPTNeoXForCausalLM", "gpt_neox"),
    ("DeepseekV2ForCausalLM", "deepseek_v2"),
    ("DeepseekV3ForCausalLM", "deepseek_v3"),
];

/// Models with more parameters than this are rejected: they are not real, and their counts
/// would not fit the integer arithmetic downstream.
const MAX_PARAMETERS: f64 = 1e15;

/// Reads a Hugging Face `config.json`. `source_name` is the file's name as the user gave it; it
/// appears in messages and in the output's header, and names the model (see
/// [`ImportedModel::rename`] to choose another name).
pub fn import_hf_config(json: &str, source_name: &str) -> Result<ImportedModel, ImportError> {
    let value: Value = serde_json::from_str(json).map_err(|e| ImportError::Json {
        source_name: source_name.to_string(),
        line: e.line(),
        column: e.column(),
        message: json_message(&e),
    })?;
    let fields = value.as_object().ok_or_else(|| ImportError::NotAnObject {
        source_name: source_name.to_string(),
        found: describe(&value),
    })?;

    let architecture = match fields.get("architectures") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => match items.first() {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(ImportError::WrongType {
                    source_name: source_name.to_string(),
                    field: "architectures".to_string(),
                    expected: "a list of strings",
                    found: format!("a list holding {}", describe(other)),
                })
            }
        },
        Some(other) => {
            return Err(ImportError::WrongType {
                source_name: source_name.to_string(),
                field: "architectures".to_string(),
                expected: "a list of strings",
                found: describe(other),
            })
        }
    };

    let model_type = match fields.get("model_type") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => match &architecture {
            None => {
                return Err(ImportError::MissingModelType {
                    source_name: source_name.to_string(),
                })
            }
            Some(arch) => SUPPORTED_ARCHITECTURES
                .iter()
                .find(|(a, _)| a == arch)
                .map(|(_, t)| t.to_string())
                .ok_or_else(|| ImportError::UnsupportedArchitecture {
                    source_name: source_name.to_string(),
                    architecture: arch.clone(),
                })?,
        },
        Some(other) => {
            return Err(ImportError::WrongType {
                source_name: source_name.to_string(),
                field: "model_type".to_string(),
                expected: "a string",
                found: describe(other),
            })
        }
    };
    if !SUPPORTED_MODEL_TYPES.contains(&model_type.as_str()) {
        return Err(ImportError::UnsupportedModelType {
            source_name: source_name.to_string(),
            model_type,
        });
    }

    let config = HfConfig::new(fields, source_name, model_type.clone());
    let name = imported::name_from_source(source_name, &model_type);
    let (spec, notes) = match model_type.as_str() {
        "gpt2" => gpt2::import(&config, name)?,
        "gpt_neox" => gpt_neox::import(&config, name)?,
        "deepseek_v2" | "deepseek_v3" => deepseek::import(&config, name)?,
        _ => llama::import(&config, name)?,
    };
    check_size(&config, &spec)?;
    Ok(ImportedModel {
        spec,
        source_name: source_name.to_string(),
        model_type,
        architecture,
        notes,
    })
}

/// Reads and imports a `config.json` file; the path as given is the source name.
pub fn import_hf_file(path: &std::path::Path) -> Result<ImportedModel, ImportError> {
    let source_name = path.display().to_string();
    let json = std::fs::read_to_string(path).map_err(|e| ImportError::Io {
        path: source_name.clone(),
        message: e.to_string(),
    })?;
    import_hf_config(&json, &source_name)
}

/// serde_json's message without its trailing " at line L column C" (the error carries those).
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// The parameter count in floating point, term by term as `ModelSpec::parameter_count` adds
/// it, so that an absurd config is refused before integer arithmetic could overflow.
fn estimated_parameters(m: &ModelSpec) -> f64 {
    let h = m.hidden as f64;
    let matrices = |ffn: u64| {
        let n = match m.mlp {
            tessel_grammar::MlpKind::Gelu => 2.0,
            tessel_grammar::MlpKind::Swiglu => 3.0,
        };
        n * h * ffn as f64 + 2.0 * ffn as f64 + h
    };
    let attention = 2.0 * h * (m.heads * m.head_dim) as f64
        + 2.0 * h * (m.kv_heads * m.head_dim) as f64
        + 4.0 * h
        + 2.0 * (m.heads + m.kv_heads) as f64 * m.head_dim as f64;
    let positions = m.max_seq_len.unwrap_or(0) as f64 * h;
    let embeddings = 2.0 * m.vocab as f64 * h + positions + 2.0 * h;
    let per_block_mlp = match &m.moe {
        None => matrices(m.ffn_hidden),
        Some(moe) => {
            (moe.experts + moe.shared_experts) as f64 * matrices(moe.expert_ffn_hidden)
                + h * moe.experts as f64
                + matrices(m.ffn_hidden)
        }
    };
    embeddings + m.layers as f64 * (attention + per_block_mlp)
}

fn check_size(config: &HfConfig, spec: &ModelSpec) -> Result<(), ImportError> {
    let estimate = estimated_parameters(spec);
    if estimate > MAX_PARAMETERS {
        return Err(ImportError::UnsupportedValue {
            source_name: config.source_name().to_string(),
            field: if config.model_type() == "gpt2" {
                "n_embd"
            } else {
                "hidden_size"
            }
            .to_string(),
            value: spec.hidden.to_string(),
            reason: format!(
                "with the other dimensions it gives about {estimate:.1e} parameters, beyond \
                 anything Tessel plans (at most {MAX_PARAMETERS:.0e})"
            ),
        });
    }
    Ok(())
}
