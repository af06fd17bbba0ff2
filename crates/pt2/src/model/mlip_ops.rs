//! The ops that exported NequIP, Allegro and MACE graphs add to the
//! importer's base set: views and copies (functionalized in-place writes),
//! `scatter_add` / `index_select` (the same halo reads and scatters as
//! `index` / `index_add`), matrix products with constant weights, and a few
//! element-wise maps.

use super::*;
use crate::ir::TensorName;
use crate::rowops::Sinc;

impl<T: Scalar> Run<'_, T> {
    /// Maps `node` if it is one of this module's ops; `None` otherwise.
    pub(super) fn mlip_node(&mut self, node: &Node) -> Option<Res<()>> {
        let r = match node.op.as_str() {
            "aten.view.default" | "aten._unsafe_view.default" => self.view(node),
            "aten.clone.default" | "aten.alias.default" => self
                .tensor_arg(node, "self")
                .and_then(|x| self.set(node, x)),
            "aten._to_copy.default" => self.copy_to_dtype(node),
            "aten.new_zeros.default" => self
                .shape_of(self.out_name(node).unwrap_or_default())
                .and_then(|shape| self.set(node, Val::Zeros { shape })),
            "aten.ones.default" => self
                .shape_of(self.out_name(node).unwrap_or_default())
                .and_then(|shape| {
                    let v = Arc::new(vec![1.0; numel(&shape)]);
                    self.set(node, Val::Host { v, shape })
                }),
            // The functional `copy`: `src` broadcast to the shape of `self`.
            "aten.copy.default" => self.tensor_arg(node, "src").and_then(|src| {
                let out = self.out_name(node)?.to_string();
                let v = self.reshape_or_expand(src, &out, true)?;
                self.set(node, v)
            }),
            "aten.slice_scatter.default" => self.slice_scatter(node),
            "aten.scatter_add.default" => self.scatter_add(node),
            "aten.index_select.default" => self.index_select(node),
            "aten.mm.default" | "aten.matmul.default" => self.matmul(node),
            "aten.addcmul.default" => self.addcmul(node),
            "aten.rsub.Scalar" => self.rsub(node),
            "aten.square.default" => self.unary(node, Unary::Square, |x| x * x),
            "aten.sinc.default" => self.sinc(node),
            "aten.pow.Tensor_Tensor" => self.pow_tensor(node),
            "aten.lt.Tensor" => self.lt_tensor(node),
            "aten.one_hot.default" => self.one_hot(node),
            "_operator.mul" | "_operator.add" | "_operator.sub" | "_operator.floordiv" => {
                self.sym_arith(node)
            }
            _ => return None,
        };
        Some(r)
    }

    /// The sum of each row of `t` (shape `shape`) over the non-row
    /// dimensions `dims`: a row-local contraction.
    pub(super) fn sum_inner(&mut self, t: Tensor, shape: &[usize], dims: &[i64]) -> Res<Tensor> {
        let summed: Vec<usize> = dims
            .iter()
            .map(|&d| norm_dim(d, shape.len()))
            .collect::<Res<_>>()?;
        if summed.is_empty() || summed.contains(&0) {
            return Err("a sum over the row dimension; sum over atoms with `sum()`".into());
        }
        let labels: Vec<char> = ('a'..='z').take(shape.len() - 1).collect();
        if labels.len() + 1 != shape.len() {
            return Err("too many dimensions".into());
        }
        let out: Vec<char> = (1..shape.len())
            .filter(|d| !summed.contains(d))
            .map(|d| labels[d - 1])
            .collect();
        let operand = EinsumOperand {
            labels,
            sizes: shape[1..].to_vec(),
            constant: None,
        };
        let kernel = RowEinsum::new("sum", vec![operand], &out)?;
        self.row_contraction(kernel, &[t])
    }

    fn view(&mut self, node: &Node) -> Res<()> {
        let x = self.tensor_arg(node, "self")?;
        let out = self.out_name(node)?.to_string();
        let shape = self.shape_of(&out)?;
        // A view that splits each row into `m` (`[E, 8] → [4E, 2]`, Allegro's
        // weighted channels) keeps the engine rows: the value's shape is
        // written `[E, m, ..]`, the same elements in the same order.
        if let Val::T { t, shape: xs } = &x {
            let (rows, cols) = self.g.shape(*t);
            // Rows per row: from the row counts, or with no rows (no edges)
            // from the column counts.
            let per_row = match shape.first() {
                Some(&r) if rows > 0 && r != rows && r % rows == 0 => Some(r / rows),
                Some(0) if rows == 0 => {
                    let out_cols = numel(&shape[1..]);
                    (out_cols > 0 && cols != out_cols && cols % out_cols == 0)
                        .then(|| cols / out_cols)
                }
                _ => None,
            };
            if let Some(m) =
                per_row.filter(|_| xs.first() == Some(&rows) && numel(xs) == numel(&shape))
            {
                let mut split = vec![rows, m];
                split.extend_from_slice(&shape[1..]);
                return self.set(
                    node,
                    Val::T {
                        t: *t,
                        shape: split,
                    },
                );
            }
        }
        let v = self.reshape_or_expand(x, &out, false)?;
        self.set(node, v)
    }

    /// `_to_copy` with a dtype is `to.dtype`; without one it is a copy.
    fn copy_to_dtype(&mut self, node: &Node) -> Res<()> {
        match node.arg("dtype") {
            Some(d @ Arg::AsScalarType(_)) => {
                let as_to = Node {
                    op: "aten.to.dtype".into(),
                    args: vec![
                        ("self".into(), self.arg(node, "self")?.clone()),
                        ("dtype".into(), d.clone()),
                    ],
                    outputs: node.outputs.clone(),
                };
                self.node(&as_to)
            }
            _ => {
                let x = self.tensor_arg(node, "self")?;
                self.set(node, x)
            }
        }
    }

    /// `self` with `self[.., start:end:step, ..] = src` along `dim`.
    fn slice_scatter(&mut self, node: &Node) -> Res<()> {
        let base = self.tensor_arg(node, "self")?;
        let src = self.tensor_arg(node, "src")?;
        let out = self.out_name(node)?.to_string();
        let shape = value_shape(&base)?;
        let src_shape = value_shape(&src)?;
        let dim = norm_dim(self.int_arg(node, "dim").unwrap_or(0), shape.len())?;
        let n = *shape.get(dim).ok_or("slice_scatter of a scalar")? as i64;
        let clampi = |v: i64| if v < 0 { (v + n).clamp(0, n) } else { v.min(n) } as usize;
        let start = match node.arg("start") {
            Some(Arg::AsNone(_)) | None => 0,
            _ => clampi(self.int_arg(node, "start")?),
        };
        let end = match node.arg("end") {
            Some(Arg::AsNone(_)) | None => n as usize,
            _ => clampi(self.int_arg(node, "end")?),
        };
        let step = match node.arg("step") {
            Some(Arg::AsNone(_)) | None => 1,
            _ => usize::try_from(self.int_arg(node, "step")?)
                .ok()
                .filter(|&s| s > 0)
                .ok_or("a step below 1")?,
        };
        let len = end.saturating_sub(start).div_ceil(step);
        let mut want = shape.clone();
        want[dim] = len;
        if src_shape != want {
            return Err(format!(
                "slice_scatter of {src_shape:?} into {len} positions of {shape:?}"
            ));
        }
        // The whole dimension: the result is `src` (nequip's functionalized
        // `out.narrow(..).copy_(x)` into fresh zeros).
        if start == 0 && step == 1 && len == n as usize {
            let v = self.reshape_or_expand(src, &out, false)?;
            return self.set(node, v);
        }
        let engine = matches!(base, Val::T { .. }) || matches!(src, Val::T { .. });
        let from = usize::from(engine);
        if engine && dim == 0 {
            return Err("a slice_scatter along the row dimension".into());
        }
        // Source (operand, flat index within the operand's row) of each output element.
        let inner = &shape[from..];
        let (ost, sst) = (strides(inner), strides(&src_shape[from..]));
        let d = dim - from;
        let total = numel(inner);
        let mut map = Vec::with_capacity(total);
        for i in 0..total {
            let c = (i / ost[d]) % inner[d];
            if c >= start && (c - start) % step == 0 && (c - start) / step < len {
                let mut flat = 0;
                for (k, (&os, &ss)) in ost.iter().zip(&sst).enumerate() {
                    let idx = (i / os) % inner[k];
                    flat += if k == d { (c - start) / step } else { idx } * ss;
                }
                map.push((1, flat));
            } else {
                map.push((0, i));
            }
        }
        if !engine {
            let (bv, _) = Self::host_values(&base).ok_or("unexpected input")?;
            let (sv, _) = Self::host_values(&src).ok_or("unexpected input")?;
            let v = map
                .iter()
                .map(|&(p, f)| if p == 0 { bv[f] } else { sv[f] })
                .collect();
            let v = Val::Host {
                v: Arc::new(v),
                shape,
            };
            return self.set(node, v);
        }
        let domain = self.domain_of(&out);
        let mut tensors = Vec::with_capacity(2);
        for (p, s) in [(base, &shape), (src, &src_shape)] {
            tensors.push(match p {
                Val::T { t, .. } => t,
                other => {
                    let (v, hs) = Self::host_values(&other).ok_or("unexpected input")?;
                    self.constant(&v, &hs, s, domain)?
                }
            });
        }
        let t = self.row_gather("slice_scatter", &tensors, map)?;
        self.set(node, Val::T { t, shape })
    }

    /// Stores a host value under a name of its own, for a rewritten node to read.
    fn synthetic(&mut self, node: &Node, suffix: &str, v: Val) -> Res<Arg> {
        let name = format!("{}::{suffix}", self.out_name(node)?);
        self.values.insert(name.clone(), v);
        Ok(Arg::AsTensor(TensorName { name }))
    }

    /// `scatter_add` along dimension 0 with an index that repeats one atom
    /// per source row (what `index_add` onto atom rows exports as): the
    /// engine scatter of `index_add`.
    fn scatter_add(&mut self, node: &Node) -> Res<()> {
        if self.int_arg(node, "dim")? != 0 {
            return Err("scatter_add along other than dimension 0".into());
        }
        let src = self.tensor_arg(node, "src")?;
        let raw_index = match self.arg(node, "index")? {
            Arg::AsTensor(t) => self.get_raw(&t.name)?.clone(),
            other => {
                return Err(format!(
                    "argument `index` should be a tensor, found {other:?}"
                ))
            }
        };
        // An index broadcast from one value per row is that column, with
        // where it came from (the runtime's centre or neighbour index).
        if let Val::IntRows {
            rows,
            shape,
            origin,
        } = raw_index
        {
            let src_shape = value_shape(&src)?;
            if shape != src_shape {
                return Err(format!(
                    "scatter_add with an index of shape {shape:?} for a source of shape {src_shape:?}"
                ));
            }
            let n = rows.len();
            let index = self.synthetic(
                node,
                "index",
                Val::Int {
                    v: rows,
                    shape: vec![n],
                    origin,
                },
            )?;
            return self.scatter_as_index_add(node, index);
        }
        let (iv, ishape) = int_values(&raw_index.widened()?)?;
        let src_shape = value_shape(&src)?;
        if ishape != src_shape {
            return Err(format!(
                "scatter_add with an index of shape {ishape:?} for a source of shape {src_shape:?}"
            ));
        }
        let rows = *ishape.first().ok_or("scatter_add of a scalar")?;
        let width = numel(&ishape[1..]);
        let mut column = Vec::with_capacity(rows);
        for r in 0..rows {
            let row = &iv[r * width..(r + 1) * width];
            if row.iter().any(|&x| x != row[0]) {
                return Err(
                    "scatter_add with an index that differs within a row (only one target row per source row is supported)"
                        .into(),
                );
            }
            column.push(row[0]);
        }
        let index = self.synthetic(
            node,
            "index",
            Val::Int {
                v: Arc::new(column),
                shape: vec![rows],
                origin: Origin::Other,
            },
        )?;
        self.scatter_as_index_add(node, index)
    }

    /// The `scatter_add` `node` as an `index_add` of its source through
    /// `index` (one target row per source row).
    fn scatter_as_index_add(&mut self, node: &Node, index: Arg) -> Res<()> {
        let as_index_add = Node {
            op: "aten.index_add.default".into(),
            args: vec![
                ("self".into(), self.arg(node, "self")?.clone()),
                ("dim".into(), Arg::AsInt(0)),
                ("index".into(), index),
                ("source".into(), self.arg(node, "src")?.clone()),
                ("alpha".into(), Arg::AsInt(1)),
            ],
            outputs: node.outputs.clone(),
        };
        self.node(&as_index_add)
    }

    /// `index_select` along dimension 0 is `x[index]`.
    fn index_select(&mut self, node: &Node) -> Res<()> {
        let x = self.tensor_arg(node, "self")?;
        let shape = value_shape(&x)?;
        if norm_dim(self.int_arg(node, "dim")?, shape.len())? != 0 {
            return Err("index_select along other than dimension 0".into());
        }
        let index = match self.arg(node, "index")? {
            Arg::AsTensor(t) => t.clone(),
            other => return Err(format!("index {other:?}")),
        };
        let as_index = Node {
            op: "aten.index.Tensor".into(),
            args: vec![
                ("self".into(), self.arg(node, "self")?.clone()),
                ("indices".into(), Arg::AsTensors(vec![index])),
            ],
            outputs: node.outputs.clone(),
        };
        self.node(&as_index)
    }

    /// `a @ b` with a constant matrix `b`: per-row `a` times `b` is the
    /// engine's linear map (2-d `a`) or a row-local contraction over the
    /// last dimension (N-d `a`); constants multiply on the host.
    fn matmul(&mut self, node: &Node) -> Res<()> {
        let a = self.tensor_arg(node, "self")?;
        let b_name = if node.arg("mat2").is_some() {
            "mat2"
        } else {
            "other"
        };
        let b = self.tensor_arg(node, b_name)?;
        let (sa, sb) = (value_shape(&a)?, value_shape(&b)?);
        let (Some(&k), &[k2, m]) = (sa.last(), sb.as_slice()) else {
            return Err(format!(
                "a matrix product of shapes {sa:?} and {sb:?}; a 2-d second operand is supported"
            ));
        };
        if k != k2 || sa.len() < 2 {
            return Err(format!("a matrix product of shapes {sa:?} and {sb:?}"));
        }
        let (bv, _) = Self::host_values(&b)
            .ok_or("a matrix product whose second operand depends on positions")?;
        let mut shape = sa.clone();
        *shape.last_mut().ok_or("a matrix product of a scalar")? = m;
        match a {
            Val::T { t, .. } if sa.len() == 2 => {
                let w = self.g.constant(
                    bv.iter().map(|&x| T::from_f64(x)).collect(),
                    k,
                    m,
                    RowDomain::None,
                );
                let t = self.g.linear(t, w, None).map_err(Self::map_err)?;
                self.set(node, Val::T { t, shape })
            }
            Val::T { t, .. } => {
                // Row labels a, b, … for the inner dimensions; `y` contracted, `z` the output column.
                let inner: Vec<char> = ('a'..='x').take(sa.len() - 2).collect();
                if inner.len() + 2 != sa.len() {
                    return Err("too many dimensions".into());
                }
                let mut la = inner.clone();
                la.push('y');
                let mut lo = inner;
                lo.push('z');
                let operands = vec![
                    EinsumOperand {
                        labels: la,
                        sizes: sa[1..].to_vec(),
                        constant: None,
                    },
                    EinsumOperand {
                        labels: vec!['y', 'z'],
                        sizes: vec![k, m],
                        constant: Some(bv.to_vec()),
                    },
                ];
                let kernel = RowEinsum::new("matmul", operands, &lo)?;
                let t = self.row_contraction(kernel, &[t])?;
                self.set(node, Val::T { t, shape })
            }
            other => {
                let (av, _) = Self::host_values(&other).ok_or("unexpected input")?;
                let rows = numel(&sa[..sa.len() - 1]);
                let mut y = vec![0.0; rows * m];
                for r in 0..rows {
                    for (kk, &x) in av[r * k..(r + 1) * k].iter().enumerate() {
                        for (o, yo) in y[r * m..(r + 1) * m].iter_mut().enumerate() {
                            *yo += x * bv[kk * m + o];
                        }
                    }
                }
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

    /// `self + value · tensor1 · tensor2`.
    fn addcmul(&mut self, node: &Node) -> Res<()> {
        let base = self.tensor_arg(node, "self")?;
        let t1 = self.tensor_arg(node, "tensor1")?;
        let t2 = self.tensor_arg(node, "tensor2")?;
        let value = match node.arg("value") {
            Some(Arg::AsFloat(v)) => *v,
            Some(Arg::AsInt(v)) => *v as f64,
            _ => 1.0,
        };
        let out = self.out_name(node)?.to_string();
        let mut prod = self.binary_values(t1, t2, Bin::Mul, &out)?;
        if value != 1.0 {
            let c = Val::Host {
                v: Arc::new(vec![value]),
                shape: vec![],
            };
            prod = self.binary_values(prod, c, Bin::Mul, &out)?;
        }
        let v = self.binary_values(base, prod, Bin::Add, &out)?;
        self.set(node, v)
    }

    /// `other − alpha · self` with a number `other`.
    fn rsub(&mut self, node: &Node) -> Res<()> {
        let x = self.tensor_arg(node, "self")?;
        let c = self.float_arg(node, "other")?;
        let alpha = match node.arg("alpha") {
            Some(Arg::AsFloat(v)) => *v,
            Some(Arg::AsInt(v)) => *v as f64,
            _ => 1.0,
        };
        let v = match x {
            Val::T { t, shape } => {
                let t = self
                    .g
                    .unary(t, Unary::Scale(-alpha))
                    .map_err(Self::map_err)?;
                let t = self
                    .g
                    .unary(t, Unary::AddScalar(c))
                    .map_err(Self::map_err)?;
                Val::T { t, shape }
            }
            other => {
                let (v, shape) = Self::host_values(&other).ok_or("unexpected input")?;
                Val::Host {
                    v: Arc::new(v.iter().map(|&x| c - alpha * x).collect()),
                    shape,
                }
            }
        };
        self.set(node, v)
    }

    /// torch's normalised sinc, sin(πx)/(πx) (1 at 0).
    fn sinc(&mut self, node: &Node) -> Res<()> {
        let v = match self.tensor_arg(node, "self")? {
            Val::T { t, shape } => {
                let k: Arc<dyn OpaqueKernel<T>> = Arc::new(Sinc);
                let t = self.g.rowwise(k, &[t]).map_err(Self::map_err)?;
                Val::T { t, shape }
            }
            other => {
                let (v, shape) = Self::host_values(&other).ok_or("unexpected input")?;
                Val::Host {
                    v: Arc::new(v.iter().map(|&x| crate::rowops::sinc(x)).collect()),
                    shape,
                }
            }
        };
        self.set(node, v)
    }

    /// `x ** p` with a constant scalar tensor `p`.
    fn pow_tensor(&mut self, node: &Node) -> Res<()> {
        let e = self.tensor_arg(node, "exponent")?;
        let (ev, _) = Self::host_values(&e).ok_or("an exponent that depends on positions")?;
        let [p] = ev[..] else {
            return Err("an exponent tensor of more than one value".into());
        };
        let v = match self.tensor_arg(node, "self")? {
            Val::T { t, shape } => {
                let f = if p == 2.0 {
                    Unary::Square
                } else {
                    Unary::Powf(p)
                };
                let t = self.g.unary(t, f).map_err(Self::map_err)?;
                Val::T { t, shape }
            }
            other => {
                let (v, shape) = Self::host_values(&other).ok_or("unexpected input")?;
                Val::Host {
                    v: Arc::new(v.iter().map(|x| x.powf(p)).collect()),
                    shape,
                }
            }
        };
        self.set(node, v)
    }

    /// `x < c` with a constant scalar tensor `c`: a mask (no gradient).
    fn lt_tensor(&mut self, node: &Node) -> Res<()> {
        let o = self.tensor_arg(node, "other")?;
        let (ov, _) =
            Self::host_values(&o).ok_or("a comparison with a position-dependent bound")?;
        let [c] = ov[..] else {
            return Err("a comparison with a tensor of more than one value".into());
        };
        self.lt_mask(node, c)
    }

    /// `self < c` with a constant `c`, as a host mask (no gradient).
    pub(super) fn lt_mask(&mut self, node: &Node, c: f64) -> Res<()> {
        let (v, shape) = match self.tensor_arg(node, "self")? {
            Val::T { t, shape } => (
                {
                    // A value the device holds is read here, on the host.
                    self.g.ensure_host(&[t]).map_err(|e| e.to_string())?;
                    self.g.value(t)
                }
                .iter()
                .map(|x| x.to_f64_lossless())
                .collect::<Vec<_>>(),
                shape,
            ),
            other => {
                let (v, s) = Self::host_values(&other).ok_or("unexpected input")?;
                (v.to_vec(), s)
            }
        };
        self.set(
            node,
            Val::Host {
                v: Arc::new(v.iter().map(|&x| f64::from(x < c)).collect()),
                shape,
            },
        )
    }

    fn one_hot(&mut self, node: &Node) -> Res<()> {
        let (v, shape) = int_values(&self.tensor_arg(node, "self")?)?;
        let classes = self.int_arg(node, "num_classes")?;
        let classes = usize::try_from(classes)
            .ok()
            .filter(|&c| c > 0)
            .ok_or("one_hot needs an explicit number of classes")?;
        let mut out = vec![0i64; v.len() * classes];
        for (k, &x) in v.iter().enumerate() {
            let c = usize::try_from(x)
                .ok()
                .filter(|&c| c < classes)
                .ok_or_else(|| format!("one_hot of {x} with {classes} classes"))?;
            out[k * classes + c] = 1;
        }
        let mut s = shape;
        s.push(classes);
        self.set(
            node,
            Val::Int {
                v: Arc::new(out),
                shape: s,
                origin: Origin::Other,
            },
        )
    }

    /// Arithmetic on symbolic sizes (`sym_size(x, 0) * 8`).
    fn sym_arith(&mut self, node: &Node) -> Res<()> {
        let a = self.int_arg(node, "a")?;
        let b = self.int_arg(node, "b")?;
        let r = match node.op.as_str() {
            "_operator.mul" => a.checked_mul(b),
            "_operator.add" => a.checked_add(b),
            "_operator.sub" => a.checked_sub(b),
            _ => (b != 0).then(|| a.div_euclid(b)),
        };
        let r = r
            .and_then(|r| usize::try_from(r).ok())
            .ok_or_else(|| format!("size arithmetic {a} and {b} out of range"))?;
        self.set(node, Val::Sym(r))
    }
}
