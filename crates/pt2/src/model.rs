//! An imported program as an engine model: each node of the graph becomes
//! engine ops (or host computation for integer and constant tensors).
//!
//! Values fall in three kinds:
//! - engine tensors (`Val::T`): everything that depends on positions or the
//!   cell. An N-d tensor is an engine block of `shape[0]` rows and
//!   `Π shape[1..]` columns; its rows are Atom or Edge rows when `shape[0]`
//!   is the atom or edge size symbol;
//! - host values (`Val::Host`, `Val::Int`): parameters, constants, species,
//!   the edge list and what is computed from them alone (embeddings,
//!   masks). They carry no gradient and become engine constants where they
//!   meet an engine tensor;
//! - symbolic ints and lazily made zeros (`index_add` targets).
//!
//! Index ops keep their distributed meaning: `positions[edge_index[k]]` is
//! the engine's gather through the runtime's centre / neighbour index (a
//! halo read when decomposed), `index_add` onto atom rows its scatter, and
//! a sum of atom rows the per-system reduction.

use crate::ir::{dtype, Arg, Node, SymIntArg};
use crate::rowops::{permute_map, slice_map, ClampMin, EinsumOperand, RowEinsum, RowGather};
use crate::{Pt2Archive, Pt2Error};
use ddmlip_engine::ops::Unary;
use ddmlip_engine::OpaqueKernel;
use ddmlip_engine::{
    EngineError, Graph, Index, ModelForward, ModelInfo, ModelInputs, ModelOutputs, RowDomain,
    Scalar, SpeciesSupport, Tensor,
};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

/// A `.pt2` archive that the engine can run: every op is supported.
#[derive(Debug, Clone)]
pub struct ImportedModel {
    archive: Arc<Pt2Archive>,
}

impl ImportedModel {
    /// Reads the archive at `path` and checks that every op is supported.
    pub fn load(path: impl AsRef<Path>) -> Result<ImportedModel, Pt2Error> {
        ImportedModel::new(Pt2Archive::read(path)?)
    }

    /// Wraps a read archive; [`Pt2Error::UnsupportedOps`] lists every op the
    /// engine lacks, with counts.
    pub fn new(archive: Pt2Archive) -> Result<ImportedModel, Pt2Error> {
        let bad = archive.unsupported_ops();
        if !bad.is_empty() {
            return Err(Pt2Error::UnsupportedOps(bad));
        }
        Ok(ImportedModel {
            archive: Arc::new(archive),
        })
    }

    /// The archive.
    pub fn archive(&self) -> &Pt2Archive {
        &self.archive
    }
}

impl ModelInfo for ImportedModel {
    fn name(&self) -> String {
        self.archive.metadata.model.clone()
    }
    fn description(&self) -> String {
        format!(
            "imported torch.export program {} ({} nodes)",
            self.archive.path.display(),
            self.archive.program.nodes.len()
        )
    }
    fn cutoff(&self) -> f64 {
        self.archive.metadata.cutoff
    }
    fn species(&self) -> SpeciesSupport {
        SpeciesSupport::Listed(self.archive.metadata.species.clone())
    }
}

impl ModelForward for ImportedModel {
    fn forward<T: Scalar>(
        &self,
        g: &mut Graph<T>,
        inputs: &ModelInputs,
    ) -> Result<ModelOutputs, EngineError> {
        let mut run = Run::new(&self.archive, g, inputs)?;
        for node in &self.archive.program.nodes {
            run.node(node).map_err(|message| {
                EngineError::Input(format!(
                    "{}: node `{}` ({}): {message}",
                    self.archive.metadata.model,
                    node.label(),
                    node.op
                ))
            })?;
        }
        run.outputs()
            .map_err(|m| EngineError::Input(format!("{}: {m}", self.archive.metadata.model)))
    }
}

/// Where an integer tensor came from, so that gathers through the edge list
/// use the runtime's own indices.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Origin {
    EdgeIndex,
    Center,
    Neighbor,
    Other,
}

#[derive(Debug, Clone)]
enum Val {
    Sym(usize),
    Int {
        v: Arc<Vec<i64>>,
        shape: Vec<usize>,
        origin: Origin,
    },
    Host {
        v: Arc<Vec<f64>>,
        shape: Vec<usize>,
    },
    T {
        t: Tensor,
        shape: Vec<usize>,
    },
    Zeros {
        shape: Vec<usize>,
    },
}

type Res<T> = Result<T, String>;

struct Run<'a, T: Scalar> {
    archive: &'a Pt2Archive,
    g: &'a mut Graph<T>,
    inputs: &'a ModelInputs,
    values: HashMap<String, Val>,
    symbols: BTreeMap<String, usize>,
    registered: HashMap<usize, Index>,
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The engine block of an N-d shape.
fn layout(shape: &[usize]) -> (usize, usize) {
    match shape.split_first() {
        None => (1, 1),
        Some((&r, rest)) => (r, numel(rest)),
    }
}

/// Row-major strides.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// numpy broadcasting of `v` (shape `from`) to `to`.
fn broadcast_host(v: &[f64], from: &[usize], to: &[usize]) -> Res<Vec<f64>> {
    if v.len() != numel(from) {
        return Err(format!("{} values for shape {from:?}", v.len()));
    }
    if from == to {
        return Ok(v.to_vec());
    }
    if from.len() > to.len() {
        return Err(format!("cannot broadcast {from:?} to {to:?}"));
    }
    let pad = to.len() - from.len();
    let fs = strides(from);
    let mut src_strides = vec![0; to.len()];
    for (d, &n) in from.iter().enumerate() {
        if n == to[pad + d] {
            src_strides[pad + d] = fs[d];
        } else if n != 1 {
            return Err(format!("cannot broadcast {from:?} to {to:?}"));
        }
    }
    let ts = strides(to);
    Ok((0..numel(to))
        .map(|i| {
            let mut src = 0;
            for d in 0..to.len() {
                src += (i / ts[d]) % to[d].max(1) * src_strides[d];
            }
            v[src]
        })
        .collect())
}

/// torch's result shape of broadcasting `a` against `b`.
fn broadcast_shape(a: &[usize], b: &[usize]) -> Res<Vec<usize>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|k| {
            let da = if k + a.len() >= n {
                a[k + a.len() - n]
            } else {
                1
            };
            let db = if k + b.len() >= n {
                b[k + b.len() - n]
            } else {
                1
            };
            match (da, db) {
                (x, y) if x == y => Ok(x),
                (1, y) => Ok(y),
                (x, 1) => Ok(x),
                _ => Err(format!("shapes {a:?} and {b:?} do not broadcast")),
            }
        })
        .collect()
}

fn norm_dim(d: i64, rank: usize) -> Res<usize> {
    let r = rank as i64;
    let k = if d < 0 { d + r } else { d };
    if (0..r.max(1)).contains(&k) {
        Ok(k as usize)
    } else {
        Err(format!("dimension {d} out of range for rank {rank}"))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Bin {
    Add,
    Sub,
    Mul,
    Div,
}

impl Bin {
    fn host(self, a: f64, b: f64) -> f64 {
        match self {
            Bin::Add => a + b,
            Bin::Sub => a - b,
            Bin::Mul => a * b,
            Bin::Div => a / b,
        }
    }
}

impl<'a, T: Scalar> Run<'a, T> {
    fn new(
        archive: &'a Pt2Archive,
        g: &'a mut Graph<T>,
        inputs: &'a ModelInputs,
    ) -> Result<Self, EngineError> {
        let edges = inputs.edges.ok_or_else(|| {
            EngineError::Input("an imported model needs the runtime's edge list".into())
        })?;
        let n_atoms = inputs.numbers.len();
        let n_edges = g.index_len(edges.center);
        let symbols = BTreeMap::from([
            (archive.symbols.atoms.clone(), n_atoms),
            (archive.symbols.edges.clone(), n_edges),
        ]);
        let mut run = Run {
            archive,
            g,
            inputs,
            values: HashMap::new(),
            symbols,
            registered: HashMap::new(),
        };
        let species_of = &archive.metadata.species;
        let species: Vec<i64> = inputs
            .numbers
            .iter()
            .map(|z| {
                species_of
                    .iter()
                    .position(|s| s == z)
                    .map(|k| k as i64)
                    .ok_or_else(|| {
                        EngineError::Input(format!(
                            "{}: element Z = {z} is not among the model's species {species_of:?}",
                            archive.metadata.model
                        ))
                    })
            })
            .collect::<Result<_, _>>()?;
        let users = archive.program.user_inputs();
        if users.len() != 5 {
            return Err(EngineError::Input(
                "the graph does not have the contract's 5 inputs".into(),
            ));
        }
        let center = run.g.index_values(edges.center).clone();
        let neighbor = run.g.index_values(edges.neighbor).clone();
        let edge_index: Vec<i64> = center
            .iter()
            .chain(neighbor.iter())
            .map(|&v| i64::from(v))
            .collect();
        run.values.insert(
            users[0].to_string(),
            Val::T {
                t: inputs.positions,
                shape: vec![n_atoms, 3],
            },
        );
        run.values.insert(
            users[1].to_string(),
            Val::Int {
                v: Arc::new(species),
                shape: vec![n_atoms],
                origin: Origin::Other,
            },
        );
        run.values.insert(
            users[2].to_string(),
            Val::Int {
                v: Arc::new(edge_index),
                shape: vec![2, n_edges],
                origin: Origin::EdgeIndex,
            },
        );
        // edge_shift = S·cell (strained) = (r_j + S·cell − r_i) − (r_j − r_i):
        // the engine's differentiable edge vectors less the bare difference,
        // so the graph's `r_j − r_i + edge_shift` is the runtime's vector.
        let vectors = edges.vectors(run.g)?;
        let pj = run.g.gather(inputs.positions, edges.neighbor)?;
        let pi = run.g.gather(inputs.positions, edges.center)?;
        let bare = run.g.sub(pj, pi)?;
        let shift = run.g.sub(vectors, bare)?;
        run.values.insert(
            users[3].to_string(),
            Val::T {
                t: shift,
                shape: vec![n_edges, 3],
            },
        );
        if inputs.n_systems == 1 {
            run.values.insert(
                users[4].to_string(),
                Val::T {
                    t: inputs.cell,
                    shape: vec![3, 3],
                },
            );
        }
        for (name, w) in &archive.weights {
            run.values.insert(
                name.clone(),
                Val::Host {
                    v: Arc::new(w.values.clone()),
                    shape: w.shape.clone(),
                },
            );
        }
        Ok(run)
    }

    fn get(&self, name: &str) -> Res<&Val> {
        self.values.get(name).ok_or_else(|| {
            if self.archive.program.user_inputs().get(4) == Some(&name) {
                "the cell input is read by the graph, which ddmlip supports for one system per evaluation only".to_string()
            } else {
                format!("`{name}` is used before it is defined")
            }
        })
    }

    fn arg<'n>(&self, node: &'n Node, name: &str) -> Res<&'n Arg> {
        node.arg(name)
            .ok_or_else(|| format!("missing argument `{name}`"))
    }

    fn tensor_arg(&self, node: &Node, name: &str) -> Res<Val> {
        match self.arg(node, name)? {
            Arg::AsTensor(t) => self.get(&t.name).cloned(),
            other => Err(format!(
                "argument `{name}` should be a tensor, found {other:?}"
            )),
        }
    }

    fn int_arg(&self, node: &Node, name: &str) -> Res<i64> {
        match self.arg(node, name)? {
            Arg::AsInt(v) => Ok(*v),
            Arg::AsSymInt(SymIntArg::AsInt(v)) => Ok(*v),
            Arg::AsSymInt(SymIntArg::AsName(n)) => match self.get(n)? {
                Val::Sym(v) => Ok(*v as i64),
                _ => Err(format!("`{n}` is not a symbolic int")),
            },
            other => Err(format!(
                "argument `{name}` should be an int, found {other:?}"
            )),
        }
    }

    fn ints_arg(&self, node: &Node, name: &str) -> Res<Option<Vec<i64>>> {
        match self.arg(node, name)? {
            Arg::AsInts(v) => Ok(Some(v.clone())),
            Arg::AsInt(v) => Ok(Some(vec![*v])),
            Arg::AsNone(_) => Ok(None),
            other => Err(format!("argument `{name}` should be ints, found {other:?}")),
        }
    }

    fn float_arg(&self, node: &Node, name: &str) -> Res<f64> {
        match self.arg(node, name)? {
            Arg::AsFloat(v) => Ok(*v),
            Arg::AsInt(v) => Ok(*v as f64),
            other => Err(format!(
                "argument `{name}` should be a number, found {other:?}"
            )),
        }
    }

    /// The concrete shape of a graph value from its recorded sizes.
    fn shape_of(&self, name: &str) -> Res<Vec<usize>> {
        let meta = self
            .archive
            .program
            .tensors
            .get(name)
            .ok_or_else(|| format!("no metadata for `{name}`"))?;
        meta.sizes
            .iter()
            .map(|s| {
                s.eval(&self.symbols)
                    .ok_or_else(|| format!("size `{s}` of `{name}` uses a symbol that is neither the atom nor the edge count"))
            })
            .collect()
    }

    /// The row domain of a graph value: Atom or Edge when its first size is
    /// the atom or edge symbol.
    fn domain_of(&self, name: &str) -> RowDomain {
        let first = self
            .archive
            .program
            .tensors
            .get(name)
            .and_then(|m| m.sizes.first().cloned());
        match first {
            Some(s) if s == crate::SizeExpr::symbol(&self.archive.symbols.atoms) => RowDomain::Atom,
            Some(s) if s == crate::SizeExpr::symbol(&self.archive.symbols.edges) => RowDomain::Edge,
            _ => RowDomain::None,
        }
    }

    fn set(&mut self, node: &Node, v: Val) -> Res<()> {
        // Host values must fill their (recorded) shape: a graph whose
        // metadata disagrees with its ops is an error here, not a bad read later.
        let consistent = match &v {
            Val::Host { v, shape } => v.len() == numel(shape),
            Val::Int { v, shape, .. } => v.len() == numel(shape),
            _ => true,
        };
        if !consistent {
            return Err(
                "the recorded shape of the result does not match what the op produced".into(),
            );
        }
        let name = node
            .outputs
            .first()
            .ok_or_else(|| "a node without an output".to_string())?;
        self.values.insert(name.clone(), v);
        Ok(())
    }

    fn out_name<'n>(&self, node: &'n Node) -> Res<&'n str> {
        node.outputs
            .first()
            .map(String::as_str)
            .ok_or_else(|| "a node without an output".to_string())
    }

    /// An engine constant holding `v` broadcast to `shape`, in `domain`.
    fn constant(
        &mut self,
        v: &[f64],
        from: &[usize],
        shape: &[usize],
        domain: RowDomain,
    ) -> Res<Tensor> {
        let full = broadcast_host(v, from, shape)?;
        let (r, c) = layout(shape);
        let values = full.into_iter().map(T::from_f64).collect();
        let domain = if domain == RowDomain::None && shape.is_empty() {
            RowDomain::None
        } else {
            domain
        };
        Ok(self.g.constant(values, r, c, domain))
    }

    /// The host values of a value without gradient (ints as floats).
    fn host_values(v: &Val) -> Option<(Arc<Vec<f64>>, Vec<usize>)> {
        match v {
            Val::Host { v, shape } => Some((v.clone(), shape.clone())),
            Val::Int { v, shape, .. } => Some((
                Arc::new(v.iter().map(|&x| x as f64).collect()),
                shape.clone(),
            )),
            Val::Zeros { shape } => Some((Arc::new(vec![0.0; numel(shape)]), shape.clone())),
            _ => None,
        }
    }

    fn map_err(e: EngineError) -> String {
        e.to_string()
    }

    fn unary(&mut self, node: &Node, f: Unary, host: fn(f64) -> f64) -> Res<()> {
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
    fn binary(&mut self, node: &Node, op: Bin) -> Res<()> {
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
                let mut b = self.get(&bn.name)?.clone();
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

    fn binary_values(&mut self, a: Val, b: Val, op: Bin, out: &str) -> Res<Val> {
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
        // Host operands become constants of the output's full shape.
        let as_tensor = |v: &Val, run: &mut Self| -> Res<(Tensor, Vec<usize>)> {
            match v {
                Val::T { t, shape } => Ok((*t, shape.clone())),
                other => {
                    let (hv, hs) = Self::host_values(other).ok_or("unexpected input")?;
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
    fn engine_binary(
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
        if !(ok && engine_fits) {
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

    /// The engine index of an integer tensor used to index atom rows.
    fn index_for(&mut self, idx: &Val, target_rows: usize) -> Res<Index> {
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

    fn node(&mut self, node: &Node) -> Res<()> {
        let op = node.op.as_str();
        match op {
            "aten._assert_tensor_metadata.default" => Ok(()),
            "aten.sym_size.int" => {
                let x = self.tensor_arg(node, "self")?;
                let shape = match &x {
                    Val::T { shape, .. }
                    | Val::Int { shape, .. }
                    | Val::Host { shape, .. }
                    | Val::Zeros { shape } => shape.clone(),
                    Val::Sym(_) => return Err("sym_size of a symbolic int".into()),
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
                        let i = usize::try_from(if index < 0 {
                            index + shape[d] as i64
                        } else {
                            index
                        })
                        .ok()
                        .filter(|&i| i < shape[d])
                        .ok_or("select index out of range")?;
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
                        let i = usize::try_from(index)
                            .ok()
                            .filter(|&i| i < shape[d])
                            .ok_or("select index out of range")?;
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
                        let i = usize::try_from(if index < 0 {
                            index + shape[d] as i64
                        } else {
                            index
                        })
                        .ok()
                        .filter(|&i| i < shape[d])
                        .ok_or("select index out of range")?;
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
                    Arg::AsTensors(ts) if ts.len() == 1 => self.get(&ts[0].name)?.clone(),
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
                        let (iv, ishape) = int_values(&idx)?;
                        let g = gather_host(&v, &shape, &iv)?;
                        let mut s = ishape;
                        s.extend_from_slice(&shape[1..]);
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
                        let (iv, ishape) = int_values(&idx)?;
                        let g = gather_host(&v, &shape, &iv)?;
                        let mut s = ishape;
                        s.extend_from_slice(&shape[1..]);
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
                let (iv, ishape) = int_values(&idx)?;
                let g = gather_host(&v, &shape, &iv)?;
                let mut s = ishape;
                s.extend_from_slice(&shape[1..]);
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
                        Self::host_values(self.get(&b.name)?)
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
                let x = self.tensor_arg(node, "self")?;
                let (v, shape) = match x {
                    Val::T { t, shape } => (
                        self.g
                            .value(t)
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
                        if xs.len() != 2 || dims.len() != 1 || norm_dim(dims[0], xs.len())? != last
                        {
                            return Err(
                                "a sum over other than the last dimension of a 2-d tensor".into()
                            );
                        }
                        let t = self.g.sum_cols(t).map_err(Self::map_err)?;
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
                    let x = self.get(&t.name)?.clone();
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
                    .map(|t| self.get(&t.name).cloned())
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
                    .map(|t| self.get(&t.name).cloned())
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
            other => Err(format!("op `{other}` is not supported")),
        }
    }

    fn row_gather(
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
    fn reshape_or_expand(&mut self, x: Val, out: &str, expand: bool) -> Res<Val> {
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
    fn strided(
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
    fn concat(
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
    fn einsum(
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

    fn domain_of_len(&self, n: usize) -> RowDomain {
        if Some(&n) == self.symbols.get(&self.archive.symbols.edges) {
            RowDomain::Edge
        } else {
            RowDomain::None
        }
    }

    fn outputs(mut self) -> Res<ModelOutputs> {
        let names = &self.archive.program.outputs;
        let n_atoms = self.inputs.numbers.len();
        let energy = match self.get(&names[0])?.clone() {
            Val::T { t, .. } => {
                if self.g.domain(t) != RowDomain::System {
                    return Err("the energy output is not a sum over atoms".into());
                }
                t
            }
            other => {
                let (v, _) = Self::host_values(&other).ok_or("unexpected energy")?;
                let n = self.inputs.n_systems;
                self.g
                    .constant(vec![T::from_f64(v[0]); n], n, 1, RowDomain::System)
            }
        };
        let atomic = match self.get(&names[1])?.clone() {
            Val::T { t, .. } => t,
            other => {
                let (v, s) = Self::host_values(&other).ok_or("unexpected atomic energies")?;
                self.constant(&v, &s, &[n_atoms], RowDomain::Atom)?
            }
        };
        if self.g.shape(atomic) != (n_atoms, 1) || self.g.domain(atomic) != RowDomain::Atom {
            return Err("the atomic energies output is not one value per atom".into());
        }
        Ok(ModelOutputs {
            energy,
            atomic_energies: Some(atomic),
            extra: Vec::new(),
        })
    }
}

fn value_shape(v: &Val) -> Res<Vec<usize>> {
    match v {
        Val::T { shape, .. }
        | Val::Int { shape, .. }
        | Val::Host { shape, .. }
        | Val::Zeros { shape } => Ok(shape.clone()),
        Val::Sym(_) => Err("a symbolic int where a tensor was expected".into()),
    }
}

fn int_values(v: &Val) -> Res<(Arc<Vec<i64>>, Vec<usize>)> {
    match v {
        Val::Int { v, shape, .. } => Ok((v.clone(), shape.clone())),
        _ => Err("an index that is not an integer tensor".into()),
    }
}

fn select_host<V: Copy>(v: &[V], shape: &[usize], d: usize, i: usize) -> Vec<V> {
    let outer: usize = shape[..d].iter().product();
    let inner: usize = shape[d + 1..].iter().product();
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let base = (o * shape[d] + i) * inner;
        out.extend_from_slice(&v[base..base + inner]);
    }
    out
}

fn gather_host<V: Copy>(v: &[V], shape: &[usize], idx: &[i64]) -> Res<Vec<V>> {
    let rows = *shape.first().ok_or("indexing a scalar")?;
    let inner: usize = shape[1..].iter().product();
    let mut out = Vec::with_capacity(idx.len() * inner);
    for &i in idx {
        let r = if i < 0 { i + rows as i64 } else { i };
        let r = usize::try_from(r)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| format!("index {i} out of range for {rows} rows"))?;
        out.extend_from_slice(&v[r * inner..(r + 1) * inner]);
    }
    Ok(out)
}

/// torch's CPU `linspace`: the first half from `start`, the second from `end`.
fn linspace(start: f64, end: f64, steps: usize) -> Vec<f64> {
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps - 1) as f64;
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if i < half {
                start + step * i as f64
            } else {
                end - step * (steps - 1 - i) as f64
            }
        })
        .collect()
}
