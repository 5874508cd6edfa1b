//! Text to syntax tree, with pest. No pest type leaves this module.
//!
//! Error recovery: pest stops at the first syntax error, so a file is first cut into chunks, one
//! per top-level item (a line that starts a block header, a `use`, or a top-level `let`), and
//! each chunk is parsed on its own. A syntax error then costs one block, and the errors of every
//! other block are still reported.

use pest::error::{ErrorVariant, InputLocation};
use pest::iterators::Pair;
use pest::Parser;
use pest_derive::Parser;

use crate::ast::{
    BinaryOp, Block, Expr, ExprKind, Field, Item, Let, Member, Name, ENCODER_PREFIX, POOL_PREFIX,
};
use crate::diagnostic::Problem;
use crate::source::{FileId, Span};

#[derive(Parser)]
#[grammar = "tessel.pest"]
struct TesselParser;

/// Brackets deeper than this are refused before parsing, so that no input can exhaust the stack.
const MAX_NESTING: usize = 32;

/// Parses a whole file. Items of chunks that parsed are returned even when others did not.
pub fn parse_file(file: FileId, text: &str) -> (Vec<Item>, Vec<Problem>) {
    let mut items = Vec::new();
    let mut problems = Vec::new();
    for (start, end) in chunks(text) {
        let chunk = &text[start..end];
        if let Some(offset) = too_deep(chunk) {
            let at = start + offset;
            problems.push(Problem::new(
                Span::new(file, at, at + 1),
                format!("brackets nested more than {MAX_NESTING} deep"),
            ));
            continue;
        }
        match TesselParser::parse(Rule::items, chunk) {
            Ok(mut pairs) => {
                let builder = Builder {
                    file,
                    offset: start,
                };
                if let Some(root) = pairs.next() {
                    for pair in root.into_inner() {
                        if let Some(item) = builder.item(pair) {
                            items.push(item);
                        }
                    }
                }
            }
            Err(error) => problems.push(syntax_problem(file, text, (start, end), &error)),
        }
    }
    (items, problems)
}

/// Byte ranges of the top-level items of `text`; together they cover it.
fn chunks(text: &str) -> Vec<(usize, usize)> {
    let mut starts = vec![0];
    let mut depth: i64 = 0;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if offset > 0 && starts_item(line, depth) {
            starts.push(offset);
            depth = 0;
        }
        depth += bracket_balance(line);
        offset += line.len();
    }
    starts.push(text.len());
    starts.windows(2).map(|w| (w[0], w[1])).collect()
}

/// Whether a line begins a top-level item: `use "..."`, a `let` outside any block, or a block
/// header `WORD [WORD] [extends WORD] {` (but not a `pool` or `encoder` header inside a block). A field line
/// `key = value` never does.
fn starts_item(line: &str, depth: i64) -> bool {
    let code = line.split('#').next().unwrap_or("").trim_start();
    let word_len = code
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .unwrap_or(code.len());
    let word = &code[..word_len];
    if !word.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        return false;
    }
    let rest = code[word_len..].trim_start();
    match word {
        "use" => code[word_len..].starts_with(|c: char| c.is_whitespace() || c == '"'),
        "let" => depth <= 0,
        // A pool inside a cluster, an encoder inside a model: members, not blocks of their own.
        "pool" | "encoder" if depth > 0 => false,
        _ => {
            rest.starts_with('{')
                || (rest.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && rest.contains('{'))
        }
    }
}

/// Opening minus closing brackets on a line, outside comments and strings.
fn bracket_balance(line: &str) -> i64 {
    let mut balance = 0;
    let mut in_string = false;
    for c in line.chars() {
        match c {
            '"' => in_string = !in_string,
            '#' if !in_string => break,
            '{' | '[' | '(' if !in_string => balance += 1,
            '}' | ']' | ')' if !in_string => balance -= 1,
            _ => {}
        }
    }
    balance
}

/// The offset of the first bracket nested deeper than [`MAX_NESTING`], if any.
fn too_deep(chunk: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut in_comment = false;
    for (i, c) in chunk.char_indices() {
        match c {
            '\n' => {
                in_comment = false;
                in_string = false;
            }
            _ if in_comment => {}
            '"' => in_string = !in_string,
            '#' if !in_string => in_comment = true,
            '{' | '[' | '(' if !in_string => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some(i);
                }
            }
            '}' | ']' | ')' if !in_string => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

fn syntax_problem(
    file: FileId,
    text: &str,
    (chunk_start, chunk_end): (usize, usize),
    error: &pest::error::Error<Rule>,
) -> Problem {
    let at = chunk_start
        + match error.location {
            InputLocation::Pos(p) => p,
            InputLocation::Span((s, _)) => s,
        };
    let (found, found_len) = if at == chunk_end && at < text.len() {
        // The chunk was cut where the next block starts: this one was never closed.
        ("the next block".to_string(), describe_found(&text[at..]).1)
    } else {
        describe_found(&text[at..])
    };
    let mut expected = match &error.variant {
        ErrorVariant::ParsingError { positives, .. } => expected_phrase(positives),
        ErrorVariant::CustomError { message } => message.clone(),
    };
    if found == "the next block" && expected.ends_with("`}`") {
        expected = "`}` to close this block".to_string();
    }
    let help = if found == "`:`" && expected.contains("`=`") {
        Some("fields are written `key = value`".to_string())
    } else if (found == "`-`" && expected.contains("`{`"))
        || found.chars().nth(1).is_some_and(|c| !c.is_ascii())
    {
        Some("names are made of ASCII letters, digits and `_`".to_string())
    } else if expected.contains("`]`") && (found.starts_with("the end") || found == "`}`") {
        Some("close the list with `]`".to_string())
    } else if expected.contains("`}`")
        && (found == "the end of the file" || found == "the next block")
    {
        Some("close the block with `}`".to_string())
    } else if found == "`=`" && expected.contains("`extends`") {
        Some("fields go inside a block, as in `model NAME { key = value }`".to_string())
    } else if found == "`\"`" {
        Some("a quoted path ends with `\"` on the same line".to_string())
    } else {
        None
    };
    Problem::new(
        Span::new(file, at, at + found_len),
        format!("expected {expected}, found {found}"),
    )
    .with_optional_help(help)
}

/// Names what starts `rest`, and how many bytes to underline.
fn describe_found(rest: &str) -> (String, usize) {
    let Some(c) = rest.chars().next() else {
        return ("the end of the file".into(), 0);
    };
    if c == '\n' || c == '\r' {
        return ("the end of the line".into(), 0);
    }
    let word_len = if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
        rest.find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '.'))
            .unwrap_or(rest.len())
    } else {
        c.len_utf8()
    };
    (format!("`{}`", &rest[..word_len]), word_len)
}

/// What the parser would have accepted, in the language's words.
fn expected_phrase(positives: &[Rule]) -> String {
    let has = |r: Rule| positives.contains(&r);
    let mut phrases: Vec<&str> = Vec::new();
    let value_rules = [
        Rule::expr,
        Rule::arith,
        Rule::term,
        Rule::unary,
        Rule::neg,
        Rule::number,
        Rule::percent,
        Rule::quantity,
        Rule::boolean,
        Rule::list,
        Rule::record,
        Rule::paren,
        Rule::lparen,
        Rule::lbracket,
    ];
    // pest reports the innermost tokens tried: `kw_use` means an item could start here, `kw_let`
    // with a bare name a block member, `kw_extends` the rest of a block header.
    let mut name_explained = false;
    if has(Rule::kw_use) || has(Rule::use_item) || has(Rule::block) || has(Rule::block_kind) {
        phrases.push("a block such as `model NAME { ... }`, `use` or `let`");
        name_explained = true;
    } else if has(Rule::field) || (has(Rule::kw_let) && has(Rule::ident)) {
        phrases.push("a field name");
        name_explained = true;
    } else if has(Rule::let_item) {
        phrases.push("`let`");
    }
    if has(Rule::kw_extends) || has(Rule::parent) {
        if has(Rule::ident) || has(Rule::block_name) {
            phrases.push("a block name");
            name_explained = true;
        }
        phrases.push("`extends`");
    } else if has(Rule::block_name) {
        phrases.push("a block name");
    }
    if has(Rule::ident) && !name_explained {
        phrases.push("a name");
    }
    if has(Rule::eq) {
        phrases.push("`=`");
    }
    if value_rules.iter().any(|&r| has(r)) {
        phrases.retain(|p| *p != "a name");
        phrases.push("a value");
    }
    if has(Rule::string) && !phrases.contains(&"a value") {
        phrases.push("a quoted path");
    }
    if has(Rule::body) || has(Rule::lbrace) {
        phrases.push("`{`");
    }
    // Between items, and before a block's `{`, a line break is allowed but never the fix.
    let item_or_brace = phrases
        .iter()
        .any(|p| p.starts_with("a block such") || *p == "`{`");
    if !item_or_brace {
        // Inside brackets a line break is allowed but never what is missing.
        if has(Rule::newline) && !has(Rule::rbracket) && !has(Rule::rparen) {
            phrases.push("a new line");
        }
        if has(Rule::semicolon) {
            phrases.push("`;`");
        }
        if has(Rule::comma) {
            phrases.push("`,`");
        }
    }
    if has(Rule::rbrace) {
        phrases.push("`}`");
    }
    if has(Rule::rbracket) {
        phrases.push("`]`");
    }
    if has(Rule::rparen) {
        phrases.push("`)`");
    }
    if has(Rule::EOI) && phrases.is_empty() {
        phrases.push("the end of the file");
    }
    if has(Rule::unit) && phrases.is_empty() {
        phrases.push("a unit");
    }
    if phrases.is_empty() && (has(Rule::add_op) || has(Rule::mul_op) || has(Rule::range_op)) {
        phrases.push("an operator");
    }
    if phrases.is_empty() {
        phrases.push("something else");
    }
    join_alternatives(&phrases)
}

fn join_alternatives(phrases: &[&str]) -> String {
    match phrases {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// Turns pest pairs of one chunk into syntax tree nodes, shifting spans by the chunk's offset.
struct Builder {
    file: FileId,
    offset: usize,
}

impl Builder {
    fn span(&self, pair: &Pair<Rule>) -> Span {
        let s = pair.as_span();
        Span::new(self.file, self.offset + s.start(), self.offset + s.end())
    }

    fn name(&self, pair: Pair<Rule>) -> Name {
        Name {
            text: pair.as_str().to_string(),
            span: self.span(&pair),
        }
    }

    fn item(&self, pair: Pair<Rule>) -> Option<Item> {
        match pair.as_rule() {
            Rule::use_item => {
                let string = pair.into_inner().find(|p| p.as_rule() == Rule::string)?;
                let span = self.span(&string);
                let path = string.into_inner().next().map_or("", |p| p.as_str());
                Some(Item::Use {
                    path: path.to_string(),
                    span,
                })
            }
            Rule::let_item => Some(Item::Let(self.let_item(pair)?)),
            Rule::block => Some(Item::Block(self.block(pair)?)),
            _ => None,
        }
    }

    fn let_item(&self, pair: Pair<Rule>) -> Option<Let> {
        let mut inner = pair.into_inner().filter(|p| p.as_rule() != Rule::kw_let);
        let name = self.name(inner.next()?);
        let value = self.expr(inner.find(|p| p.as_rule() == Rule::expr)?)?;
        Some(Let { name, value })
    }

    fn block(&self, pair: Pair<Rule>) -> Option<Block> {
        let mut kind = None;
        let mut name = None;
        let mut parent = None;
        let mut members = Vec::new();
        let mut header: Option<Span> = None;
        for p in pair.into_inner() {
            let span = self.span(&p);
            match p.as_rule() {
                Rule::block_kind => {
                    header = Some(span);
                    kind = Some(self.name(p.into_inner().next()?));
                }
                Rule::block_name => {
                    header = header.map(|h| h.to(span));
                    name = Some(self.name(p.into_inner().next()?));
                }
                Rule::parent => {
                    header = header.map(|h| h.to(span));
                    let ident = p.into_inner().find(|q| q.as_rule() == Rule::ident)?;
                    parent = Some(self.name(ident));
                }
                Rule::body => {
                    for m in p.into_inner() {
                        match m.as_rule() {
                            Rule::field => members.push(Member::Field(self.field(m)?)),
                            Rule::let_item => members.push(Member::Let(self.let_item(m)?)),
                            Rule::part_block => members.push(Member::Field(self.part_block(m)?)),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Some(Block {
            kind: kind?,
            name,
            parent,
            members,
            header: header?,
        })
    }

    fn field(&self, pair: Pair<Rule>) -> Option<Field> {
        let mut inner = pair.into_inner();
        let key = self.name(inner.next()?);
        let value = self.expr(inner.find(|p| p.as_rule() == Rule::expr)?)?;
        Some(Field { key, value })
    }

    /// `pool NAME { … }` (`encoder NAME { … }`) as the field `pool NAME` (`encoder NAME`) whose
    /// value is the record, so that parts inherit, evaluate and report like any other field.
    fn part_block(&self, pair: Pair<Rule>) -> Option<Field> {
        let mut inner = pair.into_inner();
        let keyword = inner.next()?;
        let prefix = if keyword.as_rule() == Rule::kw_encoder {
            ENCODER_PREFIX
        } else {
            POOL_PREFIX
        };
        let keyword = self.span(&keyword);
        let name = self.name(inner.next()?);
        let value = self.expr(inner.find(|p| p.as_rule() == Rule::record)?)?;
        Some(Field {
            key: Name {
                text: format!("{prefix}{}", name.text),
                span: keyword.to(name.span),
            },
            value,
        })
    }

    fn expr(&self, pair: Pair<Rule>) -> Option<Expr> {
        let span = self.span(&pair);
        match pair.as_rule() {
            Rule::expr => {
                let mut parts = pair.into_inner().filter(|p| p.as_rule() == Rule::arith);
                let low = self.expr(parts.next()?)?;
                match parts.next() {
                    None => Some(low),
                    Some(high) => Some(Expr {
                        kind: ExprKind::Range(Box::new(low), Box::new(self.expr(high)?)),
                        span,
                    }),
                }
            }
            Rule::arith | Rule::term => {
                let mut first = None;
                let mut rest = Vec::new();
                let mut op = None;
                for p in pair.into_inner() {
                    match p.as_rule() {
                        Rule::add_op | Rule::mul_op => {
                            op = Some(match p.as_str() {
                                "+" => BinaryOp::Add,
                                "-" => BinaryOp::Sub,
                                "*" => BinaryOp::Mul,
                                _ => BinaryOp::Div,
                            })
                        }
                        Rule::newline => {}
                        _ => {
                            let e = self.expr(p)?;
                            match op.take() {
                                None => first = Some(e),
                                Some(o) => rest.push((o, e)),
                            }
                        }
                    }
                }
                let first = first?;
                if rest.is_empty() {
                    Some(first)
                } else {
                    Some(Expr {
                        kind: ExprKind::Chain {
                            first: Box::new(first),
                            rest,
                        },
                        span,
                    })
                }
            }
            Rule::unary => {
                let mut negations = 0;
                let mut atom = None;
                for p in pair.into_inner() {
                    if p.as_rule() == Rule::neg {
                        negations += 1;
                    } else {
                        atom = Some(self.expr(p)?);
                    }
                }
                let atom = atom?;
                if negations % 2 == 1 {
                    Some(Expr {
                        kind: ExprKind::Neg(Box::new(atom)),
                        span,
                    })
                } else {
                    Some(atom)
                }
            }
            Rule::number => Some(Expr {
                kind: ExprKind::Number(parse_number(pair.as_str())),
                span,
            }),
            Rule::percent => {
                let number = pair.into_inner().next()?;
                Some(Expr {
                    kind: ExprKind::Percent(parse_number(number.as_str()) / 100.0),
                    span,
                })
            }
            Rule::quantity => {
                let mut inner = pair.into_inner();
                let value = parse_number(inner.next()?.as_str());
                let unit = self.name(inner.next()?);
                Some(Expr {
                    kind: ExprKind::Quantity { value, unit },
                    span,
                })
            }
            Rule::boolean => Some(Expr {
                kind: ExprKind::Bool(pair.as_str() == "true"),
                span,
            }),
            Rule::string => Some(Expr {
                kind: ExprKind::String(
                    pair.into_inner()
                        .next()
                        .map_or("", |p| p.as_str())
                        .to_string(),
                ),
                span,
            }),
            Rule::ident => Some(Expr {
                kind: ExprKind::Ident(pair.as_str().to_string()),
                span,
            }),
            Rule::list => {
                let mut elements = Vec::new();
                for p in pair.into_inner() {
                    if p.as_rule() == Rule::expr {
                        elements.push(self.expr(p)?);
                    }
                }
                Some(Expr {
                    kind: ExprKind::List(elements),
                    span,
                })
            }
            Rule::record => {
                let mut fields = Vec::new();
                for p in pair.into_inner() {
                    if p.as_rule() == Rule::field {
                        fields.push(self.field(p)?);
                    }
                }
                Some(Expr {
                    kind: ExprKind::Record(fields),
                    span,
                })
            }
            Rule::paren => {
                let inner = pair.into_inner().find(|p| p.as_rule() == Rule::expr)?;
                let mut e = self.expr(inner)?;
                e.span = span;
                Some(e)
            }
            _ => None,
        }
    }
}

/// The grammar only lets through digits, `_`, one `.` and an exponent, so this cannot fail;
/// an out-of-range literal becomes infinity, which the range checks reject.
fn parse_number(text: &str) -> f64 {
    text.replace('_', "").parse().unwrap_or(f64::INFINITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> (Vec<Item>, Vec<Problem>) {
        parse_file(0, text)
    }

    fn only_field_value(text: &str) -> ExprKind {
        let (items, problems) = parse(text);
        assert!(problems.is_empty(), "{problems:?}");
        match &items[..] {
            [Item::Block(b)] => match &b.members[..] {
                [Member::Field(f)] => f.value.kind.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn chunks_split_at_block_headers_and_top_level_lets() {
        let text =
            "# c\nuse \"a.tsl\"\nlet x = 1\nmodel m {\n  let y = 2\n  a = 1\n}\ntrain {\n}\n";
        let starts: Vec<usize> = chunks(text).iter().map(|c| c.0).collect();
        let lines: Vec<&str> = starts
            .iter()
            .map(|&s| text[s..].lines().next().unwrap())
            .collect();
        assert_eq!(
            lines,
            ["# c", "use \"a.tsl\"", "let x = 1", "model m {", "train {"]
        );
    }

    #[test]
    fn fields_separated_by_newlines_semicolons_and_commas() {
        let (items, problems) = parse("strategy s { tp = 8; pp = 4, dp = 2\n  zero = 1 }");
        assert!(problems.is_empty(), "{problems:?}");
        let Item::Block(b) = &items[0] else { panic!() };
        assert_eq!(b.members.len(), 4);
    }

    #[test]
    fn numbers_units_percent_and_ranges() {
        assert_eq!(
            only_field_value("a b { x = 128_256 }"),
            ExprKind::Number(128256.0)
        );
        assert_eq!(
            only_field_value("a b { x = 1e-3 }"),
            ExprKind::Number(0.001)
        );
        assert_eq!(only_field_value("a b { x = 95% }"), ExprKind::Percent(0.95));
        match only_field_value("a b { x = 400 Gb/s }") {
            ExprKind::Quantity { value, unit } => {
                assert_eq!(value, 400.0);
                assert_eq!(unit.text, "Gb/s");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            only_field_value("a b { x = 1..=64 }"),
            ExprKind::Range(..)
        ));
    }

    #[test]
    fn a_missing_separator_is_not_a_unit() {
        let (_, problems) = parse("strategy s { tp = 8 pp = 4 }");
        assert_eq!(problems.len(), 1);
        assert_eq!(
            problems[0].message,
            "expected a new line, `;`, `,` or `}`, found `pp`"
        );
    }

    #[test]
    fn a_syntax_error_costs_one_block() {
        let (items, problems) = parse("model a {\n  x = \n}\nmodel b {\n  y = 2\n}\n");
        assert_eq!(problems.len(), 1);
        assert_eq!(
            problems[0].message,
            "expected a value, found the end of the line"
        );
        assert_eq!(items.len(), 1);
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let text = format!("let x = {}1{}", "(".repeat(10_000), ")".repeat(10_000));
        let (_, problems) = parse(&text);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].message.contains("nested"));
    }
}
