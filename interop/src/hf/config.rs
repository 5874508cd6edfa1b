//! Typed, error-reporting access to the fields of a parsed `config.json`.
//!
//! Hugging Face config classes give most fields a default; a saved `config.json` usually holds
//! them all. Shape fields are read as required (a missing one is an error naming it); fields
//! with an obvious class default are read as optional and defaulted by the caller.

use serde_json::{Map, Value};

use super::error::ImportError;

/// Larger models than this are not plausible inputs; the cap keeps every later loop bounded.
pub(crate) const MAX_LAYERS: u64 = 4096;

/// No width, head count or vocabulary of a real model comes near this; the cap keeps products
/// of a few dimensions inside `u64`.
pub(crate) const MAX_DIMENSION: u64 = 1 << 24;

pub(crate) struct HfConfig<'a> {
    fields: &'a Map<String, Value>,
    source_name: &'a str,
    model_type: String,
}

/// A short description of a JSON value for error messages.
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string \"{s}\""),
        Value::Array(_) => "a list".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

impl<'a> HfConfig<'a> {
    pub(crate) fn new(
        fields: &'a Map<String, Value>,
        source_name: &'a str,
        model_type: String,
    ) -> Self {
        HfConfig {
            fields,
            source_name,
            model_type,
        }
    }

    pub(crate) fn model_type(&self) -> &str {
        &self.model_type
    }

    pub(crate) fn source_name(&self) -> &str {
        self.source_name
    }

    /// The raw value of a field; `null` counts as absent.
    pub(crate) fn value(&self, field: &str) -> Option<&'a Value> {
        self.fields.get(field).filter(|v| !v.is_null())
    }

    pub(crate) fn missing(&self, field: &str) -> ImportError {
        ImportError::MissingField {
            source_name: self.source_name.to_string(),
            model_type: self.model_type.clone(),
            field: field.to_string(),
        }
    }

    pub(crate) fn wrong_type(&self, field: &str, expected: &'static str) -> ImportError {
        ImportError::WrongType {
            source_name: self.source_name.to_string(),
            field: field.to_string(),
            expected,
            found: self.value(field).map_or("null".to_string(), describe),
        }
    }

    pub(crate) fn unsupported(
        &self,
        field: &str,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> ImportError {
        ImportError::UnsupportedValue {
            source_name: self.source_name.to_string(),
            field: field.to_string(),
            value: value.into(),
            reason: reason.into(),
        }
    }

    /// A non-negative integer; integral floats such as `4096.0` are accepted.
    pub(crate) fn count(&self, field: &str) -> Result<Option<u64>, ImportError> {
        let Some(value) = self.value(field) else {
            return Ok(None);
        };
        if let Some(n) = value.as_u64() {
            return Ok(Some(n));
        }
        match value.as_f64() {
            Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= u64::MAX as f64 => Ok(Some(x as u64)),
            _ => Err(self.wrong_type(field, "a non-negative whole number")),
        }
    }

    /// An optional non-negative integer of at most [`MAX_DIMENSION`].
    pub(crate) fn small_count(&self, field: &str) -> Result<Option<u64>, ImportError> {
        match self.count(field)? {
            Some(n) if n > MAX_DIMENSION => Err(self.unsupported(
                field,
                n.to_string(),
                format!("it is implausibly large (more than {MAX_DIMENSION})"),
            )),
            other => Ok(other),
        }
    }

    /// A required positive integer of at most [`MAX_DIMENSION`].
    pub(crate) fn positive(&self, field: &str) -> Result<u64, ImportError> {
        self.positive_opt(field)?.ok_or_else(|| self.missing(field))
    }

    /// An optional positive integer of at most [`MAX_DIMENSION`] (absent or `null`: `None`).
    pub(crate) fn positive_opt(&self, field: &str) -> Result<Option<u64>, ImportError> {
        match self.length_opt(field)? {
            Some(n) if n > MAX_DIMENSION => Err(self.unsupported(
                field,
                n.to_string(),
                format!("it is implausibly large (more than {MAX_DIMENSION})"),
            )),
            other => Ok(other),
        }
    }

    /// An optional positive integer without an upper bound, for lengths that no count
    /// multiplies (the rotary models' `max_position_embeddings`).
    pub(crate) fn length_opt(&self, field: &str) -> Result<Option<u64>, ImportError> {
        match self.count(field)? {
            Some(0) => Err(self.unsupported(field, "0", "it must be at least 1")),
            other => Ok(other),
        }
    }

    /// The layer count, bounded so that every per-layer loop stays cheap.
    pub(crate) fn layers(&self, field: &str) -> Result<u64, ImportError> {
        let layers = self.positive(field)?;
        if layers > MAX_LAYERS {
            return Err(self.unsupported(
                field,
                layers.to_string(),
                format!("Tessel plans models of at most {MAX_LAYERS} layers"),
            ));
        }
        Ok(layers)
    }

    pub(crate) fn number(&self, field: &str) -> Result<Option<f64>, ImportError> {
        match self.value(field) {
            None => Ok(None),
            Some(value) => value
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong_type(field, "a number")),
        }
    }

    pub(crate) fn boolean(&self, field: &str) -> Result<Option<bool>, ImportError> {
        match self.value(field) {
            None => Ok(None),
            Some(value) => value
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong_type(field, "true or false")),
        }
    }

    pub(crate) fn string(&self, field: &str) -> Result<Option<&'a str>, ImportError> {
        match self.value(field) {
            None => Ok(None),
            Some(value) => value
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong_type(field, "a string")),
        }
    }

    /// A list of non-negative integers (absent gives an empty list).
    pub(crate) fn count_list(&self, field: &str) -> Result<Vec<u64>, ImportError> {
        let Some(value) = self.value(field) else {
            return Ok(Vec::new());
        };
        let items = value
            .as_array()
            .ok_or_else(|| self.wrong_type(field, "a list of whole numbers"))?;
        items
            .iter()
            .map(|item| {
                item.as_u64()
                    .ok_or_else(|| self.wrong_type(field, "a list of whole numbers"))
            })
            .collect()
    }
}
