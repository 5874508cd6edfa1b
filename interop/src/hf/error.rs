//! What can go wrong when reading a Hugging Face `config.json`.

use std::fmt;

/// An import failure. Every variant names the source file and, where there is one, the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImportError {
    /// The file could not be read.
    Io { path: String, message: String },
    /// The text is not JSON.
    Json {
        source_name: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// The JSON is valid but its top level is not an object.
    NotAnObject { source_name: String, found: String },
    /// Neither `model_type` nor `architectures` says what the model is.
    MissingModelType { source_name: String },
    /// A `model_type` this importer does not know.
    UnsupportedModelType {
        source_name: String,
        model_type: String,
    },
    /// No `model_type`, and an `architectures` entry this importer does not know.
    UnsupportedArchitecture {
        source_name: String,
        architecture: String,
    },
    /// A field the model family needs is absent (or `null`).
    MissingField {
        source_name: String,
        model_type: String,
        field: String,
    },
    /// A field holds the wrong kind of JSON value.
    WrongType {
        source_name: String,
        field: String,
        expected: &'static str,
        found: String,
    },
    /// A field holds a value this importer cannot represent.
    UnsupportedValue {
        source_name: String,
        field: String,
        value: String,
        reason: String,
    },
    /// A model name that is not a Tessel identifier.
    InvalidName { name: String },
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportError::Io { path, message } => write!(f, "{path}: cannot read: {message}"),
            ImportError::Json {
                source_name,
                line,
                column,
                message,
            } => write!(
                f,
                "{source_name}:{line}:{column}: not valid JSON: {message}"
            ),
            ImportError::NotAnObject { source_name, found } => write!(
                f,
                "{source_name}: expected a JSON object (a Hugging Face config.json), found {found}"
            ),
            ImportError::MissingModelType { source_name } => write!(
                f,
                "{source_name}: neither `model_type` nor `architectures` is set, so the model \
                 family is unknown; supported model types: {}",
                super::SUPPORTED_MODEL_TYPES.join(", ")
            ),
            ImportError::UnsupportedModelType {
                source_name,
                model_type,
            } => write!(
                f,
                "{source_name}: unsupported model_type `{model_type}`; supported model types: {}",
                super::SUPPORTED_MODEL_TYPES.join(", ")
            ),
            ImportError::UnsupportedArchitecture {
                source_name,
                architecture,
            } => write!(
                f,
                "{source_name}: no `model_type`, and architecture `{architecture}` is not \
                 supported; supported architectures: {}",
                super::SUPPORTED_ARCHITECTURES
                    .iter()
                    .map(|(arch, _)| *arch)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            ImportError::MissingField {
                source_name,
                model_type,
                field,
            } => write!(
                f,
                "{source_name}: field `{field}` is required for model_type `{model_type}` but \
                 is missing"
            ),
            ImportError::WrongType {
                source_name,
                field,
                expected,
                found,
            } => write!(
                f,
                "{source_name}: field `{field}` should be {expected}, found {found}"
            ),
            ImportError::UnsupportedValue {
                source_name,
                field,
                value,
                reason,
            } => write!(
                f,
                "{source_name}: field `{field}` = {value} cannot be imported: {reason}"
            ),
            ImportError::InvalidName { name } => write!(
                f,
                "`{name}` is not a valid model name: use letters, digits and `_`, not starting \
                 with a digit"
            ),
        }
    }
}

impl std::error::Error for ImportError {}
