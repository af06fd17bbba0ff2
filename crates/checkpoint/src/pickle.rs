//! A restricted, non-executing pickle virtual machine (protocols 0–5,
//! minus the rarely used text opcodes and out-of-band buffers).
//!
//! Design:
//! - Objects live in an arena and are referred to by index, so the memo
//!   holds *references*: a dict filled by `SETITEMS` or an ndarray filled by
//!   `BUILD` after its `BINPUT` is seen in its final state by every later
//!   `BINGET`, exactly as in Python. The arena also makes cycles harmless
//!   and keeps drops flat (no recursion on deeply nested input).
//! - Only a whitelist of callables is interpreted (OrderedDict, tensor and
//!   numpy reconstruction, `_codecs.encode`); any other `REDUCE` yields
//!   [`PyValue::Opaque`] holding its arguments. Nothing is ever executed.
//! - Every length is checked against the remaining input before allocating,
//!   every opcode consumes at least one byte (so execution terminates), and
//!   the final conversion to a [`PyValue`] tree is bounded in depth and size
//!   (a memo reference used many times is copied each time).

use std::collections::HashMap;

use crate::value::{PyValue, StorageDtype, StorageRef, TensorRef};
use crate::CheckpointError;

mod torch;

/// Maximum nesting depth of the returned value tree.
const MAX_DEPTH: usize = 256;

/// Runs the pickle stream `bytes` and returns the object left by `STOP`.
///
/// Errors: [`CheckpointError::Malformed`] (with the byte offset of the
/// offending opcode) for invalid streams, [`CheckpointError::Unsupported`]
/// for valid but unhandled opcodes. Never panics, whatever the input.
pub fn unpickle(bytes: &[u8]) -> Result<PyValue, CheckpointError> {
    let mut vm = Vm {
        input: bytes,
        pos: 0,
        op_start: 0,
        nodes: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    };
    let root = vm.run()?;
    let mut budget = Budget {
        nodes: (vm.nodes.len().saturating_mul(4)).max(1 << 20),
        bytes: bytes.len().saturating_mul(4).max(1 << 20),
    };
    vm.convert(root, 0, &mut budget)
}

type Id = usize;

/// Hashable dict keys, so that re-assigning a key replaces it (as in Python)
/// without a quadratic scan.
#[derive(Hash, PartialEq, Eq)]
enum DictKey {
    None,
    Int(i64),
    Str(String),
    Bytes(Vec<u8>),
}

#[derive(Default)]
struct DictNode {
    items: Vec<(Id, Id)>,
    index: HashMap<DictKey, usize>,
}

enum Node {
    None,
    Bool(bool),
    Int(i64),
    BigInt(Vec<u8>),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Id>),
    Tuple(Vec<Id>),
    Set(Vec<Id>),
    Dict(DictNode),
    Global {
        module: String,
        name: String,
    },
    Storage(StorageRef),
    Tensor(TensorRef),
    NdArray {
        shape: Vec<usize>,
        dtype: Option<Id>,
        fortran: bool,
        data: Option<Id>,
    },
    Dtype {
        descr: String,
        byteorder: char,
    },
    Opaque {
        class: String,
        args: Id,
        state: Option<Id>,
    },
}

impl Node {
    fn kind(&self) -> &'static str {
        match self {
            Node::None => "None",
            Node::Bool(_) => "bool",
            Node::Int(_) | Node::BigInt(_) => "int",
            Node::Float(_) => "float",
            Node::Str(_) => "str",
            Node::Bytes(_) => "bytes",
            Node::List(_) => "list",
            Node::Tuple(_) => "tuple",
            Node::Set(_) => "set",
            Node::Dict(_) => "dict",
            Node::Global { .. } => "global",
            Node::Storage(_) => "storage",
            Node::Tensor(_) => "tensor",
            Node::NdArray { .. } => "ndarray",
            Node::Dtype { .. } => "numpy dtype",
            Node::Opaque { .. } => "opaque object",
        }
    }
}

struct Budget {
    nodes: usize,
    bytes: usize,
}

struct Vm<'a> {
    input: &'a [u8],
    pos: usize,
    op_start: usize,
    nodes: Vec<Node>,
    stack: Vec<Id>,
    /// Stack heights at each MARK.
    marks: Vec<usize>,
    memo: HashMap<u64, Id>,
}

impl Vm<'_> {
    fn err(&self, what: impl Into<String>) -> CheckpointError {
        CheckpointError::Malformed {
            offset: self.op_start,
            what: what.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], CheckpointError> {
        let remaining = self.input.len() - self.pos;
        if n > remaining {
            return Err(self.err(format!(
                "needs {n} bytes but only {remaining} remain in the input"
            )));
        }
        let s = &self.input[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], CheckpointError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, CheckpointError> {
        Ok(self.take_array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, CheckpointError> {
        Ok(u16::from_le_bytes(self.take_array()?))
    }

    fn u32(&mut self) -> Result<u32, CheckpointError> {
        Ok(u32::from_le_bytes(self.take_array()?))
    }

    fn u64(&mut self) -> Result<u64, CheckpointError> {
        Ok(u64::from_le_bytes(self.take_array()?))
    }

    /// Reads a length field value and checks it against the remaining input
    /// before anything is allocated.
    fn len_bytes(&mut self, len: u64) -> Result<&[u8], CheckpointError> {
        let n = usize::try_from(len).map_err(|_| self.err(format!("length {len} too large")))?;
        self.take(n)
    }

    /// Reads a text line (without its `\n`), as used by protocol-0 opcodes.
    fn line(&mut self) -> Result<&str, CheckpointError> {
        let rest = &self.input[self.pos..];
        let Some(n) = rest.iter().position(|&b| b == b'\n') else {
            return Err(self.err("unterminated text line"));
        };
        self.pos += n + 1;
        std::str::from_utf8(&rest[..n]).map_err(|_| CheckpointError::Malformed {
            offset: self.op_start,
            what: "text line is not UTF-8".into(),
        })
    }

    fn alloc(&mut self, node: Node) -> Id {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    fn push(&mut self, node: Node) {
        let id = self.alloc(node);
        self.stack.push(id);
    }

    fn pop(&mut self) -> Result<Id, CheckpointError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("stack underflow"));
        }
        self.stack.pop().ok_or_else(|| self.err("stack underflow"))
    }

    fn top(&self) -> Result<Id, CheckpointError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("stack underflow"));
        }
        self.stack
            .last()
            .copied()
            .ok_or_else(|| self.err("stack underflow"))
    }

    fn pop_mark(&mut self) -> Result<Vec<Id>, CheckpointError> {
        let Some(mark) = self.marks.pop() else {
            return Err(self.err("no MARK on the stack"));
        };
        Ok(self.stack.split_off(mark.min(self.stack.len())))
    }

    fn str_of(&self, id: Id) -> Option<&str> {
        match &self.nodes[id] {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    fn int_of(&self, id: Id) -> Option<i64> {
        match self.nodes[id] {
            Node::Int(i) => Some(i),
            Node::Bool(b) => Some(i64::from(b)),
            _ => None,
        }
    }

    fn tuple_of(&self, id: Id) -> Option<&[Id]> {
        match &self.nodes[id] {
            Node::Tuple(items) | Node::List(items) => Some(items),
            _ => None,
        }
    }

    fn uint_tuple(&self, id: Id, what: &str) -> Result<Vec<u64>, CheckpointError> {
        let items = self
            .tuple_of(id)
            .ok_or_else(|| self.err(format!("{what} must be a tuple")))?;
        items
            .iter()
            .map(|&i| {
                self.int_of(i)
                    .and_then(|v| u64::try_from(v).ok())
                    .ok_or_else(|| self.err(format!("{what} must hold non-negative ints")))
            })
            .collect()
    }

    fn dict_key(&self, id: Id) -> Option<DictKey> {
        match &self.nodes[id] {
            Node::None => Some(DictKey::None),
            Node::Int(i) => Some(DictKey::Int(*i)),
            // True == 1 in Python dict keys.
            Node::Bool(b) => Some(DictKey::Int(i64::from(*b))),
            Node::Str(s) => Some(DictKey::Str(s.clone())),
            Node::Bytes(b) => Some(DictKey::Bytes(b.clone())),
            _ => None,
        }
    }

    fn set_items(&mut self, dict: Id, pairs: &[Id]) -> Result<(), CheckpointError> {
        if pairs.len() & 1 == 1 {
            return Err(self.err("odd number of items for a dict"));
        }
        let keys: Vec<Option<DictKey>> =
            pairs.chunks_exact(2).map(|p| self.dict_key(p[0])).collect();
        let Node::Dict(d) = &mut self.nodes[dict] else {
            let kind = self.nodes[dict].kind();
            return Err(self.err(format!("SETITEM(S) on a {kind}")));
        };
        for (pair, key) in pairs.chunks_exact(2).zip(keys) {
            match key {
                Some(k) => match d.index.get(&k) {
                    Some(&i) => d.items[i].1 = pair[1],
                    None => {
                        d.index.insert(k, d.items.len());
                        d.items.push((pair[0], pair[1]));
                    }
                },
                // Unhashable-here keys (tuples, floats, ...) are appended.
                None => d.items.push((pair[0], pair[1])),
            }
        }
        Ok(())
    }

    /// Executes opcodes until `STOP`; returns the id of the result.
    fn run(&mut self) -> Result<Id, CheckpointError> {
        loop {
            self.op_start = self.pos;
            if self.pos >= self.input.len() {
                return Err(self.err("unexpected end of input (no STOP opcode)"));
            }
            let op = self.u8()?;
            match op {
                // PROTO
                0x80 => {
                    let v = self.u8()?;
                    if v > 5 {
                        return Err(CheckpointError::Unsupported(format!("pickle protocol {v}")));
                    }
                }
                // FRAME: framing is only a buffering hint; the payload follows inline.
                0x95 => {
                    self.u64()?;
                }
                b'.' => return self.pop(),
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    // POP: with an empty (marked) stack Python pops the mark.
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() > floor {
                        self.pop()?;
                    } else {
                        self.pop_mark()?;
                    }
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let t = self.top()?;
                    self.stack.push(t);
                }
                // Integers.
                b'J' => {
                    let v = i32::from_le_bytes(self.take_array()?);
                    self.push(Node::Int(i64::from(v)));
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Node::Int(i64::from(v)));
                }
                b'M' => {
                    let v = self.u16()?;
                    self.push(Node::Int(i64::from(v)));
                }
                0x8a => {
                    let n = u64::from(self.u8()?);
                    let raw = self.len_bytes(n)?.to_vec();
                    self.push(long_node(raw));
                }
                0x8b => {
                    let n = i32::from_le_bytes(self.take_array()?);
                    let n = u64::try_from(n).map_err(|_| self.err("negative LONG4 length"))?;
                    let raw = self.len_bytes(n)?.to_vec();
                    self.push(long_node(raw));
                }
                b'I' => {
                    let node = match self.line()? {
                        "00" => Node::Bool(false),
                        "01" => Node::Bool(true),
                        text => match text.trim().parse::<i64>() {
                            Ok(v) => Node::Int(v),
                            Err(_) => return Err(self.err("INT: not an integer")),
                        },
                    };
                    self.push(node);
                }
                b'L' => {
                    let text = self.line()?.trim().trim_end_matches('L').to_string();
                    let v = text
                        .parse::<i64>()
                        .map_err(|_| CheckpointError::Unsupported("LONG text beyond i64".into()))?;
                    self.push(Node::Int(v));
                }
                b'N' => self.push(Node::None),
                0x88 => self.push(Node::Bool(true)),
                0x89 => self.push(Node::Bool(false)),
                // Floats: BINFLOAT is big-endian.
                b'G' => {
                    let v = f64::from_be_bytes(self.take_array()?);
                    self.push(Node::Float(v));
                }
                b'F' => {
                    let v = self.line()?.trim().parse::<f64>().map_err(|_| {
                        CheckpointError::Malformed {
                            offset: self.op_start,
                            what: "FLOAT: not a number".into(),
                        }
                    })?;
                    self.push(Node::Float(v));
                }
                // Strings (UTF-8).
                b'X' => {
                    let n = u64::from(self.u32()?);
                    self.push_str(n)?;
                }
                0x8c => {
                    let n = u64::from(self.u8()?);
                    self.push_str(n)?;
                }
                0x8d => {
                    let n = self.u64()?;
                    self.push_str(n)?;
                }
                // Python-2 byte strings: decoded as latin-1.
                b'T' => {
                    let n = i32::from_le_bytes(self.take_array()?);
                    let n = u64::try_from(n).map_err(|_| self.err("negative BINSTRING length"))?;
                    let s = self.len_bytes(n)?.iter().map(|&b| char::from(b)).collect();
                    self.push(Node::Str(s));
                }
                b'U' => {
                    let n = u64::from(self.u8()?);
                    let s = self.len_bytes(n)?.iter().map(|&b| char::from(b)).collect();
                    self.push(Node::Str(s));
                }
                // Bytes.
                b'C' => {
                    let n = u64::from(self.u8()?);
                    let b = self.len_bytes(n)?.to_vec();
                    self.push(Node::Bytes(b));
                }
                b'B' => {
                    let n = u64::from(self.u32()?);
                    let b = self.len_bytes(n)?.to_vec();
                    self.push(Node::Bytes(b));
                }
                0x8e | 0x96 => {
                    let n = self.u64()?;
                    let b = self.len_bytes(n)?.to_vec();
                    self.push(Node::Bytes(b));
                }
                // Containers.
                b']' => self.push(Node::List(Vec::new())),
                b'}' => self.push(Node::Dict(DictNode::default())),
                b')' => self.push(Node::Tuple(Vec::new())),
                0x8f => self.push(Node::Set(Vec::new())),
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Node::List(items));
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Node::Tuple(items));
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.push(Node::Set(items));
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(self.err("stack underflow"));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.push(Node::Tuple(items));
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let dict = self.alloc(Node::Dict(DictNode::default()));
                    self.set_items(dict, &items)?;
                    self.stack.push(dict);
                }
                b'a' => {
                    let v = self.pop()?;
                    let list = self.top()?;
                    self.extend(list, &[v])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    let list = self.top()?;
                    self.extend(list, &items)?;
                }
                0x90 => {
                    let items = self.pop_mark()?;
                    let set = self.top()?;
                    self.extend(set, &items)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let dict = self.top()?;
                    self.set_items(dict, &[k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let dict = self.top()?;
                    self.set_items(dict, &items)?;
                }
                // Memo.
                b'q' => {
                    let i = u64::from(self.u8()?);
                    self.memo_put(i)?;
                }
                b'r' => {
                    let i = u64::from(self.u32()?);
                    self.memo_put(i)?;
                }
                b'p' => {
                    let i = self.line()?.trim().parse::<u64>().map_err(|_| {
                        CheckpointError::Malformed {
                            offset: self.op_start,
                            what: "PUT: bad index".into(),
                        }
                    })?;
                    self.memo_put(i)?;
                }
                0x94 => {
                    let i = self.memo.len() as u64;
                    self.memo_put(i)?;
                }
                b'h' => {
                    let i = u64::from(self.u8()?);
                    self.memo_get(i)?;
                }
                b'j' => {
                    let i = u64::from(self.u32()?);
                    self.memo_get(i)?;
                }
                b'g' => {
                    let i = self.line()?.trim().parse::<u64>().map_err(|_| {
                        CheckpointError::Malformed {
                            offset: self.op_start,
                            what: "GET: bad index".into(),
                        }
                    })?;
                    self.memo_get(i)?;
                }
                // Globals and calls.
                b'c' => {
                    let module = self.line()?.to_string();
                    let name = self.line()?.to_string();
                    self.push(Node::Global { module, name });
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (self.str_of(module), self.str_of(name)) {
                        (Some(m), Some(n)) => {
                            let node = Node::Global {
                                module: m.to_string(),
                                name: n.to_string(),
                            };
                            self.push(node);
                        }
                        _ => return Err(self.err("STACK_GLOBAL needs two strings")),
                    }
                }
                b'R' | 0x81 => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let result = self.call(callable, args)?;
                    self.stack.push(result);
                }
                0x92 => {
                    let _kwargs = self.pop()?;
                    let args = self.pop()?;
                    let class = self.pop()?;
                    let result = self.call(class, args)?;
                    self.stack.push(result);
                }
                b'b' => {
                    let state = self.pop()?;
                    let target = self.top()?;
                    self.build(target, state)?;
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let storage = self.persistent_load(pid)?;
                    self.push(storage);
                }
                b'P' | b'S' | b'V' | b'i' | b'o' | 0x82..=0x84 | 0x97 | 0x98 => {
                    return Err(CheckpointError::Unsupported(format!(
                        "pickle opcode 0x{op:02x} at byte {}",
                        self.op_start
                    )));
                }
                _ => return Err(self.err(format!("unknown opcode 0x{op:02x}"))),
            }
        }
    }

    fn push_str(&mut self, len: u64) -> Result<(), CheckpointError> {
        let offset = self.op_start;
        let raw = self.len_bytes(len)?;
        let s = std::str::from_utf8(raw)
            .map_err(|_| CheckpointError::Malformed {
                offset,
                what: "string is not valid UTF-8".into(),
            })?
            .to_string();
        self.push(Node::Str(s));
        Ok(())
    }

    fn memo_put(&mut self, index: u64) -> Result<(), CheckpointError> {
        let top = self.top()?;
        self.memo.insert(index, top);
        Ok(())
    }

    fn memo_get(&mut self, index: u64) -> Result<(), CheckpointError> {
        let id = *self
            .memo
            .get(&index)
            .ok_or_else(|| self.err(format!("memo index {index} was never stored")))?;
        self.stack.push(id);
        Ok(())
    }

    fn extend(&mut self, target: Id, items: &[Id]) -> Result<(), CheckpointError> {
        match &mut self.nodes[target] {
            Node::List(v) | Node::Set(v) => {
                v.extend_from_slice(items);
                Ok(())
            }
            other => {
                let kind = other.kind();
                Err(self.err(format!("APPEND(S)/ADDITEMS on a {kind}")))
            }
        }
    }
}

/// Builds an int node from LONG1/LONG4 little-endian two's-complement bytes.
fn long_node(raw: Vec<u8>) -> Node {
    let negative = raw.last().is_some_and(|&b| b & 0x80 != 0);
    let fill = if negative { 0xff } else { 0x00 };
    // Fits in i64 when every byte above the 8th is sign extension and the
    // sign of the 8-byte prefix matches.
    let fits = raw.len() <= 8
        || (raw[8..].iter().all(|&b| b == fill) && ((raw[7] & 0x80 != 0) == negative));
    if fits {
        let mut b = [fill; 8];
        let n = raw.len().min(8);
        b[..n].copy_from_slice(&raw[..n]);
        Node::Int(i64::from_le_bytes(b))
    } else {
        Node::BigInt(raw)
    }
}

/// Deducts `n` copied bytes from the conversion budget.
fn charge(budget: &mut Budget, n: usize, offset: usize) -> Result<(), CheckpointError> {
    budget.bytes = budget
        .bytes
        .checked_sub(n)
        .ok_or_else(|| CheckpointError::Malformed {
            offset,
            what: "object graph expands to too many bytes".into(),
        })?;
    Ok(())
}
