//! Releasing tape values after their last forward use: the gradients stay
//! the same bits, values no backward reads go at once, and a released
//! value cannot be read (typed error).

use ddmlip_engine::ops::Unary;
use ddmlip_engine::{EngineError, Graph, RowDomain, Tensor};

/// An op of two tensors under test.
type BinaryBuild = dyn Fn(&mut Graph<f64>, Tensor, Tensor) -> Result<Tensor, EngineError>;

const ROWS: usize = 40;
const COLS: usize = 500;

/// Values in [0.3, 1.5): inside every tested function's domain.
fn values(seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..ROWS * COLS)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            0.3 + 1.2 * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

/// `Σ w ⊙ op(x, y)` where x and y are intermediates (scaled leaves, so
/// that they can be released); the intermediates are released right after
/// `op` when `release` is on. Returns the leaves' gradients and whether
/// each intermediate's value was gone before the backward pass.
fn run(op: &BinaryBuild, y_constant: bool, release: bool) -> (Vec<Vec<f64>>, [bool; 3]) {
    let mut g = Graph::<f64>::new();
    g.set_release(release);
    let a = g.leaf(values(1), ROWS, COLS, RowDomain::Edge);
    let b = if y_constant {
        g.constant(values(2), ROWS, COLS, RowDomain::Edge)
    } else {
        g.leaf(values(2), ROWS, COLS, RowDomain::Edge)
    };
    let x = g.scale(a, 1.0).unwrap();
    let y = g.scale(b, 1.0).unwrap();
    let z = op(&mut g, x, y).unwrap();
    let cols = g.shape(z).1;
    let w = g.constant(
        values(3)[..ROWS * cols].to_vec(),
        ROWS,
        cols,
        RowDomain::Edge,
    );
    let zw = g.mul(z, w).unwrap();
    for t in [x, y, z] {
        g.release(t);
    }
    let gone = [g.is_released(x), g.is_released(y), g.is_released(z)];
    let s = g.sum_cols(zw).unwrap();
    let loss = g.sum_rows(s).unwrap();
    let grads = g.grad(loss, None, &[a, b]).unwrap();
    (grads, gone)
}

fn bits(v: &[Vec<f64>]) -> Vec<Vec<u64>> {
    v.iter()
        .map(|g| g.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// The released run's gradients equal the kept run's bit for bit; returns
/// which values were gone before the backward pass.
fn same_gradients(what: &str, op: &BinaryBuild, y_constant: bool) -> [bool; 3] {
    let (kept, none_gone) = run(op, y_constant, false);
    assert_eq!(none_gone, [false; 3], "{what}: released with release off");
    let (released, gone) = run(op, y_constant, true);
    assert!(kept[0].iter().any(|&v| v != 0.0), "{what}: zero gradient");
    assert_eq!(bits(&released), bits(&kept), "{what}: gradients differ");
    gone
}

#[test]
fn unary_backward_reads_only_what_its_derivative_needs() {
    let cases = [
        (Unary::Silu, "silu", true),
        (Unary::ScaledSilu(1.7), "scaled silu", true),
        (Unary::Tanh, "tanh", false),
        (Unary::Sigmoid, "sigmoid", false),
        (Unary::ShiftedSoftplus, "shifted softplus", true),
        (Unary::Exp, "exp", false),
        (Unary::Ln, "ln", true),
        (Unary::Sqrt, "sqrt", false),
        (Unary::Square, "square", true),
        (Unary::Recip, "recip", false),
        (Unary::Neg, "neg", false),
        (Unary::Scale(-2.5), "scale", false),
        (Unary::AddScalar(0.5), "add scalar", false),
        (Unary::Powf(2.5), "powf", true),
        (Unary::Powf(3.0), "integer powf", true),
        (Unary::Cos, "cos", true),
        (Unary::Sin, "sin", true),
    ];
    for (f, name, reads_x) in cases {
        let gone = same_gradients(name, &move |g, x, _| g.unary(x, f), false);
        assert_eq!(gone[0], !reads_x, "{name}: x released");
    }
}

#[test]
fn binary_and_matmul_backward_keep_the_other_factor_only_when_it_has_a_gradient() {
    type Op = fn(&mut Graph<f64>, Tensor, Tensor) -> Result<Tensor, EngineError>;
    let ops: [(&str, Op, bool, bool); 4] = [
        ("add", |g, x, y| g.add(x, y), false, false),
        ("sub", |g, x, y| g.sub(x, y), false, false),
        ("mul", |g, x, y| g.mul(x, y), true, true),
        ("div", |g, x, y| g.div(x, y), true, true),
    ];
    for (name, op, reads_x, reads_y) in ops {
        let gone = same_gradients(name, &op, false);
        assert_eq!([gone[0], gone[1]], [!reads_x, !reads_y], "{name}");
    }
    // y = b·1 does not need a gradient when b is a constant: the product
    // then keeps y (for x's gradient) but not x.
    let gone = same_gradients("mul by a constant", &|g, x, y| g.mul(x, y), true);
    assert_eq!([gone[0], gone[1]], [true, false], "mul by a constant");
    let gone = same_gradients("div by a constant", &|g, x, y| g.div(x, y), true);
    assert_eq!([gone[0], gone[1]], [true, false], "div by a constant");
    // x (ROWS×COLS) · yᵀ-shaped weight: a constant weight keeps itself only.
    let matmul = |g: &mut Graph<f64>, x: Tensor, y: Tensor| {
        let w = g.slice_cols(y, 0, 7)?;
        let rows: Vec<u32> = (0..COLS as u32).map(|r| r % ROWS as u32).collect();
        let rows = g.index(
            std::sync::Arc::new(rows),
            RowDomain::None,
            RowDomain::Edge,
            ROWS,
            "weight rows",
        )?;
        let w = g.gather(w, rows)?;
        g.matmul(x, w)
    };
    let gone = same_gradients("matmul", &matmul, false);
    assert!(!gone[0], "matmul: x kept for the weight's gradient");
    let gone = same_gradients("matmul by a constant", &matmul, true);
    assert!(gone[0], "matmul by a constant weight: x released");
}

#[test]
fn a_released_value_cannot_be_read() {
    let mut g = Graph::<f64>::new();
    let a = g.leaf(values(1), ROWS, COLS, RowDomain::Edge);
    let x = g.scale(a, 2.0).unwrap();
    // exp reads its output in backward, not its input.
    let y = g.unary(x, Unary::Exp).unwrap();
    g.release(x);
    assert!(g.is_released(x));
    let released = |r: Result<(), EngineError>| matches!(r, Err(EngineError::Released { ref op }) if op == "scale");
    assert!(released(g.try_value(x).map(|_| ())));
    assert!(released(g.unary(x, Unary::Sin).map(|_| ())));
    assert!(released(g.add(y, x).map(|_| ())));
    assert!(released(g.mul(x, y).map(|_| ())));
    assert!(released(g.matmul(x, y).map(|_| ())));
    assert!(released(g.sum_cols(x).map(|_| ())));
    assert!(released(g.sum_rows(x).map(|_| ())));
    assert!(released(g.slice_cols(x, 0, 2).map(|_| ())));
    assert!(released(g.concat_cols(&[y, x]).map(|_| ())));
    let err = g.try_value(x).unwrap_err().to_string();
    assert!(err.contains("released") && err.contains("scale"), "{err}");
    // y is read by its own backward: releasing it defers to the backward
    // pass, until then it reads as before.
    g.release(y);
    assert!(!g.is_released(y));
    let before = g.try_value(y).unwrap().to_vec();
    let s = g.sum_cols(y).unwrap();
    let loss = g.sum_rows(s).unwrap();
    let grads = g.grad(loss, None, &[a]).unwrap();
    // d/da Σ exp(2a) = 2·exp(2a), from the kept output.
    for (gi, yi) in grads[0].iter().zip(&before) {
        assert_eq!(*gi, 2.0 * yi);
    }
    assert!(g.is_released(y), "y goes once the backward has passed it");
    assert!(matches!(
        g.try_value(y),
        Err(EngineError::Released { ref op }) if op == "exp"
    ));
    // A second backward pass would read y: a typed error, no garbage.
    assert!(matches!(
        g.grad(loss, None, &[a]),
        Err(EngineError::Released { .. })
    ));
}
