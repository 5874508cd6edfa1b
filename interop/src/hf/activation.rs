//! Hugging Face activation names and the MLP shape they imply.
//!
//! Tessel's `mlp` names a shape: `gelu` is two matrices (`h → ffn → h`), `swiglu` three (gate,
//! up, down). The activation function itself changes neither parameters nor matmul FLOPs, so a
//! known activation in an unusual position (ReLU in a two-matrix MLP, GELU in a gated one) is
//! imported with a note; an unknown name is an error, since it may hide a different shape.

use tessel_grammar::MlpKind;

use super::config::HfConfig;
use super::error::ImportError;
use super::note::Note;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ActivationFamily {
    Gelu,
    Silu,
    Relu,
}

/// Activation names of `transformers.activations.ACT2FN` this importer understands.
const KNOWN: &[(&str, ActivationFamily)] = &[
    ("gelu", ActivationFamily::Gelu),
    ("gelu_new", ActivationFamily::Gelu),
    ("gelu_fast", ActivationFamily::Gelu),
    ("gelu_pytorch_tanh", ActivationFamily::Gelu),
    ("gelu_accurate", ActivationFamily::Gelu),
    ("gelu_python", ActivationFamily::Gelu),
    ("quick_gelu", ActivationFamily::Gelu),
    ("silu", ActivationFamily::Silu),
    ("swish", ActivationFamily::Silu),
    ("relu", ActivationFamily::Relu),
];

fn family(name: &str) -> Option<ActivationFamily> {
    KNOWN
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, family)| *family)
}

fn unknown(config: &HfConfig, field: &str, name: &str) -> ImportError {
    let known: Vec<&str> = KNOWN.iter().map(|(n, _)| *n).collect();
    config.unsupported(
        field,
        format!("\"{name}\""),
        format!("unknown activation; known: {}", known.join(", ")),
    )
}

/// The MLP of a gated family (Llama, Mistral, Qwen, DeepSeek): three matrices whatever the
/// activation.
pub(crate) fn gated_mlp(
    config: &HfConfig,
    field: &str,
    default: &str,
    notes: &mut Vec<Note>,
) -> Result<MlpKind, ImportError> {
    let name = config.string(field)?.unwrap_or(default);
    match family(name) {
        None => Err(unknown(config, field, name)),
        Some(ActivationFamily::Silu) => Ok(MlpKind::Swiglu),
        Some(_) => {
            notes.push(Note::on(
                "mlp",
                format!(
                    "{field} = \"{name}\": a gated MLP with this activation has SwiGLU's three \
                     matrices, so it is written as swiglu"
                ),
            ));
            Ok(MlpKind::Swiglu)
        }
    }
}

/// The MLP of a two-matrix family (GPT-2, GPT-NeoX).
pub(crate) fn plain_mlp(
    config: &HfConfig,
    field: &str,
    default: &str,
    notes: &mut Vec<Note>,
) -> Result<MlpKind, ImportError> {
    let name = config.string(field)?.unwrap_or(default);
    match family(name) {
        None => Err(unknown(config, field, name)),
        Some(ActivationFamily::Gelu) => Ok(MlpKind::Gelu),
        Some(_) => {
            notes.push(Note::on(
                "mlp",
                format!(
                    "{field} = \"{name}\": a two-matrix MLP with this activation has the same \
                     shapes as Tessel's gelu MLP, so it is written as gelu"
                ),
            ));
            Ok(MlpKind::Gelu)
        }
    }
}
