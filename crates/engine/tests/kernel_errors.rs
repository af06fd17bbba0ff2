//! A user kernel's typed error reaches the caller as `EngineError::Kernel`
//! with the op's name, its message unchanged and the kernel error as source.

use ddmlip_engine::{EngineError, Graph, KernelError, OpaqueKernel, RowDomain};
use std::error::Error;
use std::sync::Arc;

/// Takes rows of width 3 only, like an e3nn linear built for fixed irreps.
struct WidthThree;

impl OpaqueKernel<f64> for WidthThree {
    fn name(&self) -> &str {
        "width_three"
    }
    fn output_shape(
        &self,
        inputs: &[(RowDomain, usize, usize)],
    ) -> Result<(RowDomain, usize, usize), KernelError> {
        match inputs {
            [(domain, rows, 3)] => Ok((*domain, *rows, 3)),
            [(_, _, got)] => Err(KernelError::Columns {
                expected: 3,
                got: *got,
            }),
            _ => Err(KernelError::Inputs {
                expected: "one input".into(),
            }),
        }
    }
    fn forward(
        &self,
        inputs: &[&[f64]],
        _shapes: &[(RowDomain, usize, usize)],
        out: &mut [f64],
    ) -> Result<(), KernelError> {
        if inputs[0].iter().any(|x| !x.is_finite()) {
            return Err(KernelError::failed(std::io::Error::other(
                "non-finite input",
            )));
        }
        out.copy_from_slice(inputs[0]);
        Ok(())
    }
}

#[test]
fn wrong_width_is_a_typed_kernel_error_naming_the_op() {
    let mut g = Graph::<f64>::new();
    let x = g.leaf(vec![1.0; 4], 2, 2, RowDomain::Atom);
    let err = g.opaque(Arc::new(WidthThree), &[x]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "opaque op `width_three` failed: expects 3 columns, got 2"
    );
    match &err {
        EngineError::Kernel { op, source } => {
            assert_eq!(op, "width_three");
            assert!(matches!(
                source,
                KernelError::Columns {
                    expected: 3,
                    got: 2
                }
            ));
        }
        other => panic!("expected EngineError::Kernel, got {other:?}"),
    }
    let source = err.source().expect("the kernel error is the source");
    assert_eq!(source.to_string(), "expects 3 columns, got 2");
}

#[test]
fn a_wrapped_failure_keeps_its_message_and_source() {
    let mut g = Graph::<f64>::new();
    let x = g.leaf(vec![1.0, f64::NAN, 0.0], 1, 3, RowDomain::Atom);
    let err = g.opaque(Arc::new(WidthThree), &[x]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "opaque op `width_three` failed: non-finite input"
    );
    let kernel = err
        .source()
        .and_then(|s| s.downcast_ref::<KernelError>())
        .expect("source is the KernelError");
    assert!(matches!(kernel, KernelError::Failed(_)), "{kernel:?}");
}

#[test]
fn a_fitting_input_passes_through() {
    let mut g = Graph::<f64>::new();
    let x = g.leaf(vec![1.0, 2.0, 3.0], 1, 3, RowDomain::Atom);
    let y = g.opaque(Arc::new(WidthThree), &[x]).unwrap();
    assert_eq!(g.value(y), &[1.0, 2.0, 3.0]);
}
