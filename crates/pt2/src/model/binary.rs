//! Element-wise ops of an imported graph: unary maps, broadcast binary ops on engine tensors and host values, and the index tensors they gather through.

use super::*;

impl<T: Scalar> Run<'_, T> {
    pub(super) fn unary(&mut self, node: &Node, f: Unary, host: fn(f64) -> f64) -> Res<()> {
        let x = self.tensor_arg(node, "self")?;
        let v = match x {
            Val::T { t, shape } => Val::T {
                t: self.g.unary(t, f).map_err(Self::map_err)?,
                shape,
            },
            other => {
                let (v, shape) = Self::host_values(&other).ok_or("unexpected input")?;
                Val::Host {
                    v: Arc::new(v.iter().map(|&x| host(x)).collect()),
                    shape,
                }
            }
        };
        self.set(node, v)
    }

    /// `a ⊕ b` for every combination of engine tensors, host tensors and scalars.
    pub(super) fn binary(&mut self, node: &Node, op: Bin) -> Res<()> {
        let a = self.tensor_arg(node, "self")?;
        let alpha = match node.arg("alpha") {
            Some(Arg::AsInt(v)) => *v as f64,
            Some(Arg::AsFloat(v)) => *v,
            _ => 1.0,
        };
        let out = self.out_name(node)?.to_string();
        let result = match self.arg(node, "other")? {
            Arg::AsFloat(_) | Arg::AsInt(_) => {
                let c = self.float_arg(node, "other")? * alpha;
                match a {
                    Val::T { t, shape } => {
                        let f = match op {
                            Bin::Add => Unary::AddScalar(c),
                            Bin::Sub => Unary::AddScalar(-c),
                            Bin::Mul => Unary::Scale(c),
                            Bin::Div => Unary::Scale(1.0 / c),
                        };
                        let t = self.g.unary(t, f).map_err(Self::map_err)?;
                        Val::T { t, shape }
                    }
                    other => {
                        let (v, shape) = Self::host_values(&other).ok_or("unexpected input")?;
                        Val::Host {
                            v: Arc::new(v.iter().map(|&x| op.host(x, c)).collect()),
                            shape,
                        }
                    }
                }
            }
            Arg::AsTensor(bn) => {
                let mut b = self.get(&bn.name)?;
                if alpha != 1.0 {
                    b = match b {
                        Val::T { t, shape } => Val::T {
                            t: self
                                .g
                                .unary(t, Unary::Scale(alpha))
                                .map_err(Self::map_err)?,
                            shape,
                        },
                        other => {
                            let (v, shape) = Self::host_values(&other).ok_or("unexpected input")?;
                            Val::Host {
                                v: Arc::new(v.iter().map(|x| x * alpha).collect()),
                                shape,
                            }
                        }
                    };
                }
                self.binary_values(a, b, op, &out)?
            }
            other => {
                return Err(format!(
                    "argument `other` should be a tensor or a number, found {other:?}"
                ))
            }
        };
        self.values.insert(out, result);
        Ok(())
    }

    pub(super) fn binary_values(&mut self, a: Val, b: Val, op: Bin, out: &str) -> Res<Val> {
        let out_shape = self.shape_of(out)?;
        let domain = self.domain_of(out);
        match (&a, &b) {
            (Val::T { .. }, _) | (_, Val::T { .. }) => {}
            _ => {
                let (av, ash) = Self::host_values(&a).ok_or("unexpected input")?;
                let (bv, bsh) = Self::host_values(&b).ok_or("unexpected input")?;
                let shape = broadcast_shape(&ash, &bsh)?;
                let av = broadcast_host(&av, &ash, &shape)?;
                let bv = broadcast_host(&bv, &bsh, &shape)?;
                return Ok(Val::Host {
                    v: Arc::new(av.iter().zip(&bv).map(|(&x, &y)| op.host(x, y)).collect()),
                    shape,
                });
            }
        }
        // Host operands become constants: one row broadcast over the rows
        // when they have no row dimension (Allegro's path weights against
        // `[E, 4, 4, 4, 4]`: 256 values, not 256 per edge), else of the
        // output's full shape.
        let as_tensor = |v: &Val, run: &mut Self| -> Res<(Tensor, Vec<usize>)> {
            match v {
                Val::T { t, shape } => Ok((*t, shape.clone())),
                other => {
                    let (hv, hs) = Self::host_values(other).ok_or("unexpected input")?;
                    let rowless = !out_shape.is_empty()
                        && (hs.len() < out_shape.len() || hs.first() == Some(&1));
                    if rowless {
                        let mut one_row = out_shape.clone();
                        one_row[0] = 1;
                        let c = numel(&one_row);
                        let values = broadcast_host(&hv, &hs, &one_row)?
                            .into_iter()
                            .map(T::from_f64)
                            .collect();
                        let t = run.g.constant(values, 1, c, RowDomain::None);
                        return Ok((t, one_row));
                    }
                    // With the output's rows: kept at its own shape (the
                    // row-broadcast kernel reads it), not widened to the output's.
                    if hs.len() == out_shape.len() && hs.first() == out_shape.first() {
                        return Ok((run.constant(&hv, &hs, &hs, domain)?, hs));
                    }
                    Ok((
                        run.constant(&hv, &hs, &out_shape, domain)?,
                        out_shape.clone(),
                    ))
                }
            }
        };
        let (mut ta, sa) = as_tensor(&a, self)?;
        let (mut tb, sb) = as_tensor(&b, self)?;
        let (mut sa, mut sb) = (sa, sb);
        // The engine broadcasts its second operand only: put the smaller
        // operand second (commuting, or rewriting a − b as −(b − a), a / b
        // as a · (1/b)), or expand the first by multiplying ones.
        let full = |s: &[usize]| s == out_shape.as_slice();
        let mut negate = false;
        if !full(&sa) {
            if full(&sb) && matches!(op, Bin::Add | Bin::Mul | Bin::Sub) {
                std::mem::swap(&mut ta, &mut tb);
                std::mem::swap(&mut sa, &mut sb);
                negate = op == Bin::Sub;
            } else if let Some(t) = self.row_broadcast(ta, &sa, tb, &sb, op, &out_shape)? {
                return Ok(Val::T {
                    t,
                    shape: out_shape,
                });
            } else {
                let ones = self.constant(&[1.0], &[], &out_shape, domain)?;
                ta = self.engine_binary(ones, ta, &sa, Bin::Mul, &out_shape)?;
                sa = out_shape.clone();
            }
        }
        let _ = sa;
        let mut t = self.engine_binary(ta, tb, &sb, op, &out_shape)?;
        if negate {
            t = self.g.unary(t, Unary::Neg).map_err(Self::map_err)?;
        }
        Ok(Val::T {
            t,
            shape: out_shape,
        })
    }

    /// `a ⊕ b` with `a` of the output's shape and `b` broadcast the way the
    /// engine does (full, per row, per column or scalar).
    pub(super) fn engine_binary(
        &mut self,
        a: Tensor,
        b: Tensor,
        b_shape: &[usize],
        op: Bin,
        out: &[usize],
    ) -> Res<Tensor> {
        let n = out.len();
        if b_shape.len() > n {
            return Err(format!("cannot broadcast {b_shape:?} to {out:?}"));
        }
        let mut padded = vec![1; n - b_shape.len()];
        padded.extend_from_slice(b_shape);
        let (r, c) = layout(out);
        let (br, bc) = self.g.shape(b);
        let rest_is = |want: &[usize]| padded.iter().skip(1).eq(want.iter());
        let ok = padded.as_slice() == out
            || (n >= 1 && padded[0] == out[0] && padded.iter().skip(1).all(|&d| d == 1))
            || (n >= 1 && padded[0] == 1 && rest_is(&out[1..]))
            || padded.iter().all(|&d| d == 1);
        let engine_fits =
            (br, bc) == (r, c) || (br, bc) == (r, 1) || (br, bc) == (1, c) || (br, bc) == (1, 1);
        // Broadcasting within rows (`[E, 1, 4]` against `[E, 4, 4]`).
        if !(ok && engine_fits) {
            if let Some(t) = self.row_broadcast(a, out, b, b_shape, op, out)? {
                return Ok(t);
            }
            return Err(format!(
                "broadcasting {b_shape:?} against {out:?} is not supported by the engine mapping"
            ));
        }
        let r = match op {
            Bin::Add => self.g.add(a, b),
            Bin::Sub => self.g.sub(a, b),
            Bin::Mul => self.g.mul(a, b),
            Bin::Div => self.g.div(a, b),
        };
        r.map_err(Self::map_err)
    }

    /// `a ⊕ b` broadcast within rows by one [`RowBroadcast`] kernel, which
    /// reads each operand at its own shape: `None` unless each operand's
    /// engine block is its shape (left-padded with ones to the output's
    /// rank) with the output's rows or one row.
    pub(super) fn row_broadcast(
        &mut self,
        a: Tensor,
        a_shape: &[usize],
        b: Tensor,
        b_shape: &[usize],
        op: Bin,
        out: &[usize],
    ) -> Res<Option<Tensor>> {
        let Some(&rows) = out.first() else {
            return Ok(None);
        };
        let mut maps = Vec::with_capacity(2);
        let mut per_row = [true; 2];
        for (k, (t, shape)) in [(a, a_shape), (b, b_shape)].into_iter().enumerate() {
            if shape.len() > out.len() {
                return Ok(None);
            }
            let mut padded = vec![1; out.len() - shape.len()];
            padded.extend_from_slice(shape);
            if (padded[0] != rows && padded[0] != 1) || self.g.shape(t) != layout(&padded) {
                return Ok(None);
            }
            per_row[k] = padded[0] == rows;
            let iota: Vec<f64> = (0..numel(&padded[1..])).map(|k| k as f64).collect();
            let map = broadcast_host(&iota, &padded[1..], &out[1..])?;
            maps.push(map.into_iter().map(|k| k as u32).collect::<Vec<u32>>());
        }
        let (Some(b_map), Some(a_map)) = (maps.pop(), maps.pop()) else {
            return Ok(None);
        };
        let op = match op {
            Bin::Add => BroadcastOp::Add,
            Bin::Sub => BroadcastOp::Sub,
            Bin::Mul => BroadcastOp::Mul,
            Bin::Div => BroadcastOp::Div,
        };
        if !(per_row[0] || per_row[1]) {
            return Ok(None);
        }
        let k: Arc<dyn OpaqueKernel<T>> = Arc::new(RowBroadcast {
            op,
            maps: [a_map, b_map],
            per_row,
        });
        self.g.rowwise(k, &[a, b]).map(Some).map_err(Self::map_err)
    }

    /// The engine index of an integer tensor used to index atom rows.
    pub(super) fn index_for(&mut self, idx: &Val, target_rows: usize) -> Res<Index> {
        let edges = self.inputs.edges.ok_or("no edge list")?;
        match idx {
            Val::Int {
                origin: Origin::Center,
                ..
            } => Ok(edges.center),
            Val::Int {
                origin: Origin::Neighbor,
                ..
            } => Ok(edges.neighbor),
            Val::Int { v, shape, .. } => {
                let key = Arc::as_ptr(v) as usize;
                if let Some(&i) = self.registered.get(&key) {
                    return Ok(i);
                }
                if shape.len() != 1 {
                    return Err(format!(
                        "an index of shape {shape:?}; 1-d indices are supported"
                    ));
                }
                // A copy of the runtime's centre or neighbour index (through
                // an expand, a `scatter_add` index, …) is that index: a halo
                // read or scatter like the original.
                for known in [edges.center, edges.neighbor] {
                    let values = self.g.index_values(known);
                    if values.len() == v.len()
                        && values
                            .iter()
                            .zip(v.iter())
                            .all(|(&a, &b)| i64::from(a) == b)
                    {
                        self.registered.insert(key, known);
                        return Ok(known);
                    }
                }
                let values: Vec<u32> = v
                    .iter()
                    .map(|&x| {
                        u32::try_from(x)
                            .ok()
                            .filter(|&u| (u as usize) < target_rows)
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(|| format!("an index value outside 0..{target_rows}"))?;
                let domain = if shape[0] == self.g.index_len(edges.center) {
                    RowDomain::Edge
                } else {
                    RowDomain::Atom
                };
                let i = self
                    .g
                    .index(
                        Arc::new(values),
                        domain,
                        RowDomain::Atom,
                        target_rows,
                        "pt2_index",
                    )
                    .map_err(Self::map_err)?;
                self.registered.insert(key, i);
                Ok(i)
            }
            _ => Err("an index that is not an integer tensor".into()),
        }
    }
}
