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
use crate::rowops::{
    permute_map, slice_map, BroadcastOp, ClampMin, EinsumOperand, RowBroadcast, RowEinsum,
    RowGather,
};
use crate::{Pt2Archive, Pt2Error};
use ddmlip_engine::ops::Unary;
use ddmlip_engine::OpaqueKernel;
use ddmlip_engine::{
    EngineError, Graph, Index, ModelForward, ModelInfo, ModelInputs, ModelOutputs, RowDomain,
    Scalar, SpeciesSupport, Tensor,
};
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

mod binary;
mod mlip_ops;
mod node;
mod release;
mod shape_ops;

/// A `.pt2` archive that the engine can run: every op is supported.
#[derive(Debug, Clone)]
pub struct ImportedModel {
    archive: Arc<Pt2Archive>,
    /// Per node, the values it reads for the last time.
    last_uses: Arc<Vec<Vec<String>>>,
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
        let last_uses = Arc::new(release::last_uses(&archive.program));
        Ok(ImportedModel {
            archive: Arc::new(archive),
            last_uses,
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
        // Values go back to the engine after their last use, and each
        // node's intermediates right after it: the engine keeps only what
        // a backward reads.
        let mut live = release::Liveness::default();
        live.protect(&[inputs.positions, inputs.cell]);
        let start = g.len();
        let mut run = Run::new(&self.archive, g, inputs)?;
        let users: Vec<String> = (self.archive.program.user_inputs().iter())
            .map(|s| s.to_string())
            .collect();
        live.after_step(run.g, &run.values, &users, start);
        for (node, dying) in self.archive.program.nodes.iter().zip(self.last_uses.iter()) {
            let start = run.g.len();
            run.node(node).map_err(|message| {
                EngineError::Input(format!(
                    "{}: node `{}` ({}): {message}",
                    self.archive.metadata.model,
                    node.label(),
                    node.op
                ))
            })?;
            live.after_step(run.g, &run.values, &node.outputs, start);
            live.drop_values(run.g, &mut run.values, dying);
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
    /// An integer tensor of `shape` whose row `r` holds `rows[r]` in every
    /// element: an index broadcast along columns (`index.unsqueeze(-1)
    /// .expand_as(src)` for a `scatter_add`), kept as one value per row
    /// (the wide form would be millions of integers written and scanned
    /// every evaluation). [`Run::get`] hands it out as a `Val::Int`;
    /// `scatter_add` reads it as it is.
    IntRows {
        rows: Arc<Vec<i64>>,
        shape: Vec<usize>,
        origin: Origin,
    },
}

impl Val {
    /// An [`Val::IntRows`] as the integer tensor it stands for; any other
    /// value as it is.
    fn widened(self) -> Res<Val> {
        match self {
            Val::IntRows {
                rows,
                shape,
                origin: _,
            } => {
                let width = numel(shape.get(1..).unwrap_or(&[]));
                let mut v = Vec::with_capacity(rows.len() * width);
                for &x in rows.iter() {
                    v.extend(std::iter::repeat_n(x, width));
                }
                Ok(Val::Int {
                    v: Arc::new(v),
                    shape,
                    origin: Origin::Other,
                })
            }
            other => Ok(other),
        }
    }
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
fn broadcast_host<V: Copy>(v: &[V], from: &[usize], to: &[usize]) -> Res<Vec<V>> {
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
    // Walks the output's rows (all dimensions but the last) in order with an
    // odometer, moving the source offset by each dimension's stride: no
    // division per element (per-edge constants run to millions). Each row
    // of the last dimension is one fill (a broadcast column, such as an
    // index expanded along columns for a `scatter_add`), one copy
    // (contiguous) or a strided read.
    let total = numel(to);
    let mut out = Vec::with_capacity(total);
    let (Some(&run), Some(&run_stride)) = (to.last(), src_strides.last()) else {
        // A scalar broadcast to a scalar.
        out.extend_from_slice(v);
        return Ok(out);
    };
    if run == 0 {
        return Ok(out);
    }
    let outer = &to[..to.len() - 1];
    let mut idx = vec![0usize; outer.len()];
    let mut src = 0usize;
    for _ in 0..total / run {
        match run_stride {
            0 => out.extend(std::iter::repeat_n(v[src], run)),
            1 => out.extend_from_slice(&v[src..src + run]),
            _ => out.extend((0..run).map(|k| v[src + k * run_stride])),
        }
        for d in (0..outer.len()).rev() {
            idx[d] += 1;
            src += src_strides[d];
            if idx[d] < outer[d] {
                break;
            }
            src -= src_strides[d] * idx[d];
            idx[d] = 0;
        }
    }
    Ok(out)
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

/// torch's index `i` (negative counts from the end) into a dimension of
/// `len` entries.
fn norm_index(i: i64, len: usize) -> Res<usize> {
    let k = if i < 0 { i + len as i64 } else { i };
    usize::try_from(k)
        .ok()
        .filter(|&k| k < len)
        .ok_or_else(|| "select index out of range".to_string())
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

    /// The value of `name` (an [`Val::IntRows`] widened).
    fn get(&self, name: &str) -> Res<Val> {
        self.get_raw(name)?.clone().widened()
    }

    /// The value of `name` as stored.
    fn get_raw(&self, name: &str) -> Res<&Val> {
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
            Arg::AsTensor(t) => self.get(&t.name),
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
                Val::Sym(v) => Ok(v as i64),
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
        let (r, c) = layout(shape);
        let domain = if domain == RowDomain::None && shape.is_empty() {
            RowDomain::None
        } else {
            domain
        };
        // Values already of the shape are converted straight into the
        // graph's recycled memory (per-edge constants come every step).
        let wide;
        let full = if from == shape {
            v
        } else {
            wide = broadcast_host(v, from, shape)?;
            &wide[..]
        };
        if full.len() != r * c {
            return Err("a constant whose values do not fill its shape".into());
        }
        Ok(self.g.constant_with(r, c, domain, |out| {
            out.par_chunks_mut(1 << 14)
                .zip(full.par_chunks(1 << 14))
                .for_each(|(o, v)| {
                    for (o, &x) in o.iter_mut().zip(v) {
                        *o = T::from_f64(x);
                    }
                })
        }))
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
        let energy = match self.get(&names[0])? {
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
        let atomic = match self.get(&names[1])? {
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
        | Val::IntRows { shape, .. }
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

/// Rows of a host tensor `v` (shape `shape`) picked by the integer tensor
/// `index` (negative entries count from the end): the values and their
/// shape, `index`'s shape followed by a row's.
fn gather_host<V: Copy>(v: &[V], shape: &[usize], index: &Val) -> Res<(Vec<V>, Vec<usize>)> {
    let (idx, mut out_shape) = int_values(index)?;
    let rows = *shape.first().ok_or("indexing a scalar")?;
    let inner: usize = shape[1..].iter().product();
    let mut out = Vec::with_capacity(idx.len() * inner);
    for &i in idx.iter() {
        let r = if i < 0 { i + rows as i64 } else { i };
        let r = usize::try_from(r)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| format!("index {i} out of range for {rows} rows"))?;
        out.extend_from_slice(&v[r * inner..(r + 1) * inner]);
    }
    out_shape.extend_from_slice(&shape[1..]);
    Ok((out, out_shape))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// numpy's rule element by element: output index i reads the source at
    /// the same index in every dimension the source has (0 where it is 1).
    fn broadcast_naive(v: &[f64], from: &[usize], to: &[usize]) -> Vec<f64> {
        let pad = to.len() - from.len();
        let (ts, fs) = (strides(to), strides(from));
        (0..numel(to))
            .map(|i| {
                let src: usize = (0..from.len())
                    .map(|d| {
                        let k = (i / ts[pad + d]) % to[pad + d];
                        if from[d] == 1 {
                            0
                        } else {
                            k * fs[d]
                        }
                    })
                    .sum();
                v[src]
            })
            .collect()
    }

    #[test]
    fn broadcast_host_follows_numpy() {
        let cases: [(&[usize], &[usize]); 10] = [
            (&[3], &[4, 3]),
            (&[4, 1], &[4, 3]),
            (&[2, 1, 3], &[5, 2, 4, 3]),
            (&[1, 1], &[2, 3]),
            (&[], &[2, 2]),
            (&[2, 3], &[2, 3]),
            (&[4, 1, 1], &[4, 2, 3]),
            (&[3, 1], &[2, 3, 5]),
            (&[], &[]),
            (&[1], &[3, 0]),
        ];
        for (from, to) in cases {
            let v: Vec<f64> = (0..numel(from)).map(|k| k as f64 * 1.5 - 2.0).collect();
            assert_eq!(
                broadcast_host(&v, from, to).unwrap(),
                broadcast_naive(&v, from, to),
                "{from:?} → {to:?}"
            );
        }
        assert!(broadcast_host(&[1.0, 2.0], &[2], &[3]).is_err());
        assert!(broadcast_host(&[1.0, 2.0], &[2], &[0, 2])
            .unwrap()
            .is_empty());
    }
}
