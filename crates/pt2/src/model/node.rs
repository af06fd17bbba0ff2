//! One graph node to engine ops or host values: the dispatch over the supported ATen ops.

use super::*;

impl<T: Scalar> Run<'_, T> {
    pub(super) fn node(&mut self, node: &Node) -> Res<()> {
        let op = node.op.as_str();
        match op {
            "aten._assert_tensor_metadata.default" => Ok(()),
            "aten.sym_size.int" => {
                let x = self.tensor_arg(node, "self")?;
                let shape = match &x {
                    Val::Sym(_) => return Err("sym_size of a symbolic int".into()),
                    other => value_shape(other)?,
                };
                let d = norm_dim(self.int_arg(node, "dim")?, shape.len())?;
                self.set(node, Val::Sym(shape[d]))
            }
            "aten.select.int" => {
                let x = self.tensor_arg(node, "self")?;
                let index = self.int_arg(node, "index")?;
                match x {
                    Val::Int { v, shape, origin } => {
                        let d = norm_dim(self.int_arg(node, "dim")?, shape.len())?;
                        let i = norm_index(index, shape[d])?;
                        let out = select_host(&v, &shape, d, i);
                        let origin = match (origin, d, i) {
                            (Origin::EdgeIndex, 0, 0) => Origin::Center,
                            (Origin::EdgeIndex, 0, 1) => Origin::Neighbor,
                            _ => Origin::Other,
                        };
                        let mut s = shape.clone();
                        s.remove(d);
                        self.set(
                            node,
                            Val::Int {
                                v: Arc::new(out),
                                shape: s,
                                origin,
                            },
                        )
                    }
                    Val::Host { v, shape } => {
                        let d = norm_dim(self.int_arg(node, "dim")?, shape.len())?;
                        let i = norm_index(index, shape[d])?;
                        let out = select_host(&v, &shape, d, i);
                        let mut s = shape.clone();
                        s.remove(d);
                        self.set(
                            node,
                            Val::Host {
                                v: Arc::new(out),
                                shape: s,
                            },
                        )
                    }
                    x @ Val::T { .. } => {
                        let shape = value_shape(&x)?;
                        let d = norm_dim(self.int_arg(node, "dim")?, shape.len())?;
                        let i = norm_index(index, shape[d])?;
                        let out = self.out_name(node)?.to_string();
                        let v = self.strided(x, &out, |sh, dd| slice_map(sh, dd, i, 1, 1), d)?;
                        self.set(node, v)
                    }
                    _ => Err("select of a symbolic int or zeros".into()),
                }
            }
            "aten.index.Tensor" => {
                let x = self.tensor_arg(node, "self")?;
                let idx = match self.arg(node, "indices")? {
                    Arg::AsTensors(ts) if ts.len() == 1 => self.get(&ts[0].name)?,
                    other => {
                        return Err(format!(
                            "indexing with {other:?}; one index tensor is supported"
                        ))
                    }
                };
                let out = self.out_name(node)?.to_string();
                match x {
                    Val::T { t, shape } => {
                        if self.g.domain(t) != RowDomain::Atom {
                            return Err(
                                "indexing a differentiable tensor whose rows are not atoms".into(),
                            );
                        }
                        let rows = *shape.first().ok_or("indexing a scalar")?;
                        let i = self.index_for(&idx, rows)?;
                        let t = self.g.gather(t, i).map_err(Self::map_err)?;
                        let shape = self.shape_of(&out)?;
                        self.set(node, Val::T { t, shape })
                    }
                    Val::Int { v, shape, .. } => {
                        let (g, s) = gather_host(&v, &shape, &idx)?;
                        self.set(
                            node,
                            Val::Int {
                                v: Arc::new(g),
                                shape: s,
                                origin: Origin::Other,
                            },
                        )
                    }
                    other => {
                        let (v, shape) = Self::host_values(&other).ok_or("unexpected input")?;
                        let (g, s) = gather_host(&v, &shape, &idx)?;
                        self.set(
                            node,
                            Val::Host {
                                v: Arc::new(g),
                                shape: s,
                            },
                        )
                    }
                }
            }
            "aten.embedding.default" => {
                let w = self.tensor_arg(node, "weight")?;
                let idx = self.tensor_arg(node, "indices")?;
                let (v, shape) = Self::host_values(&w)
                    .ok_or("a differentiable embedding table is not supported")?;
                let (g, s) = gather_host(&v, &shape, &idx)?;
                self.set(
                    node,
                    Val::Host {
                        v: Arc::new(g),
                        shape: s,
                    },
                )
            }
            "aten.add.Tensor" => self.binary(node, Bin::Add),
            "aten.sub.Tensor" => self.binary(node, Bin::Sub),
            "aten.mul.Tensor" => self.binary(node, Bin::Mul),
            "aten.div.Tensor" => self.binary(node, Bin::Div),
            "aten.exp.default" => self.unary(node, Unary::Exp, f64::exp),
            "aten.cos.default" => self.unary(node, Unary::Cos, f64::cos),
            "aten.sin.default" => self.unary(node, Unary::Sin, f64::sin),
            "aten.sqrt.default" => self.unary(node, Unary::Sqrt, f64::sqrt),
            "aten.silu.default" => self.unary(node, Unary::Silu, |x| x / (1.0 + (-x).exp())),
            "aten.tanh.default" => self.unary(node, Unary::Tanh, f64::tanh),
            "aten.sigmoid.default" => {
                self.unary(node, Unary::Sigmoid, |x| 1.0 / (1.0 + (-x).exp()))
            }
            "aten.neg.default" => self.unary(node, Unary::Neg, |x| -x),
            "aten.pow.Tensor_Scalar" => {
                let p = self.float_arg(node, "exponent")?;
                let x = self.tensor_arg(node, "self")?;
                match x {
                    Val::T { t, shape } => {
                        let f = if p == 2.0 {
                            Unary::Square
                        } else {
                            Unary::Powf(p)
                        };
                        let t = self.g.unary(t, f).map_err(Self::map_err)?;
                        self.set(node, Val::T { t, shape })
                    }
                    other => {
                        let (v, shape) = Self::host_values(&other).ok_or("unexpected input")?;
                        self.set(
                            node,
                            Val::Host {
                                v: Arc::new(v.iter().map(|x| x.powf(p)).collect()),
                                shape,
                            },
                        )
                    }
                }
            }
            "aten.linalg_norm.default" | "aten.linalg_vector_norm.default" => {
                let ord = match node.arg("ord") {
                    Some(Arg::AsNone(_)) | None => 2.0,
                    Some(_) => self.float_arg(node, "ord")?,
                };
                if ord != 2.0 {
                    return Err(format!("norm of order {ord}; the 2-norm is supported"));
                }
                let x = self.tensor_arg(node, "self")?;
                let dims = self.ints_arg(node, "dim")?;
                match x {
                    Val::T { t, shape } => {
                        let last = shape.len().checked_sub(1).ok_or("norm of a scalar")?;
                        let over_last = match &dims {
                            Some(d) => d.len() == 1 && norm_dim(d[0], shape.len())? == last,
                            None => false,
                        };
                        if !(over_last && shape.len() == 2) {
                            return Err(
                                "a norm over other than the last dimension of a 2-d tensor".into(),
                            );
                        }
                        let t = self.g.row_norm(t).map_err(Self::map_err)?;
                        let shape = self.shape_of(self.out_name(node)?)?;
                        self.set(node, Val::T { t, shape })
                    }
                    _ => Err("a norm of a constant tensor is not supported".into()),
                }
            }
            "aten.linspace.default" => {
                let start = self.float_arg(node, "start")?;
                let end = self.float_arg(node, "end")?;
                let steps =
                    usize::try_from(self.int_arg(node, "steps")?).map_err(|_| "negative steps")?;
                self.set(
                    node,
                    Val::Host {
                        v: Arc::new(linspace(start, end, steps)),
                        shape: vec![steps],
                    },
                )
            }
            "aten.unsqueeze.default" | "aten.squeeze.dim" => {
                let x = self.tensor_arg(node, "self")?;
                let shape = self.shape_of(self.out_name(node)?)?;
                let v = match x {
                    Val::T { t, .. } => {
                        if self.g.shape(t) != layout(&shape) {
                            return Err("a reshape that moves the row dimension".into());
                        }
                        Val::T { t, shape }
                    }
                    Val::Int { v, origin, .. } => Val::Int { v, shape, origin },
                    // `tensor_arg` hands indices out widened.
                    Val::IntRows { .. } => return Err("reshape of an unwidened index".into()),
                    Val::Host { v, .. } => Val::Host { v, shape },
                    Val::Zeros { .. } => Val::Zeros { shape },
                    Val::Sym(_) => return Err("reshape of a symbolic int".into()),
                };
                self.set(node, v)
            }
            "aten.linear.default" => {
                let x = self.tensor_arg(node, "input")?;
                let w = self.tensor_arg(node, "weight")?;
                let (wv, wshape) =
                    Self::host_values(&w).ok_or("a differentiable weight is not supported")?;
                let [n_out, n_in] = wshape[..] else {
                    return Err(format!("a weight of shape {wshape:?}"));
                };
                let bias = match node.arg("bias") {
                    Some(Arg::AsTensor(b)) => Some(
                        Self::host_values(&self.get(&b.name)?)
                            .ok_or("a differentiable bias is not supported")?,
                    ),
                    _ => None,
                };
                if let Some((b, _)) = &bias {
                    if b.len() != n_out {
                        return Err(format!("a bias of {} values for {n_out} outputs", b.len()));
                    }
                }
                let out = self.out_name(node)?.to_string();
                match x {
                    Val::T { t, shape } => {
                        if shape.len() != 2 || shape[1] != n_in {
                            return Err(format!(
                                "linear on input of shape {shape:?} with weight {wshape:?}"
                            ));
                        }
                        let mut wt = vec![T::zero(); n_in * n_out];
                        for o in 0..n_out {
                            for i in 0..n_in {
                                wt[i * n_out + o] = T::from_f64(wv[o * n_in + i]);
                            }
                        }
                        let wt = self.g.constant(wt, n_in, n_out, RowDomain::None);
                        let b = bias.map(|(bv, _)| {
                            self.g.constant(
                                bv.iter().map(|&x| T::from_f64(x)).collect(),
                                1,
                                n_out,
                                RowDomain::None,
                            )
                        });
                        let t = self.g.linear(t, wt, b).map_err(Self::map_err)?;
                        let shape = self.shape_of(&out)?;
                        self.set(node, Val::T { t, shape })
                    }
                    other => {
                        let (xv, xs) = Self::host_values(&other).ok_or("unexpected input")?;
                        let rows = numel(&xs) / n_in.max(1);
                        let mut y = vec![0.0; rows * n_out];
                        for r in 0..rows {
                            for o in 0..n_out {
                                let mut s = bias.as_ref().map_or(0.0, |(b, _)| b[o]);
                                for i in 0..n_in {
                                    s += xv[r * n_in + i] * wv[o * n_in + i];
                                }
                                y[r * n_out + o] = s;
                            }
                        }
                        let shape = self.shape_of(&out)?;
                        self.set(
                            node,
                            Val::Host {
                                v: Arc::new(y),
                                shape,
                            },
                        )
                    }
                }
            }
            "aten.lt.Scalar" => {
                let c = self.float_arg(node, "other")?;
                self.lt_mask(node, c)
            }
            "aten.to.dtype" => {
                let d = match self.arg(node, "dtype")? {
                    Arg::AsScalarType(d) => *d,
                    other => return Err(format!("dtype {other:?}")),
                };
                let x = self.tensor_arg(node, "self")?;
                let v = match (x, d) {
                    (v @ Val::T { .. }, dtype::FLOAT64 | dtype::FLOAT32) => v,
                    (Val::Int { v, shape, .. }, dtype::FLOAT64 | dtype::FLOAT32) => Val::Host {
                        v: Arc::new(v.iter().map(|&x| x as f64).collect()),
                        shape,
                    },
                    (
                        v @ (Val::Host { .. } | Val::Zeros { .. }),
                        dtype::FLOAT64 | dtype::FLOAT32 | dtype::BOOL,
                    ) => v,
                    (v @ Val::Int { .. }, dtype::INT64 | dtype::INT32) => v,
                    (Val::Host { v, shape }, dtype::INT64 | dtype::INT32) => Val::Int {
                        v: Arc::new(v.iter().map(|&x| x.trunc() as i64).collect()),
                        shape,
                        origin: Origin::Other,
                    },
                    (_, d) => return Err(format!("conversion to dtype code {d} is not supported")),
                };
                self.set(node, v)
            }
            "aten.zeros.default" | "aten.zeros_like.default" => {
                let shape = self.shape_of(self.out_name(node)?)?;
                self.set(node, Val::Zeros { shape })
            }
            "aten.index_add.default" => {
                let target = self.tensor_arg(node, "self")?;
                let idx = self.tensor_arg(node, "index")?;
                let src = self.tensor_arg(node, "source")?;
                if self.int_arg(node, "dim")? != 0 {
                    return Err("index_add along other than dimension 0".into());
                }
                let alpha = match node.arg("alpha") {
                    Some(Arg::AsFloat(a)) => *a,
                    Some(Arg::AsInt(a)) => *a as f64,
                    _ => 1.0,
                };
                let out = self.out_name(node)?.to_string();
                let shape = self.shape_of(&out)?;
                if self.domain_of(&out) != RowDomain::Atom {
                    return Err("index_add onto rows that are not atoms".into());
                }
                let rows = *shape.first().ok_or("index_add onto a scalar")?;
                let i = self.index_for(&idx, rows)?;
                let src_t = match src {
                    Val::T { t, .. } => t,
                    other => {
                        let (v, s) = Self::host_values(&other).ok_or("unexpected input")?;
                        let d = if s.first() == Some(&self.g.index_len(i))
                            && self.domain_of_len(s[0]) == RowDomain::Edge
                        {
                            RowDomain::Edge
                        } else {
                            RowDomain::None
                        };
                        self.constant(&v, &s, &s, d)?
                    }
                };
                let mut t = self.g.scatter_add(src_t, i).map_err(Self::map_err)?;
                if alpha != 1.0 {
                    t = self
                        .g
                        .unary(t, Unary::Scale(alpha))
                        .map_err(Self::map_err)?;
                }
                let t = match target {
                    Val::Zeros { .. } => t,
                    other => {
                        let v = self.binary_values(
                            Val::T {
                                t,
                                shape: shape.clone(),
                            },
                            other,
                            Bin::Add,
                            &out,
                        )?;
                        self.values.insert(out.clone(), v);
                        return Ok(());
                    }
                };
                self.set(node, Val::T { t, shape })
            }
            "aten.sum.default" => {
                let x = self.tensor_arg(node, "self")?;
                match x {
                    Val::T { t, .. } => {
                        let (_, cols) = self.g.shape(t);
                        let t = if cols > 1 {
                            self.g.sum_cols(t).map_err(Self::map_err)?
                        } else {
                            t
                        };
                        let t = match self.g.domain(t) {
                            RowDomain::Atom => self.g.segment_sum(t, self.inputs.atom_system).map_err(Self::map_err)?,
                            RowDomain::Edge => return Err("a sum over edges; scatter edge values onto atoms (index_add) first".into()),
                            _ => self.g.sum_rows(t).map_err(Self::map_err)?,
                        };
                        self.set(node, Val::T { t, shape: vec![] })
                    }
                    other => {
                        let (v, _) = Self::host_values(&other).ok_or("unexpected input")?;
                        self.set(
                            node,
                            Val::Host {
                                v: Arc::new(vec![v.iter().sum()]),
                                shape: vec![],
                            },
                        )
                    }
                }
            }
            "aten.sum.dim_IntList" => {
                let x = self.tensor_arg(node, "self")?;
                let dims = self.ints_arg(node, "dim")?.unwrap_or_default();
                let out = self.out_name(node)?.to_string();
                let shape = self.shape_of(&out)?;
                match x {
                    Val::T { t, shape: xs } => {
                        let last = xs.len().checked_sub(1).ok_or("sum of a scalar")?;
                        if xs.len() == 2 && dims.len() == 1 && norm_dim(dims[0], xs.len())? == last
                        {
                            let t = self.g.sum_cols(t).map_err(Self::map_err)?;
                            return self.set(node, Val::T { t, shape });
                        }
                        let t = self.sum_inner(t, &xs, &dims)?;
                        self.set(node, Val::T { t, shape })
                    }
                    _ => Err("a sum over dimensions of a constant tensor is not supported".into()),
                }
            }
            "aten.reshape.default" | "aten.expand.default" | "aten.expand_as.default" => {
                let x = self.tensor_arg(node, "self")?;
                let out = self.out_name(node)?.to_string();
                let v = self.reshape_or_expand(x, &out, op != "aten.reshape.default")?;
                self.set(node, v)
            }
            "aten.broadcast_tensors.default" => {
                let names = match self.arg(node, "tensors")? {
                    Arg::AsTensors(ts) => ts.clone(),
                    other => return Err(format!("tensors {other:?}")),
                };
                if names.len() != node.outputs.len() {
                    return Err("as many outputs as inputs expected".into());
                }
                for (t, out) in names.iter().zip(&node.outputs) {
                    let x = self.get(&t.name)?;
                    let v = self.reshape_or_expand(x, out, true)?;
                    self.values.insert(out.clone(), v);
                }
                Ok(())
            }
            "aten.ones_like.default" => {
                let shape = self.shape_of(self.out_name(node)?)?;
                self.set(
                    node,
                    Val::Host {
                        v: Arc::new(vec![1.0; numel(&shape)]),
                        shape,
                    },
                )
            }
            "aten.clamp_min.default" => {
                let m = self.float_arg(node, "min")?;
                match self.tensor_arg(node, "self")? {
                    Val::T { t, shape } => {
                        let k: Arc<dyn OpaqueKernel<T>> = Arc::new(ClampMin(m));
                        let t = self.g.rowwise(k, &[t]).map_err(Self::map_err)?;
                        self.set(node, Val::T { t, shape })
                    }
                    other => {
                        let (v, shape) = Self::host_values(&other).ok_or("unexpected input")?;
                        self.set(
                            node,
                            Val::Host {
                                v: Arc::new(v.iter().map(|x| x.max(m)).collect()),
                                shape,
                            },
                        )
                    }
                }
            }
            "aten.slice.Tensor" | "aten.narrow.default" => {
                let x = self.tensor_arg(node, "self")?;
                let shape = value_shape(&x)?;
                let dim = norm_dim(self.int_arg(node, "dim")?, shape.len())?;
                let n = *shape.get(dim).ok_or("slice of a scalar")? as i64;
                let clampi = |v: i64| if v < 0 { (v + n).clamp(0, n) } else { v.min(n) } as usize;
                let (start, len, step) = if op == "aten.narrow.default" {
                    (
                        clampi(self.int_arg(node, "start")?),
                        usize::try_from(self.int_arg(node, "length")?)
                            .map_err(|_| "negative length")?,
                        1,
                    )
                } else {
                    let start = match node.arg("start") {
                        Some(Arg::AsNone(_)) | None => 0,
                        _ => clampi(self.int_arg(node, "start")?),
                    };
                    let end = match node.arg("end") {
                        Some(Arg::AsNone(_)) | None => n as usize,
                        _ => clampi(self.int_arg(node, "end")?),
                    };
                    let step = usize::try_from(self.int_arg(node, "step")?)
                        .ok()
                        .filter(|&s| s > 0)
                        .ok_or("a step below 1")?;
                    (start, end.saturating_sub(start).div_ceil(step), step)
                };
                if start + len.saturating_sub(1) * step >= n as usize && len > 0 {
                    return Err("a slice past the end".into());
                }
                // The whole dimension (`x[0:x.shape[0]]`, also along rows) is `x`.
                if start == 0 && step == 1 && len == n as usize {
                    return self.set(node, x);
                }
                let out = self.out_name(node)?.to_string();
                let v = self.strided(x, &out, |sh, d| slice_map(sh, d, start, len, step), dim)?;
                self.set(node, v)
            }
            "aten.permute.default" => {
                let x = self.tensor_arg(node, "self")?;
                let shape = value_shape(&x)?;
                let dims = self.ints_arg(node, "dims")?.unwrap_or_default();
                let perm: Vec<usize> = dims
                    .iter()
                    .map(|&d| norm_dim(d, shape.len()))
                    .collect::<Res<_>>()?;
                let mut sorted = perm.clone();
                sorted.sort_unstable();
                if sorted != (0..shape.len()).collect::<Vec<_>>() {
                    return Err(format!("{dims:?} is not a permutation"));
                }
                let out = self.out_name(node)?.to_string();
                let v = match x {
                    Val::T { t, shape } => {
                        if perm[0] != 0 {
                            return Err("a permute that moves the row dimension".into());
                        }
                        let inner: Vec<usize> = perm[1..].iter().map(|p| p - 1).collect();
                        let map = permute_map(&shape[1..], &inner);
                        let t = self.row_gather(
                            "permute",
                            &[t],
                            map.into_iter().map(|c| (0, c)).collect(),
                        )?;
                        Val::T {
                            t,
                            shape: self.shape_of(&out)?,
                        }
                    }
                    other => {
                        let (v, shape) = Self::host_values(&other).ok_or("unexpected input")?;
                        let map = permute_map(&shape, &perm);
                        Val::Host {
                            v: Arc::new(map.iter().map(|&k| v[k]).collect()),
                            shape: self.shape_of(&out)?,
                        }
                    }
                };
                self.set(node, v)
            }
            "aten.cat.default" | "aten.stack.default" => {
                let names = match self.arg(node, "tensors")? {
                    Arg::AsTensors(ts) => ts.clone(),
                    other => return Err(format!("tensors {other:?}")),
                };
                let out = self.out_name(node)?.to_string();
                let out_shape = self.shape_of(&out)?;
                let dim = norm_dim(self.int_arg(node, "dim")?, out_shape.len())?;
                let parts: Vec<Val> = names
                    .iter()
                    .map(|t| self.get(&t.name))
                    .collect::<Res<_>>()?;
                // Each part's shape with the concatenated dimension explicit
                // (stack inserts a dimension of 1).
                let mut shapes = Vec::new();
                for p in &parts {
                    let mut s = value_shape(p)?;
                    if op == "aten.stack.default" {
                        s.insert(dim.min(s.len()), 1);
                    }
                    shapes.push(s);
                }
                let v = self.concat(parts, shapes, dim, &out)?;
                self.set(node, v)
            }
            "aten.einsum.default" => {
                let eq = match self.arg(node, "equation")? {
                    Arg::AsString(s) => s.replace(' ', ""),
                    other => return Err(format!("equation {other:?}")),
                };
                let names = match self.arg(node, "tensors")? {
                    Arg::AsTensors(ts) => ts.clone(),
                    other => return Err(format!("tensors {other:?}")),
                };
                let (lhs, rhs) = eq
                    .split_once("->")
                    .ok_or("an einsum without an explicit output (`->`)")?;
                let specs: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
                let out_labels: Vec<char> = rhs.chars().collect();
                if specs.len() != names.len() {
                    return Err(format!(
                        "{} operands for {} tensors",
                        specs.len(),
                        names.len()
                    ));
                }
                let parts: Vec<Val> = names
                    .iter()
                    .map(|t| self.get(&t.name))
                    .collect::<Res<_>>()?;
                let out = self.out_name(node)?.to_string();
                let v = self.einsum(parts, specs, out_labels, &out)?;
                self.set(node, v)
            }
            "aten.tensordot.default" => {
                let a = self.tensor_arg(node, "self")?;
                let b = self.tensor_arg(node, "other")?;
                let da = self.ints_arg(node, "dims_self")?.unwrap_or_default();
                let db = self.ints_arg(node, "dims_other")?.unwrap_or_default();
                let (sa, sb) = (value_shape(&a)?, value_shape(&b)?);
                if da.len() != db.len() {
                    return Err("dims_self and dims_other differ in length".into());
                }
                let letters: Vec<char> = "abcdefghijklmnopqrstuvwxyz".chars().collect();
                if sa.len() + sb.len() > letters.len() {
                    return Err("too many dimensions".into());
                }
                let la: Vec<char> = letters[..sa.len()].to_vec();
                let mut lb: Vec<char> = letters[sa.len()..sa.len() + sb.len()].to_vec();
                let mut contracted_a = Vec::new();
                for (&x, &y) in da.iter().zip(&db) {
                    let (x, y) = (norm_dim(x, sa.len())?, norm_dim(y, sb.len())?);
                    lb[y] = la[x];
                    contracted_a.push(x);
                }
                let mut out_labels: Vec<char> = (0..sa.len())
                    .filter(|k| !contracted_a.contains(k))
                    .map(|k| la[k])
                    .collect();
                out_labels.extend(lb.iter().filter(|l| !la.contains(l)));
                let out = self.out_name(node)?.to_string();
                let v = self.einsum(vec![a, b], vec![la, lb], out_labels, &out)?;
                self.set(node, v)
            }
            other => self
                .mlip_node(node)
                .unwrap_or_else(|| Err(format!("op `{other}` is not supported"))),
        }
    }
}
