//! Pieces of a config that several families read the same way: attention heads, RoPE scaling,
//! sliding windows, partial biases.

use super::config::HfConfig;
use super::error::ImportError;
use super::note::Note;
use crate::number_format::thousands;

/// Query heads, key/value heads and per-head width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Heads {
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
}

/// Reads heads, optional KV heads (default: heads) and optional head width (default:
/// hidden / heads, which must then divide evenly).
pub(crate) fn read_heads(
    config: &HfConfig,
    hidden: u64,
    heads_field: &str,
    kv_field: Option<&str>,
    head_dim_field: Option<&str>,
) -> Result<Heads, ImportError> {
    let heads = config.positive(heads_field)?;
    let kv_heads = match kv_field {
        Some(field) => config.positive_opt(field)?.unwrap_or(heads),
        None => heads,
    };
    if let Some(field) = kv_field {
        if heads % kv_heads != 0 {
            return Err(config.unsupported(
                field,
                kv_heads.to_string(),
                format!("it must divide {heads_field} = {heads}"),
            ));
        }
    }
    let explicit = match head_dim_field {
        Some(field) => config.positive_opt(field)?,
        None => None,
    };
    let head_dim = match explicit {
        Some(d) => d,
        None => {
            if !hidden.is_multiple_of(heads) {
                return Err(config.unsupported(
                    heads_field,
                    heads.to_string(),
                    format!(
                        "the hidden size {hidden} is not divisible by it and the config gives no \
                         head_dim"
                    ),
                ));
            }
            hidden / heads
        }
    };
    Ok(Heads {
        heads,
        kv_heads,
        head_dim,
    })
}

/// RoPE scaling rescales positions; it has no parameters and no FLOPs, so it is noted and
/// dropped. An unreadable `rope_scaling` is still an error.
pub(crate) fn note_rope_scaling(
    config: &HfConfig,
    notes: &mut Vec<Note>,
) -> Result<(), ImportError> {
    let Some(value) = config.value("rope_scaling") else {
        return Ok(());
    };
    let record = value
        .as_object()
        .ok_or_else(|| config.wrong_type("rope_scaling", "an object or null"))?;
    let kind = record
        .get("rope_type")
        .or_else(|| record.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("unnamed");
    let factor = record
        .get("factor")
        .and_then(|v| v.as_f64())
        .map(|f| format!(", factor {f}"))
        .unwrap_or_default();
    notes.push(Note::on(
        "max_seq_len",
        format!(
            "rope_scaling ({kind}{factor}) stretches positions without parameters or FLOPs; \
             Tessel does not represent it"
        ),
    ));
    Ok(())
}

/// Sliding-window attention attends to a window instead of the whole prefix.
pub(crate) fn note_sliding_window(
    config: &HfConfig,
    notes: &mut Vec<Note>,
) -> Result<(), ImportError> {
    // Qwen2 configs carry a window that is off unless `use_sliding_window` is true.
    if config.value("use_sliding_window").is_some()
        && !config.boolean("use_sliding_window")?.unwrap_or(false)
    {
        return Ok(());
    }
    if let Some(window) = config.positive_opt("sliding_window")? {
        notes.push(Note::general(format!(
            "sliding-window attention (window {window}) is not modelled: attention scores are \
             costed over the whole sequence, which matches for sequences up to {window} tokens"
        )));
    }
    Ok(())
}

/// A model whose biases cover only some linear layers. Tessel's `bias` is all or nothing;
/// these models are written with `bias = false` and the left-out parameters counted.
pub(crate) fn note_partial_bias(notes: &mut Vec<Note>, which: &str, left_out: u64) {
    notes.push(Note::on(
        "bias",
        format!(
            "biases only on {which} ({} parameters in all); Tessel's `bias` covers every linear \
             layer, so they are left out",
            thousands(left_out)
        ),
    ));
}
