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
        let k: Arc<dyn OpaqueKernel<T>> = Arc::new(kernel);
        let t = self.g.rowwise(k, &inputs).map_err(Self::map_err)?;
        Ok(Val::T {
            t,
            shape: out_shape,
        })
    }
}
