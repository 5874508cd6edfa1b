//! Compilation of expressions to a register program: errors, sharing, constant folding and
//! evaluation against hand-computed values.

use tessel_symbolic::{CompileError, Expr, Program, Symbol};

fn s(name: &str) -> Expr {
    Expr::symbol(name)
}

fn slots(names: &[&str]) -> Vec<Symbol> {
    names.iter().map(|n| Symbol::new(n)).collect()
}

fn compile(outputs: &[Expr], names: &[&str]) -> Program {
    match Program::compile(outputs, &slots(names)) {
        Ok(program) => program,
        Err(e) => panic!("compile failed: {e}"),
    }
}

#[test]
fn unknown_symbol_is_an_error_naming_it() {
    let err = Program::compile(&[s("x"), s("x") + s("y")], &slots(&["x"])).unwrap_err();
    assert_eq!(
        err,
        CompileError::UnknownSymbol {
            symbol: Symbol::new("y"),
            output: 1
        }
    );
    assert_eq!(
        err.to_string(),
        "output 1 uses the symbol `y`, which is not one of the input slots"
    );
}

#[test]
fn duplicate_slot_is_an_error() {
    let err = Program::compile(&[s("x")], &slots(&["x", "y", "x"])).unwrap_err();
    assert_eq!(
        err,
        CompileError::DuplicateSlot {
            symbol: Symbol::new("x")
        }
    );
}

#[test]
fn symbols_that_simplify_away_need_no_slot() {
    let program = compile(&[s("y") - s("y") + 2u64], &[]);
    let mut out = [0.0];
    program.eval(&[], &mut out);
    assert_eq!(out, [2.0]);
    assert_eq!(program.num_instructions(), 0);
}

#[test]
fn evaluates_a_step_time_like_expression() {
    // (m + p - 1) * max(f/t, g) + ceil(m/v) * 0.5
    let step = (s("m") + s("p") - 1u64) * Expr::max([s("f") / s("t"), s("g")])
        + (s("m") / s("v")).ceil() * 0.5;
    let program = compile(&[step], &["m", "p", "f", "t", "g", "v"]);
    let mut out = [0.0];
    program.eval(&[8.0, 4.0, 12.0, 4.0, 2.5, 3.0], &mut out);
    // (8 + 4 - 1) * max(3, 2.5) + ceil(8/3) * 0.5 = 33 + 1.5
    assert_eq!(out, [34.5]);
}

#[test]
fn constants_and_inputs_as_outputs_need_no_instructions() {
    let program = compile(&[Expr::constant(3.0), s("x"), s("x") * 1u64 + 0u64], &["x"]);
    assert_eq!(program.num_instructions(), 0);
    let mut out = [0.0; 3];
    program.eval(&[7.0], &mut out);
    assert_eq!(out, [3.0, 7.0, 7.0]);
}

#[test]
fn constant_subexpressions_fold_at_compile_time() {
    let e = (Expr::constant(2.0) * 3u64 + 1u64) * s("x")
        + Expr::max([Expr::constant(4.0), 9u64.into()]);
    let program = compile(&[e], &["x"]);
    // 7*x + 9 is one affine instruction.
    assert_eq!(program.num_instructions(), 1);
    let mut out = [0.0];
    program.eval(&[2.0], &mut out);
    assert_eq!(out, [23.0]);
}

#[test]
fn shared_subexpressions_are_computed_once() {
    let shared = s("x") * s("y");
    let outputs = [
        shared.clone() + 2u64,
        (shared.clone() + 2u64) * s("z"),
        Expr::max([shared.clone(), s("z")]),
        shared.clone() * 3u64 + s("z"),
    ];
    let program = compile(&outputs, &["x", "y", "z"]);
    // x*y, x*y + 2, (x*y + 2)*z, max(x*y, z), 3*x*y + z: five instructions, x*y once.
    assert_eq!(program.num_instructions(), 5);
    let mut out = [0.0; 4];
    program.eval(&[2.0, 3.0, 5.0], &mut out);
    assert_eq!(out, [8.0, 40.0, 6.0, 23.0]);
}

#[test]
fn instructions_of_one_operation_run_together() {
    // Written interleaved: sum, product, sum, product, then a max of all four. Scheduled: the
    // two sums, the two products, the max (three runs, three dispatches).
    let (a, b, c, d) = (s("a"), s("b"), s("c"), s("d"));
    let outputs = [
        a.clone() + b.clone(),
        a.clone() * b.clone(),
        c.clone() + d.clone(),
        c.clone() * d.clone(),
        Expr::max([a.clone() + b.clone(), a * b, c.clone() + d.clone(), c * d]),
    ];
    let program = compile(&outputs, &["a", "b", "c", "d"]);
    assert_eq!(program.num_instructions(), 5);
    assert_eq!(program.num_runs(), 3);
    let mut out = [0.0; 5];
    program.eval(&[1.0, 2.0, 3.0, 4.0], &mut out);
    assert_eq!(out, [3.0, 2.0, 7.0, 12.0, 12.0]);
}

#[test]
fn scratch_is_reused_without_growing() {
    let program = compile(
        &[
            s("a") * s("b") + s("c") / s("a"),
            Expr::min([s("a"), s("b"), s("c")]),
        ],
        &["a", "b", "c"],
    );
    let mut scratch = Vec::new();
    let mut out = [0.0; 2];
    program.eval_into(&[1.0, 2.0, 4.0], &mut scratch, &mut out);
    let capacity = scratch.capacity();
    assert_eq!(scratch.len(), program.num_registers());
    program.eval_into(&[2.0, 3.0, 4.0], &mut scratch, &mut out);
    assert_eq!(scratch.capacity(), capacity);
    assert_eq!(out, [8.0, 2.0]);
}

#[test]
fn program_is_shareable_across_threads() {
    fn assert_send_sync_clone<T: Send + Sync + Clone>() {}
    assert_send_sync_clone::<Program>();

    let program = compile(&[s("x") * s("x") + 1u64], &["x"]);
    let results: Vec<f64> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let program = &program;
                scope.spawn(move || {
                    let mut scratch = Vec::new();
                    let mut out = [0.0];
                    program.eval_into(&[f64::from(i)], &mut scratch, &mut out);
                    out[0]
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(f64::NAN))
            .collect()
    });
    assert_eq!(results, [1.0, 2.0, 5.0, 10.0]);
}

#[test]
fn reports_its_shape() {
    let program = compile(&[s("a") + s("b"), s("a") * s("b")], &["a", "b", "unused"]);
    assert_eq!(program.num_inputs(), 3);
    assert_eq!(program.num_outputs(), 2);
    assert_eq!(program.num_instructions(), 2);
    assert_eq!(program.slots(), slots(&["a", "b", "unused"]).as_slice());
    // Three inputs and two computed values, rounded up to a power of two.
    assert_eq!(program.num_registers(), 8);
}
