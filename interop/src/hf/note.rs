//! Comments an import attaches to its output: what was approximated or left out, and why.

/// One remark about an imported model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The Tessel field the remark is about; `None` for remarks about the model as a whole.
    pub field: Option<&'static str>,
    pub text: String,
}

impl Note {
    /// A remark printed above one field of the `model` block.
    pub fn on(field: &'static str, text: impl Into<String>) -> Self {
        Note {
            field: Some(field),
            text: text.into(),
        }
    }

    /// A remark printed in the header of the `model` block.
    pub fn general(text: impl Into<String>) -> Self {
        Note {
            field: None,
            text: text.into(),
        }
    }
}
