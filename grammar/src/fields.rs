//! Reading typed fields out of evaluated blocks and records, with the checks every field shares:
//! dimension, whole numbers, ranges, enum spellings, unknown and missing fields.

use crate::ast::{Name, ENCODER_PREFIX, POOL_PREFIX};
use crate::diagnostic::Problem;
use crate::eval::{format_number, RecordField, Spanned, Value};
use crate::source::Span;
use crate::suggest;
use crate::units::Dim;

/// A field after `extends` and evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedField {
    pub key: Name,
    pub value: Spanned,
}

impl From<&RecordField> for ResolvedField {
    fn from(f: &RecordField) -> ResolvedField {
        ResolvedField {
            key: f.key.clone(),
            value: f.value.clone(),
        }
    }
}

/// The fields of one block (or record), and where to report what is wrong with them.
pub struct Fields<'p> {
    /// "model `llama3_70b`", "`intra_node`": what the fields belong to, for messages.
    pub owner: String,
    /// Where a missing field is reported.
    pub anchor: Span,
    fields: Vec<ResolvedField>,
    pub problems: &'p mut Vec<Problem>,
}

impl<'p> Fields<'p> {
    pub fn new(
        owner: String,
        anchor: Span,
        fields: Vec<ResolvedField>,
        problems: &'p mut Vec<Problem>,
    ) -> Fields<'p> {
        Fields {
            owner,
            anchor,
            fields,
            problems,
        }
    }

    /// The fields of a record value, or an error when `value` is not a record.
    pub fn record<'q>(
        key: &str,
        value: &Spanned,
        example: &str,
        problems: &'q mut Vec<Problem>,
    ) -> Option<Fields<'q>> {
        match &value.value {
            Value::Record(fields) => Some(Fields::new(
                format!("`{key}`"),
                value.span,
                fields.iter().map(ResolvedField::from).collect(),
                problems,
            )),
            Value::Invalid => None,
            other => {
                problems.push(Problem::new(
                    value.span,
                    format!(
                        "`{key}` expects a record such as `{example}`, found {}",
                        other.describe()
                    ),
                ));
                None
            }
        }
    }

    pub fn get(&self, key: &str) -> Option<&Spanned> {
        self.fields
            .iter()
            .find(|f| f.key.text == key)
            .map(|f| &f.value)
    }

    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Reports `key` as missing, with an example of how to write it; unless a misspelt field
    /// stands for it, whose own error suggests `key`.
    pub fn missing(&mut self, key: &str, example: &str) {
        let misspelt = self
            .fields
            .iter()
            .any(|f| f.key.text != key && suggest::closest(&f.key.text, [key]).is_some());
        if misspelt {
            return;
        }
        self.problems.push(
            Problem::new(
                self.anchor,
                format!("{} is missing the field `{key}`", self.owner),
            )
            .with_help(format!("add `{key} = {example}`")),
        );
    }

    /// A part taken out with [`Fields::take_pools`] or [`Fields::take_encoders`] (`prefix` is
    /// its kind's): its name and its record, whose errors name it and the block it belongs to
    /// (`parent`, e.g. ``cluster `c` ``) and point at its header.
    pub fn part<'q, 'f>(
        field: &'f ResolvedField,
        prefix: &str,
        parent: &str,
        example: &str,
        problems: &'q mut Vec<Problem>,
    ) -> Option<(&'f str, Fields<'q>)> {
        let name = &field.key.text[prefix.len()..];
        let mut record = Fields::record(&field.key.text, &field.value, example, problems)?;
        record.owner = format!("{prefix}`{name}` of {parent}");
        record.anchor = field.key.span;
        Some((name, record))
    }

    /// Takes out the `pool NAME { … }` members (see [`POOL_PREFIX`]), in the order written.
    pub fn take_pools(&mut self) -> Vec<ResolvedField> {
        self.take_parts(POOL_PREFIX)
    }

    /// Takes out the `encoder NAME { … }` members (see [`ENCODER_PREFIX`]), in the order written.
    pub fn take_encoders(&mut self) -> Vec<ResolvedField> {
        self.take_parts(ENCODER_PREFIX)
    }

    fn take_parts(&mut self, prefix: &str) -> Vec<ResolvedField> {
        let (parts, rest) = std::mem::take(&mut self.fields)
            .into_iter()
            .partition(|f| f.key.text.starts_with(prefix));
        self.fields = rest;
        parts
    }

    /// Reports every field not in `known`, suggesting the closest known one.
    pub fn reject_unknown(&mut self, known: &[&str]) {
        for f in &self.fields {
            if f.key.text.starts_with(POOL_PREFIX) {
                self.problems.push(
                    Problem::new(
                        f.key.span,
                        format!(
                            "`{}` in {}: pools belong in a cluster",
                            f.key.text, self.owner
                        ),
                    )
                    .with_help("move the `pool` block into a `cluster { … }`"),
                );
            } else if f.key.text.starts_with(ENCODER_PREFIX) {
                self.problems.push(
                    Problem::new(
                        f.key.span,
                        format!(
                            "`{}` in {}: encoders belong in a model",
                            f.key.text, self.owner
                        ),
                    )
                    .with_help("move the `encoder` block into the `model { … }` it feeds"),
                );
            } else if !known.contains(&f.key.text.as_str()) {
                let help = suggest::did_you_mean(&f.key.text, known.iter().copied())
                    .unwrap_or_else(|| format!("the fields here are {}", list_names(known)));
                self.problems.push(
                    Problem::new(
                        f.key.span,
                        format!("unknown field `{}` in {}", f.key.text, self.owner),
                    )
                    .with_help(help),
                );
            }
        }
    }

    fn read<T>(
        &mut self,
        key: &str,
        convert: impl FnOnce(&str, &Spanned, &mut Vec<Problem>) -> Option<T>,
    ) -> Option<T> {
        let value = self.get(key)?.clone();
        if value.value == Value::Invalid {
            return None;
        }
        convert(key, &value, self.problems)
    }

    pub fn count(&mut self, key: &str, min: u64) -> Option<u64> {
        self.read(key, |k, v, p| to_count(k, v, min, p))
    }

    pub fn required_count(&mut self, key: &str, min: u64, example: &str) -> Option<u64> {
        if !self.has(key) {
            self.missing(key, example);
        }
        self.count(key, min)
    }

    /// A quantity of dimension `dim`, in base units; `positive` rejects zero.
    pub fn quantity(&mut self, key: &str, dim: Dim, positive: bool) -> Option<f64> {
        self.read(key, |k, v, p| to_quantity(k, v, dim, positive, p))
    }

    pub fn required_quantity(&mut self, key: &str, dim: Dim, positive: bool) -> Option<f64> {
        if !self.has(key) {
            self.missing(key, dim.example().trim_matches('`'));
        }
        self.quantity(key, dim, positive)
    }

    pub fn fraction(&mut self, key: &str) -> Option<f64> {
        self.read(key, to_fraction)
    }

    pub fn boolean(&mut self, key: &str) -> Option<bool> {
        self.read(key, to_bool)
    }

    pub fn choice<T: Copy>(&mut self, key: &str, options: &[(&str, T)]) -> Option<T> {
        self.read(key, |k, v, p| to_choice(k, v, options, p))
    }

    /// A bare name referring to a block, with its span.
    pub fn reference(&mut self, key: &str, what: &str) -> Option<Name> {
        self.read(key, |k, v, p| to_reference(k, v, what, p))
    }
}

/// `a`, `b` and `c`, each in backticks.
pub fn list_names(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The alternatives of an enum field: `a`, `b` or `c`.
fn list_alternatives(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

fn plain_number(key: &str, v: &Spanned, what: &str, problems: &mut Vec<Problem>) -> Option<f64> {
    match &v.value {
        Value::Quantity {
            value,
            dim: Dim::NUMBER,
        } => Some(*value),
        other => {
            problems.push(Problem::new(
                v.span,
                format!("`{key}` expects {what}, found {}", other.describe()),
            ));
            None
        }
    }
}

/// A whole number at least `min`.
pub fn to_count(key: &str, v: &Spanned, min: u64, problems: &mut Vec<Problem>) -> Option<u64> {
    let n = plain_number(key, v, "a whole number", problems)?;
    if n.fract() != 0.0 {
        problems.push(Problem::new(
            v.span,
            format!("`{key}` expects a whole number, found {}", format_number(n)),
        ));
        return None;
    }
    if n < min as f64 {
        problems.push(Problem::new(
            v.span,
            format!("`{key}` must be at least {min}, found {}", format_number(n)),
        ));
        return None;
    }
    if n >= 2f64.powi(53) {
        problems.push(Problem::new(
            v.span,
            format!("`{key}` is too large: {}", format_number(n)),
        ));
        return None;
    }
    Some(n as u64)
}

pub fn to_quantity(
    key: &str,
    v: &Spanned,
    dim: Dim,
    positive: bool,
    problems: &mut Vec<Problem>,
) -> Option<f64> {
    match &v.value {
        Value::Quantity { value, dim: found } if *found == dim => {
            if *value < 0.0 || (positive && *value == 0.0) {
                let bound = if positive { "positive" } else { "zero or more" };
                problems.push(Problem::new(v.span, format!("`{key}` must be {bound}")));
                None
            } else {
                Some(*value)
            }
        }
        Value::Quantity {
            dim: Dim::NUMBER, ..
        } => {
            problems.push(
                Problem::new(
                    v.span,
                    format!(
                        "`{key}` expects {} such as {}, found a number without a unit",
                        dim.describe(),
                        dim.example()
                    ),
                )
                .with_help(format!("write the unit, as in {}", dim.example())),
            );
            None
        }
        other => {
            problems.push(Problem::new(
                v.span,
                format!(
                    "`{key}` expects {} such as {}, found {}",
                    dim.describe(),
                    dim.example(),
                    other.describe()
                ),
            ));
            None
        }
    }
}

/// A number in [0, 1], written as a fraction or a percentage.
pub fn to_fraction(key: &str, v: &Spanned, problems: &mut Vec<Problem>) -> Option<f64> {
    let n = plain_number(key, v, "a fraction such as `0.5` or `50%`", problems)?;
    if !(0.0..=1.0).contains(&n) {
        problems.push(
            Problem::new(
                v.span,
                format!(
                    "`{key}` must be between 0 and 1, found {}",
                    format_number(n)
                ),
            )
            .with_help("write a fraction such as `0.5`, or a percentage such as `50%`"),
        );
        return None;
    }
    Some(n)
}

pub fn to_bool(key: &str, v: &Spanned, problems: &mut Vec<Problem>) -> Option<bool> {
    match &v.value {
        Value::Bool(b) => Some(*b),
        other => {
            let help = match other {
                Value::Ident(name) => suggest::did_you_mean(name, ["true", "false"]),
                _ => None,
            };
            problems.push(
                Problem::new(
                    v.span,
                    format!(
                        "`{key}` expects `true` or `false`, found {}",
                        other.describe()
                    ),
                )
                .with_optional_help(help),
            );
            None
        }
    }
}

pub fn to_choice<T: Copy>(
    key: &str,
    v: &Spanned,
    options: &[(&str, T)],
    problems: &mut Vec<Problem>,
) -> Option<T> {
    let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
    if let Value::Ident(name) = &v.value {
        if let Some((_, value)) = options.iter().find(|(n, _)| n == name) {
            return Some(*value);
        }
    }
    let help = match &v.value {
        Value::Ident(name) => suggest::did_you_mean(name, names.iter().copied()),
        _ => None,
    };
    problems.push(
        Problem::new(
            v.span,
            format!(
                "`{key}` expects {}, found {}",
                list_alternatives(&names),
                v.value.describe()
            ),
        )
        .with_optional_help(help),
    );
    None
}

pub fn to_reference(
    key: &str,
    v: &Spanned,
    what: &str,
    problems: &mut Vec<Problem>,
) -> Option<Name> {
    match &v.value {
        Value::Ident(name) => Some(Name {
            text: name.clone(),
            span: v.span,
        }),
        other => {
            problems.push(Problem::new(
                v.span,
                format!(
                    "`{key}` expects the name of {what}, found {}",
                    other.describe()
                ),
            ));
            None
        }
    }
}
