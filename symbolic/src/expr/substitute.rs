//! Substitution of symbols and the set of symbols an expression uses.

use std::collections::{BTreeMap, BTreeSet};

use super::{Expr, Symbol};

impl Expr {
    /// Replaces every occurrence of `symbol` by `value`. The result is not simplified; call
    /// [`Expr::simplify`] to fold what the binding made constant.
    pub fn substitute(&self, symbol: &Symbol, value: &Expr) -> Expr {
        self.substitute_with(&|s: &Symbol| (s == symbol).then_some(value))
    }

    /// Replaces every symbol bound in `bindings` by its value, all at once (a value is not
    /// itself substituted into). The result is not simplified.
    pub fn substitute_all(&self, bindings: &BTreeMap<Symbol, Expr>) -> Expr {
        self.substitute_with(&|s: &Symbol| bindings.get(s))
    }

    fn substitute_with<'a>(&self, lookup: &dyn Fn(&Symbol) -> Option<&'a Expr>) -> Expr {
        let map = |items: &[Expr]| -> Vec<Expr> {
            items.iter().map(|e| e.substitute_with(lookup)).collect()
        };
        match self {
            Expr::Const(c) => Expr::Const(*c),
            Expr::Sym(s) => lookup(s).cloned().unwrap_or_else(|| Expr::Sym(s.clone())),
            Expr::Sum(items) => Expr::Sum(map(items)),
            Expr::Product(items) => Expr::Product(map(items)),
            Expr::Div(num, den) => Expr::Div(
                Box::new(num.substitute_with(lookup)),
                Box::new(den.substitute_with(lookup)),
            ),
            Expr::Max(items) => Expr::Max(map(items)),
            Expr::Min(items) => Expr::Min(map(items)),
            Expr::Ceil(arg) => Expr::Ceil(Box::new(arg.substitute_with(lookup))),
        }
    }

    /// The symbols the expression uses, in sorted order.
    pub fn symbols(&self) -> BTreeSet<Symbol> {
        let mut found = BTreeSet::new();
        self.collect_symbols(&mut found);
        found
    }

    fn collect_symbols(&self, found: &mut BTreeSet<Symbol>) {
        match self {
            Expr::Const(_) => {}
            Expr::Sym(s) => {
                if !found.contains(s) {
                    found.insert(s.clone());
                }
            }
            Expr::Sum(items) | Expr::Product(items) | Expr::Max(items) | Expr::Min(items) => {
                for item in items {
                    item.collect_symbols(found);
                }
            }
            Expr::Div(num, den) => {
                num.collect_symbols(found);
                den.collect_symbols(found);
            }
            Expr::Ceil(arg) => arg.collect_symbols(found),
        }
    }
}
