//! Shape ops of an imported graph along non-row dimensions: row gathers, reshape/expand, strided slices, concatenation, einsum.

use super::*;

impl<T: Scalar> Run<'_, T> {
    pub(super) fn row_gather(
        &mut self,
        name: &str,
        inputs: &[Tensor],
        src: Vec<(usize, usize)>,
    ) -> Res<Tensor> {
        let k: Arc<dyn OpaqueKernel<T>> = Arc::new(RowGather {
            name: name.to_string(),
            src,
        });
        self.g.rowwise(k, inputs).map_err(Self::map_err)
    }

    /// A row-local contraction of `inputs`: the engine's blocked GEMM when
    /// it is a dense linear map of one per-row operand (a matrix product or
    /// tensordot with weights), the [`RowBroadcast`] product when it is an
    /// outer or element-wise product of two, else the [`RowEinsum`]
    /// kernel's term list.
    pub(super) fn row_contraction(&mut self, kernel: RowEinsum, inputs: &[Tensor]) -> Res<Tensor> {
        if let (Some((k, n, m)), [x]) = (kernel.dense_matrix(), inputs) {
            let m = m.into_iter().map(T::from_f64).collect();
            let w = self.g.constant(m, k, n, RowDomain::None);
            return self.g.matmul(*x, w).map_err(Self::map_err);
        }
        if let (Some(maps), [a, b]) = (kernel.product_maps(), inputs) {
            if self.g.shape(*a).0 == self.g.shape(*b).0 {
                let k: Arc<dyn OpaqueKernel<T>> = Arc::new(RowBroadcast {
                    op: BroadcastOp::Mul,
                    maps,
                    per_row: [true, true],
                });
                return self.g.rowwise(k, inputs).map_err(Self::map_err);
            }
        }
        let k: Arc<dyn OpaqueKernel<T>> = Arc::new(kernel);
        self.g.rowwise(k, inputs).map_err(Self::map_err)
    }

    /// A reshape keeping the rows, or a broadcast to the recorded shape.
    pub(super) fn reshape_or_expand(&mut self, x: Val, out: &str, expand: bool) -> Res<Val> {
        let shape = self.shape_of(out)?;
        match x {
            Val::T { t, shape: xs } => {
                if xs == shape
                    || (!expand && xs.first() == shape.first() && numel(&xs) == numel(&shape))
                {
                    return Ok(Val::T { t, shape });
                }
                if !expand {
                    return Err(format!(
                        "a reshape of {xs:?} to {shape:?} moves the row dimension"
                    ));
                }
                let ones = Val::Host {
                    v: Arc::new(vec![1.0]),
                    shape: vec![],
                };
                self.binary_values(ones, Val::T { t, shape: xs }, Bin::Mul, out)
            }
            Val::Int {
                v,
                shape: xs,
                origin,
            } if !expand || xs == shape => {
                let origin = if xs == shape { origin } else { Origin::Other };
                Ok(Val::Int { v, shape, origin })
            }
            // An index of one value per row broadcast along columns
            // (`index.unsqueeze(-1).expand_as(src)` for a `scatter_add`)
            // keeps one value per row.
            Val::Int {
                v,
                shape: xs,
                origin,
            } if shape.len() > 1
                && xs
                    .first()
                    .is_some_and(|&r| r == v.len() && Some(&r) == shape.first()) =>
            {
                Ok(Val::IntRows {
                    rows: v,
                    shape,
                    origin,
                })
            }
            Val::Int { v, shape: xs, .. } => {
                let wide = broadcast_host(&v, &xs, &shape)?;
                Ok(Val::Int {
                    v: Arc::new(wide),
                    shape,
                    origin: Origin::Other,
                })
            }
            other => {
                let (v, xs) = Self::host_values(&other).ok_or("unexpected input")?;
                let v = if expand {
                    broadcast_host(&v, &xs, &shape)?
                } else {
                    v.to_vec()
                };
                Ok(Val::Host {
                    v: Arc::new(v),
                    shape,
                })
            }
        }
    }

    /// A strided view along `dim` (`map(shape, dim)` gives the flat indices).
    pub(super) fn strided(
        &mut self,
        x: Val,
        out: &str,
        map: impl Fn(&[usize], usize) -> Vec<usize>,
        dim: usize,
    ) -> Res<Val> {
        let out_shape = self.shape_of(out)?;
        match x {
            Val::T { t, shape } => {
                if dim == 0 {
                    return Err("a slice along the row dimension".into());
                }
                let m = map(&shape[1..], dim - 1);
                let t = self.row_gather("slice", &[t], m.into_iter().map(|c| (0, c)).collect())?;
                Ok(Val::T {
                    t,
                    shape: out_shape,
                })
            }
            other => {
                let (v, shape) = Self::host_values(&other).ok_or("unexpected input")?;
                let m = map(&shape, dim);
                let vals: Vec<f64> = m
                    .iter()
                    .map(|&k| {
                        v.get(k)
                            .copied()
                            .ok_or_else(|| "a slice past the end".to_string())
                    })
                    .collect::<Res<_>>()?;
                Ok(Val::Host {
                    v: Arc::new(vals),
                    shape: out_shape,
                })
            }
        }
    }

    /// Concatenation along `dim` of parts with the given (explicit) shapes.
    pub(super) fn concat(
        &mut self,
        parts: Vec<Val>,
        shapes: Vec<Vec<usize>>,
        dim: usize,
        out: &str,
    ) -> Res<Val> {
        let out_shape = self.shape_of(out)?;
        let domain = self.domain_of(out);
        let rank = out_shape.len();
        if shapes.iter().any(|s| s.len() != rank) {
            return Err("parts of different ranks".into());
        }
        // Where output element (flat, over dims `from..`) comes from.
        let from = usize::from(parts.iter().any(|p| matches!(p, Val::T { .. })));
        if from == 1 && dim == 0 {
            return Err("a concatenation along the row dimension".into());
        }
        let inner_out = &out_shape[from..];
        let ost = strides(inner_out);
        let mut offsets = Vec::new();
        let mut acc = 0;
        for s in &shapes {
            offsets.push(acc);
            acc += s[dim];
        }
        let total: usize = inner_out.iter().product();
        let mut src = Vec::with_capacity(total);
        for i in 0..total {
            let idx: Vec<usize> = (0..inner_out.len())
                .map(|d| (i / ost[d]) % inner_out[d].max(1))
                .collect();
            let c = idx[dim - from];
            let part = offsets
                .iter()
                .rposition(|&o| o <= c)
                .ok_or("bad concatenation")?;
            let ps = &shapes[part][from..];
            let pst = strides(ps);
            let mut flat = 0;
            for d in 0..idx.len() {
                let k = if d == dim - from {
                    c - offsets[part]
                } else {
                    idx[d]
                };
                flat += k * pst[d];
            }
            src.push((part, flat));
        }
        if from == 0 {
            let mut vals = Vec::with_capacity(total);
            let hosts: Vec<Arc<Vec<f64>>> = parts
                .iter()
                .map(|p| {
                    Self::host_values(p)
                        .map(|h| h.0)
                        .ok_or_else(|| "unexpected input".to_string())
                })
                .collect::<Res<_>>()?;
            for (p, f) in src {
                vals.push(*hosts[p].get(f).ok_or("bad concatenation")?);
            }
            return Ok(Val::Host {
                v: Arc::new(vals),
                shape: out_shape,
            });
        }
        let mut tensors = Vec::new();
        for (p, s) in parts.into_iter().zip(&shapes) {
            tensors.push(match p {
                Val::T { t, .. } => t,
                other => {
                    // Same elements as the explicit shape (stack's inserted 1).
                    let (v, _) = Self::host_values(&other).ok_or("unexpected input")?;
                    self.constant(&v, s, s, domain)?
                }
            });
        }
        let t = self.row_gather("cat", &tensors, src)?;
        Ok(Val::T {
            t,
            shape: out_shape,
        })
    }

    /// An einsum whose output's first label is the row label of every
    /// per-row operand; host operands without the row label are constants.
    pub(super) fn einsum(
        &mut self,
        parts: Vec<Val>,
        specs: Vec<Vec<char>>,
        out_labels: Vec<char>,
        out: &str,
    ) -> Res<Val> {
        let out_shape = self.shape_of(out)?;
        if !parts.iter().any(|p| matches!(p, Val::T { .. })) {
            // Constants only (Allegro's path weights times Wigner 3j): on the host.
            let mut hosts = Vec::with_capacity(parts.len());
            for p in &parts {
                hosts.push(Self::host_values(p).ok_or("unexpected input")?);
            }
            let v = host_einsum(&hosts, &specs, &out_labels)?;
            if v.len() != numel(&out_shape) {
                return Err("an einsum whose result does not fill its recorded shape".into());
            }
            return Ok(Val::Host {
                v: Arc::new(v),
                shape: out_shape,
            });
        }
        let domain = self.domain_of(out);
        let row = *out_labels.first().ok_or("an einsum with a scalar output")?;
        if domain == RowDomain::None {
            return Err("an einsum whose output has no atom or edge rows".into());
        }
        let mut operands = Vec::new();
        let mut inputs = Vec::new();
        for (p, labels) in parts.into_iter().zip(specs) {
            let shape = value_shape(&p)?;
            if shape.len() != labels.len() {
                return Err(format!(
                    "labels `{}` for shape {shape:?}",
                    labels.iter().collect::<String>()
                ));
            }
            let per_row = labels.first() == Some(&row);
            if labels.iter().skip(1).any(|&l| l == row) {
                return Err("the row label in a non-leading position".into());
            }
            match p {
                Val::T { t, .. } if per_row => {
                    inputs.push(t);
                    operands.push(EinsumOperand {
                        labels: labels[1..].to_vec(),
                        sizes: shape[1..].to_vec(),
                        constant: None,
                    });
                }
                Val::T { .. } => {
                    return Err("a differentiable operand without the row label".into())
                }
                other if per_row => {
                    let (v, hs) = Self::host_values(&other).ok_or("unexpected input")?;
                    inputs.push(self.constant(&v, &hs, &hs, domain)?);
                    operands.push(EinsumOperand {
                        labels: labels[1..].to_vec(),
                        sizes: shape[1..].to_vec(),
                        constant: None,
                    });
                }
                other => {
                    let (v, _) = Self::host_values(&other).ok_or("unexpected input")?;
                    operands.push(EinsumOperand {
                        labels,
                        sizes: shape,
                        constant: Some(v.to_vec()),
                    });
                }
            }
        }
        if inputs.is_empty() {
            return Err("an einsum of constants only".into());
        }
        let kernel = RowEinsum::new("einsum", operands, &out_labels[1..])?;
        let t = self.row_contraction(kernel, &inputs)?;
        Ok(Val::T {
            t,
            shape: out_shape,
        })
    }
}

/// An einsum of host tensors: the sum over every label combination of the
/// operands' product (the constants are small: path weights, 3j symbols).
fn host_einsum(
    parts: &[(Arc<Vec<f64>>, Vec<usize>)],
    specs: &[Vec<char>],
    out_labels: &[char],
) -> Res<Vec<f64>> {
    let mut labels: Vec<char> = Vec::new();
    let mut sizes: Vec<usize> = Vec::new();
    for ((_, shape), spec) in parts.iter().zip(specs) {
        if shape.len() != spec.len() {
            return Err(format!(
                "labels `{}` for shape {shape:?}",
                spec.iter().collect::<String>()
            ));
        }
        for (&l, &n) in spec.iter().zip(shape) {
            match labels.iter().position(|&x| x == l) {
                Some(k) if sizes[k] != n => {
                    return Err(format!("label `{l}` with sizes {} and {n}", sizes[k]))
                }
                Some(_) => {}
                None => {
                    labels.push(l);
                    sizes.push(n);
                }
            }
        }
    }
    let pos = |l: char| {
        labels
            .iter()
            .position(|&x| x == l)
            .ok_or_else(|| format!("output label `{l}` on no operand"))
    };
    let out_pos: Vec<usize> = out_labels.iter().map(|&l| pos(l)).collect::<Res<_>>()?;
    let out_sizes: Vec<usize> = out_pos.iter().map(|&k| sizes[k]).collect();
    let out_strides = strides(&out_sizes);
    let operand_pos: Vec<Vec<usize>> = specs
        .iter()
        .map(|spec| spec.iter().map(|&l| pos(l)).collect::<Res<Vec<_>>>())
        .collect::<Res<_>>()?;
    let operand_strides: Vec<Vec<usize>> = parts.iter().map(|(_, s)| strides(s)).collect();
    let mut out = vec![0.0; numel(&out_sizes)];
    let mut idx = vec![0usize; labels.len()];
    for _ in 0..numel(&sizes) {
        let mut prod = 1.0;
        for (k, (v, _)) in parts.iter().enumerate() {
            let flat: usize = operand_pos[k]
                .iter()
                .zip(&operand_strides[k])
                .map(|(&p, &st)| idx[p] * st)
                .sum();
            prod *= v[flat];
        }
        let o: usize = out_pos
            .iter()
            .zip(&out_strides)
            .map(|(&p, &st)| idx[p] * st)
            .sum();
        out[o] += prod;
        // Next label combination (the last label fastest).
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < sizes[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(out)
}
