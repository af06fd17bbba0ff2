//! The convolution with per-edge weights given (the radial MLP run
//! separately): forward and backward entry points.

use super::*;

fn check_inputs<T: Real>(
    paths: &ConvPaths<T>,
    graph: &ConvGraph,
    h: &[T],
    sh: &[T],
    w: &[T],
    denominator: f64,
) -> Result<T, E3nnError> {
    let (n, e) = (graph.n_rows, graph.n_edges());
    check_len("conv h", n * paths.dim_in, h.len())?;
    check_len("conv sh", e * paths.dim_sh(), sh.len())?;
    check_len("conv w", e * paths.dim_w, w.len())?;
    if !(denominator.is_finite() && denominator != 0.0) {
        return Err(E3nnError::Config(format!(
            "conv denominator must be finite and non-zero, got {denominator}"
        )));
    }
    Ok(T::from_f64(1.0 / denominator))
}

/// Forward: `out` (n_rows × dim_msg, overwritten) = Σ_{edges into i} msg_e / denominator.
/// `h` is n_rows × dim_in (read at senders), `sh` E × dim_sh, `w` E × dim_w.
pub fn conv_forward<T: Real>(
    paths: &ConvPaths<T>,
    graph: &ConvGraph,
    h: &[T],
    sh: &[T],
    w: &[T],
    denominator: f64,
    out: &mut [T],
) -> Result<(), E3nnError> {
    let inv_den = check_inputs(paths, graph, h, sh, w, denominator)?;
    let dm = paths.dim_msg;
    check_len("conv out", graph.n_rows * dm, out.len())?;
    if dm == 0 {
        return Ok(());
    }
    let ht = rows_to_cm(&paths.in_ranges, h, paths.dim_in);
    let isa = Isa::detect();
    out.par_chunks_mut(dm).enumerate().for_each_init(
        || paths.scratch(dm),
        |sc, (i, row)| {
            fwd_row_mv(
                isa,
                paths,
                graph,
                &ht,
                sh,
                w,
                None,
                inv_den,
                i,
                BlockLayout::CopyMajor,
                row,
                sc,
            )
        },
    );
    Ok(())
}

/// Backward of [`conv_forward`] from `grad_a` (n_rows × dim_msg). Overwrites
/// `grad_h` (n_rows × dim_in; sums over the edges each row sends),
/// `grad_sh` (E × dim_sh) and `grad_w` (E × dim_w).
#[allow(clippy::too_many_arguments)]
pub fn conv_backward<T: Real>(
    paths: &ConvPaths<T>,
    graph: &ConvGraph,
    h: &[T],
    sh: &[T],
    w: &[T],
    denominator: f64,
    grad_a: &[T],
    grad_h: &mut [T],
    grad_sh: &mut [T],
    grad_w: &mut [T],
) -> Result<(), E3nnError> {
    let inv_den = check_inputs(paths, graph, h, sh, w, denominator)?;
    let (n, ne) = (graph.n_rows, graph.n_edges());
    let (dm, di, dw, ds) = (paths.dim_msg, paths.dim_in, paths.dim_w, paths.dim_sh());
    check_len("conv grad_a", n * dm, grad_a.len())?;
    check_len("conv grad_h", n * di, grad_h.len())?;
    check_len("conv grad_sh", ne * ds, grad_sh.len())?;
    check_len("conv grad_w", ne * dw, grad_w.len())?;
    let isa = Isa::detect();
    let gat = rows_to_cm(&paths.out_ranges, grad_a, dm);

    // Pass 1, over edges: weight and filter gradients (disjoint rows per edge).
    if dw == 0 {
        grad_sh.fill(T::ZERO);
    } else if ne > 0 {
        let ht = rows_to_cm(&paths.in_ranges, h, di);
        grad_w
            .par_chunks_mut(dw)
            .zip(grad_sh.par_chunks_mut(ds))
            .enumerate()
            .for_each_init(
                || paths.scratch(0),
                |sc, (e, (gw, gy))| {
                    bwd_edge_mv(isa, paths, graph, &ht, sh, w, &gat, inv_den, e, gw, gy, sc)
                },
            );
    }

    // Pass 2, over sender rows: feature gradient.
    if di > 0 {
        grad_h.par_chunks_mut(di).enumerate().for_each_init(
            || paths.scratch(di),
            |sc, (j, gh)| bwd_sender_row_mv(isa, paths, graph, sh, w, &gat, inv_den, j, gh, sc),
        );
    }
    Ok(())
}
