//! The torch side of the pickle VM: the whitelisted callables (`REDUCE` /
//! `NEWOBJ`), tensor rebuilding, persistent storage ids, `BUILD`, and the
//! bounded conversion of the arena into a [`PyValue`] tree.

use super::*;

impl Vm<'_> {
    /// Interprets `REDUCE` / `NEWOBJ` for the whitelisted callables; anything
    /// else becomes an opaque object that keeps its arguments.
    pub(super) fn call(&mut self, callable: Id, args: Id) -> Result<Id, CheckpointError> {
        let (module, name) = match &self.nodes[callable] {
            Node::Global { module, name } => (module.clone(), name.clone()),
            other => {
                let kind = other.kind();
                return Err(self.err(format!("call of a {kind}, not of a class or function")));
            }
        };
        let arg_ids: Vec<Id> = self
            .tuple_of(args)
            .ok_or_else(|| self.err(format!("arguments of {module}.{name} are not a tuple")))?
            .to_vec();
        match (module.as_str(), name.as_str()) {
            ("collections", "OrderedDict") | ("builtins", "dict") | ("__builtin__", "dict")
                if arg_ids.is_empty() =>
            {
                Ok(self.alloc(Node::Dict(DictNode::default())))
            }
            ("torch._utils", "_rebuild_tensor_v2") => self.rebuild_tensor(&arg_ids),
            // A Parameter is its data tensor for reading purposes.
            ("torch._utils", "_rebuild_parameter")
            | ("torch._utils", "_rebuild_parameter_with_state") => arg_ids
                .first()
                .copied()
                .ok_or_else(|| self.err("_rebuild_parameter without arguments")),
            ("numpy.core.multiarray", "_reconstruct")
            | ("numpy._core.multiarray", "_reconstruct") => Ok(self.alloc(Node::NdArray {
                shape: Vec::new(),
                dtype: None,
                fortran: false,
                data: None,
            })),
            ("numpy", "dtype") => {
                let descr = arg_ids
                    .first()
                    .and_then(|&i| self.str_of(i))
                    .ok_or_else(|| self.err("numpy.dtype needs a str descriptor"))?;
                let (byteorder, descr) = match descr.chars().next() {
                    Some(c @ ('<' | '>' | '|' | '=')) => (c, descr[1..].to_string()),
                    _ => ('=', descr.to_string()),
                };
                Ok(self.alloc(Node::Dtype { descr, byteorder }))
            }
            ("_codecs", "encode") => {
                let text = arg_ids.first().and_then(|&i| self.str_of(i));
                let encoding = arg_ids.get(1).and_then(|&i| self.str_of(i));
                let (Some(text), Some(encoding)) = (text, encoding) else {
                    return Err(self.err("_codecs.encode needs (str, encoding)"));
                };
                let bytes = match encoding.to_ascii_lowercase().as_str() {
                    "latin1" | "latin-1" | "iso-8859-1" => text
                        .chars()
                        .map(|c| u8::try_from(u32::from(c)).ok())
                        .collect::<Option<Vec<u8>>>()
                        .ok_or_else(|| self.err("latin-1 text holds a code point above U+00FF"))?,
                    "utf-8" | "utf8" => text.as_bytes().to_vec(),
                    other => {
                        return Err(CheckpointError::Unsupported(format!(
                            "_codecs.encode with encoding `{other}`"
                        )))
                    }
                };
                Ok(self.alloc(Node::Bytes(bytes)))
            }
            _ => Ok(self.alloc(Node::Opaque {
                class: format!("{module}.{name}"),
                args,
                state: None,
            })),
        }
    }

    /// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks, ...)`.
    pub(super) fn rebuild_tensor(&mut self, args: &[Id]) -> Result<Id, CheckpointError> {
        if args.len() < 4 {
            return Err(self.err("_rebuild_tensor_v2 needs at least 4 arguments"));
        }
        let storage = match &self.nodes[args[0]] {
            Node::Storage(s) => s.clone(),
            other => {
                let kind = other.kind();
                return Err(self.err(format!("_rebuild_tensor_v2 on a {kind}, not a storage")));
            }
        };
        let offset = self
            .int_of(args[1])
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| self.err("tensor offset must be a non-negative int"))?;
        let size = self.uint_tuple(args[2], "tensor size")?;
        let stride = self.uint_tuple(args[3], "tensor stride")?;
        if size.len() != stride.len() {
            return Err(self.err("tensor size and stride differ in length"));
        }
        let shape = size
            .iter()
            .map(|&s| usize::try_from(s))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| self.err("tensor size does not fit in memory"))?;
        let numel = shape
            .iter()
            .try_fold(1u64, |acc, &s| acc.checked_mul(s as u64));
        let Some(numel) = numel else {
            return Err(self.err("tensor element count overflows"));
        };
        if numel > 0 {
            // Highest addressed element must lie inside the storage.
            let last = size.iter().zip(&stride).try_fold(offset, |acc, (&s, &st)| {
                (s - 1).checked_mul(st).and_then(|d| acc.checked_add(d))
            });
            match last {
                Some(last) if last < storage.numel => {}
                _ => {
                    return Err(self.err(format!(
                        "tensor view (offset {offset}, size {size:?}, stride {stride:?}) \
                         reads past its storage of {} elements",
                        storage.numel
                    )))
                }
            }
        }
        Ok(self.alloc(Node::Tensor(TensorRef {
            storage,
            offset,
            shape,
            stride,
        })))
    }

    /// `BINPERSID` with PyTorch's id `('storage', class, key, location, numel)`.
    pub(super) fn persistent_load(&mut self, pid: Id) -> Result<Node, CheckpointError> {
        let items = self
            .tuple_of(pid)
            .ok_or_else(|| self.err("persistent id is not a tuple"))?;
        if items.len() < 5 || self.str_of(items[0]) != Some("storage") {
            return Err(CheckpointError::Unsupported(format!(
                "persistent id at byte {} is not a PyTorch ('storage', ...) tuple",
                self.op_start
            )));
        }
        let dtype = match &self.nodes[items[1]] {
            Node::Global { module, name } => StorageDtype::from_class(module, name),
            _ => return Err(self.err("storage type in persistent id is not a class")),
        };
        let key = self
            .str_of(items[2])
            .ok_or_else(|| self.err("storage key is not a str"))?
            .to_string();
        let location = self
            .str_of(items[3])
            .ok_or_else(|| self.err("storage location is not a str"))?
            .to_string();
        let numel = self
            .int_of(items[4])
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| self.err("storage numel must be a non-negative int"))?;
        Ok(Node::Storage(StorageRef {
            key,
            dtype,
            location,
            numel,
        }))
    }

    /// `BUILD`: sets the state of the object on top of the stack.
    pub(super) fn build(&mut self, target: Id, state: Id) -> Result<(), CheckpointError> {
        match &self.nodes[target] {
            Node::NdArray { .. } => {
                // (version, shape, dtype, is_fortran, rawdata); version is optional.
                let items = self
                    .tuple_of(state)
                    .ok_or_else(|| self.err("ndarray state is not a tuple"))?;
                let items = match items.len() {
                    5 => &items[1..],
                    4 => items,
                    n => return Err(self.err(format!("ndarray state has {n} items"))),
                };
                let (shape_id, dtype, fortran_id, data) = (items[0], items[1], items[2], items[3]);
                let shape = self
                    .uint_tuple(shape_id, "ndarray shape")?
                    .into_iter()
                    .map(usize::try_from)
                    .collect::<Result<Vec<usize>, _>>()
                    .map_err(|_| self.err("ndarray shape does not fit in memory"))?;
                let fortran = self.int_of(fortran_id).unwrap_or(0) != 0;
                self.nodes[target] = Node::NdArray {
                    shape,
                    dtype: Some(dtype),
                    fortran,
                    data: Some(data),
                };
                Ok(())
            }
            Node::Dtype { descr, .. } => {
                let byteorder = self
                    .tuple_of(state)
                    .and_then(|items| items.get(1).copied())
                    .and_then(|i| self.str_of(i))
                    .and_then(|s| s.chars().next())
                    .ok_or_else(|| self.err("numpy dtype state lacks a byte order"))?;
                let descr = descr.clone();
                self.nodes[target] = Node::Dtype { descr, byteorder };
                Ok(())
            }
            // OrderedDict attributes (`_metadata` of a state dict) and tensor
            // attributes are not needed for reading weights.
            Node::Dict(_) | Node::Tensor(_) => Ok(()),
            Node::Opaque { .. } => {
                if let Node::Opaque { state: s, .. } = &mut self.nodes[target] {
                    *s = Some(state);
                }
                Ok(())
            }
            other => {
                let kind = other.kind();
                Err(self.err(format!("BUILD on a {kind}")))
            }
        }
    }

    /// Copies the arena object `id` into an owned tree (after execution, so
    /// every memo reference shows its final state).
    pub(super) fn convert(
        &self,
        id: Id,
        depth: usize,
        budget: &mut Budget,
    ) -> Result<PyValue, CheckpointError> {
        let end_err = |what: &str| CheckpointError::Malformed {
            offset: self.input.len(),
            what: what.to_string(),
        };
        if depth > MAX_DEPTH {
            return Err(end_err("object nesting too deep (or cyclic)"));
        }
        budget.nodes = budget
            .nodes
            .checked_sub(1)
            .ok_or_else(|| end_err("object graph expands to too many values"))?;
        let seq = |items: &[Id], budget: &mut Budget| {
            items
                .iter()
                .map(|&i| self.convert(i, depth + 1, budget))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(match &self.nodes[id] {
            Node::None => PyValue::None,
            Node::Bool(b) => PyValue::Bool(*b),
            Node::Int(i) => PyValue::Int(*i),
            Node::BigInt(b) => {
                charge(budget, b.len(), self.input.len())?;
                PyValue::BigInt(b.clone())
            }
            Node::Float(x) => PyValue::Float(*x),
            Node::Str(s) => {
                charge(budget, s.len(), self.input.len())?;
                PyValue::Str(s.clone())
            }
            Node::Bytes(b) => {
                charge(budget, b.len(), self.input.len())?;
                PyValue::Bytes(b.clone())
            }
            Node::List(items) => PyValue::List(seq(items, budget)?),
            Node::Tuple(items) => PyValue::Tuple(seq(items, budget)?),
            Node::Set(items) => PyValue::Set(seq(items, budget)?),
            Node::Dict(d) => {
                let mut out = Vec::with_capacity(d.items.len());
                for &(k, v) in &d.items {
                    let k = self.convert(k, depth + 1, budget)?;
                    let v = self.convert(v, depth + 1, budget)?;
                    out.push((k, v));
                }
                PyValue::Dict(out)
            }
            Node::Global { module, name } => PyValue::Global {
                module: module.clone(),
                name: name.clone(),
            },
            Node::Storage(s) => PyValue::Storage(s.clone()),
            Node::Tensor(t) => {
                charge(budget, t.shape.len() * 16, self.input.len())?;
                PyValue::Tensor(t.clone())
            }
            Node::NdArray {
                shape,
                dtype,
                fortran,
                data,
            } => {
                let (Some(dtype), Some(data)) = (dtype, data) else {
                    return Err(end_err("numpy array was never filled by BUILD"));
                };
                let (descr, byteorder) = match &self.nodes[*dtype] {
                    Node::Dtype { descr, byteorder } => (descr.clone(), *byteorder),
                    _ => return Err(end_err("numpy array dtype is not a numpy.dtype")),
                };
                let raw = match &self.nodes[*data] {
                    Node::Bytes(b) => b.clone(),
                    // Python-2 style str payloads hold one byte per code point.
                    Node::Str(s) => s
                        .chars()
                        .map(|c| u8::try_from(u32::from(c)).ok())
                        .collect::<Option<Vec<u8>>>()
                        .ok_or_else(|| end_err("numpy array str payload is not latin-1"))?,
                    _ => {
                        return Err(CheckpointError::Unsupported(
                            "numpy object arrays (payload is not raw bytes)".into(),
                        ))
                    }
                };
                charge(budget, raw.len(), self.input.len())?;
                PyValue::NdArray(crate::value::NdArray {
                    shape: shape.clone(),
                    descr,
                    byteorder,
                    fortran_order: *fortran,
                    data: raw,
                })
            }
            Node::Dtype { descr, byteorder } => PyValue::Opaque {
                class: "numpy.dtype".into(),
                args: Box::new(PyValue::Tuple(vec![PyValue::Str(descr.clone())])),
                state: Some(Box::new(PyValue::Str(byteorder.to_string()))),
            },
            Node::Opaque { class, args, state } => PyValue::Opaque {
                class: class.clone(),
                args: Box::new(self.convert(*args, depth + 1, budget)?),
                state: match state {
                    Some(s) => Some(Box::new(self.convert(*s, depth + 1, budget)?)),
                    None => None,
                },
            },
        })
    }
}
