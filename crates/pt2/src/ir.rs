//! The exported program as a typed IR: the serde image of
//! `models/<name>.json` (torch.export schema 8.x) and the program built from
//! it, with size expressions parsed and ATen defaults applied.

use crate::symbols::SizeExpr;
use crate::Pt2Error;
use serde::Deserialize;
use std::collections::BTreeMap;

/// `schema_version` of the graph JSON.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub struct SchemaVersion {
    /// Major version; 8 for torch 2.9–2.11.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawModel {
    pub graph_module: RawGraphModule,
    pub schema_version: SchemaVersion,
    #[serde(default)]
    pub torch_version: Option<String>,
    #[serde(default)]
    pub range_constraints: BTreeMap<String, RawRange>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawRange {
    pub min_val: Option<i64>,
    pub max_val: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawGraphModule {
    pub graph: RawGraph,
    pub signature: RawSignature,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawGraph {
    pub nodes: Vec<RawNode>,
    #[serde(default)]
    pub tensor_values: BTreeMap<String, RawTensorMeta>,
    #[serde(default)]
    pub sym_int_values: BTreeMap<String, RawSymInt>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawSignature {
    pub input_specs: Vec<BTreeMap<String, RawInputSpec>>,
    pub output_specs: Vec<BTreeMap<String, RawOutputSpec>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawInputSpec {
    pub arg: serde_json::Value,
    #[serde(default)]
    pub parameter_name: Option<String>,
    #[serde(default)]
    pub buffer_name: Option<String>,
    #[serde(default)]
    pub tensor_constant_name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawOutputSpec {
    pub arg: Arg,
}

/// Tensor metadata as the schema writes it (also in
/// `model_weights_config.json`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RawTensorMeta {
    pub dtype: i64,
    pub sizes: Vec<RawSymInt>,
    #[serde(default)]
    pub strides: Vec<RawSymInt>,
    #[serde(default)]
    pub storage_offset: Option<RawSymInt>,
}

/// A size: a literal or a sympy expression over size symbols.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawSymInt {
    AsInt(i64),
    AsExpr { expr_str: String },
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawNode {
    pub target: String,
    pub inputs: Vec<RawNamedArg>,
    pub outputs: Vec<Arg>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawNamedArg {
    pub name: String,
    pub arg: Arg,
}

/// A reference to a named tensor.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct TensorName {
    /// The tensor's name in the graph.
    pub name: String,
}

/// A symbolic integer argument: a named value of the graph or a literal.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum SymIntArg {
    /// A value computed in the graph (e.g. by `sym_size`).
    AsName(String),
    /// A literal.
    AsInt(i64),
}

/// One argument of a node, as the schema tags it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Arg {
    /// `None`.
    AsNone(serde_json::Value),
    /// One tensor.
    AsTensor(TensorName),
    /// A list of tensors.
    AsTensors(Vec<TensorName>),
    /// An integer.
    AsInt(i64),
    /// A list of integers.
    AsInts(Vec<i64>),
    /// A float.
    AsFloat(f64),
    /// A list of floats.
    AsFloats(Vec<f64>),
    /// A string (einsum equations, …).
    AsString(String),
    /// A boolean.
    AsBool(bool),
    /// A list of booleans.
    AsBools(Vec<bool>),
    /// A symbolic integer (node output or argument).
    AsSymInt(SymIntArg),
    /// A list of symbolic integers.
    AsSymInts(Vec<SymIntArg>),
    /// A dtype code (the schema's `ScalarType`: 7 f32, 8 f64, 5 int64, 12 bool).
    AsScalarType(i64),
    /// A layout code.
    AsLayout(i64),
    /// A memory format code.
    AsMemoryFormat(i64),
    /// A device.
    AsDevice(serde_json::Value),
    /// Any other tag: kept so that the graph still parses and the op can be
    /// reported as unsupported.
    #[serde(untagged)]
    Other(serde_json::Value),
}

/// The dtype codes of the schema's `ScalarType` that the importer reads.
pub mod dtype {
    /// int32.
    pub const INT32: i64 = 4;
    /// int64.
    pub const INT64: i64 = 5;
    /// float32.
    pub const FLOAT32: i64 = 7;
    /// float64.
    pub const FLOAT64: i64 = 8;
    /// bool.
    pub const BOOL: i64 = 12;
}

/// Shape and dtype of a tensor of the graph.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorMeta {
    /// The schema's dtype code (see [`dtype`]).
    pub dtype: i64,
    /// One size per dimension.
    pub sizes: Vec<SizeExpr>,
}

/// One op application.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The op without the `torch.ops.` prefix, e.g. `aten.index_add.default`.
    pub op: String,
    /// Arguments by schema name, in the archive's order, with the ATen
    /// defaults the archive omitted appended (see [`crate::ops`]).
    pub args: Vec<(String, Arg)>,
    /// Names of the values the node produces (tensors or symbolic ints);
    /// empty for assertions.
    pub outputs: Vec<String>,
}

impl Node {
    /// The argument named `name`, if present.
    pub fn arg(&self, name: &str) -> Option<&Arg> {
        self.args.iter().find(|(n, _)| n == name).map(|(_, a)| a)
    }

    /// The name a node is known by in messages: its first output, else its op.
    pub fn label(&self) -> &str {
        self.outputs
            .first()
            .map_or(self.op.as_str(), String::as_str)
    }
}

/// Where a graph input comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputKind {
    /// A parameter, by its state-dict name.
    Parameter(String),
    /// A buffer, by its state-dict name.
    Buffer(String),
    /// A lifted tensor constant, by its name.
    Constant(String),
    /// A user input (positions, species, …).
    User,
}

/// One graph input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphInput {
    /// The tensor's name in the graph.
    pub name: String,
    /// Its source.
    pub kind: InputKind,
}

/// Allowed range of a size symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymbolRange {
    /// Smallest value, if bounded.
    pub min: Option<i64>,
    /// Largest value, if bounded.
    pub max: Option<i64>,
}

/// The exported program.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// Graph schema version.
    pub schema: SchemaVersion,
    /// The torch version that wrote it, when recorded.
    pub torch_version: Option<String>,
    /// Inputs in call order: lifted parameters/buffers/constants, then user inputs.
    pub inputs: Vec<GraphInput>,
    /// Output tensor names in order.
    pub outputs: Vec<String>,
    /// Nodes in execution order.
    pub nodes: Vec<Node>,
    /// Shape and dtype of every tensor value.
    pub tensors: BTreeMap<String, TensorMeta>,
    /// Values of named symbolic ints (`sym_size` outputs).
    pub sym_ints: BTreeMap<String, SizeExpr>,
    /// Size symbols and their ranges.
    pub symbols: BTreeMap<String, SymbolRange>,
}

fn json_err(member: &str, e: impl std::fmt::Display) -> Pt2Error {
    Pt2Error::Json {
        member: member.to_string(),
        message: e.to_string(),
    }
}

pub(crate) fn parse_sizes(sizes: &[RawSymInt], member: &str) -> Result<Vec<SizeExpr>, Pt2Error> {
    sizes
        .iter()
        .map(|s| match s {
            RawSymInt::AsInt(n) => Ok(SizeExpr::constant(*n)),
            RawSymInt::AsExpr { expr_str } => {
                SizeExpr::parse(expr_str).map_err(|m| json_err(member, m))
            }
        })
        .collect()
}

impl Program {
    /// Parses the graph JSON (`member` names it in errors), checks the
    /// schema version and applies ATen defaults.
    pub fn from_json(text: &[u8], member: &str) -> Result<Program, Pt2Error> {
        // The schema version first, so that another layout is refused as
        // such rather than as a parse error of some field.
        #[derive(Deserialize)]
        struct VersionOnly {
            schema_version: SchemaVersion,
        }
        let version: VersionOnly = serde_json::from_slice(text).map_err(|e| json_err(member, e))?;
        if version.schema_version.major != crate::SUPPORTED_SCHEMA_MAJOR {
            return Err(Pt2Error::UnsupportedVersion {
                found: format!(
                    "graph schema {}.{}",
                    version.schema_version.major, version.schema_version.minor
                ),
                supported: crate::SUPPORTED_VERSIONS,
            });
        }
        let raw: RawModel = serde_json::from_slice(text).map_err(|e| json_err(member, e))?;
        let graph = raw.graph_module.graph;
        let mut inputs = Vec::new();
        for spec in &raw.graph_module.signature.input_specs {
            let (kind_name, spec) = spec
                .iter()
                .next()
                .ok_or_else(|| json_err(member, "an empty input spec"))?;
            let name = input_arg_name(&spec.arg).ok_or_else(|| {
                json_err(
                    member,
                    format!("input spec `{kind_name}` without a tensor name"),
                )
            })?;
            let kind = match kind_name.as_str() {
                "parameter" => {
                    InputKind::Parameter(spec.parameter_name.clone().unwrap_or_default())
                }
                "buffer" => InputKind::Buffer(spec.buffer_name.clone().unwrap_or_default()),
                "tensor_constant" => {
                    InputKind::Constant(spec.tensor_constant_name.clone().unwrap_or_default())
                }
                "user_input" => InputKind::User,
                other => {
                    return Err(Pt2Error::Contract {
                        message: format!("unsupported graph input kind `{other}` for `{name}`"),
                    })
                }
            };
            inputs.push(GraphInput { name, kind });
        }
        let mut outputs = Vec::new();
        for spec in &raw.graph_module.signature.output_specs {
            let (kind_name, spec) = spec
                .iter()
                .next()
                .ok_or_else(|| json_err(member, "an empty output spec"))?;
            if kind_name != "user_output" {
                return Err(Pt2Error::Contract {
                    message: format!("unsupported graph output kind `{kind_name}` (mutated buffers or gradients are not part of the contract)"),
                });
            }
            match &spec.arg {
                Arg::AsTensor(t) => outputs.push(t.name.clone()),
                other => {
                    return Err(Pt2Error::Contract {
                        message: format!("an output that is not a tensor: {other:?}"),
                    })
                }
            }
        }
        let mut tensors = BTreeMap::new();
        for (name, meta) in &graph.tensor_values {
            tensors.insert(
                name.clone(),
                TensorMeta {
                    dtype: meta.dtype,
                    sizes: parse_sizes(&meta.sizes, member)?,
                },
            );
        }
        let mut sym_ints = BTreeMap::new();
        for (name, v) in &graph.sym_int_values {
            sym_ints.insert(
                name.clone(),
                parse_sizes(std::slice::from_ref(v), member)?.remove(0),
            );
        }
        let mut nodes = Vec::with_capacity(graph.nodes.len());
        for raw_node in graph.nodes {
            let op = raw_node
                .target
                .strip_prefix("torch.ops.")
                .unwrap_or(&raw_node.target)
                .to_string();
            let mut outs = Vec::new();
            for o in &raw_node.outputs {
                match o {
                    Arg::AsTensor(t) => outs.push(t.name.clone()),
                    Arg::AsTensors(ts) => outs.extend(ts.iter().map(|t| t.name.clone())),
                    Arg::AsSymInt(SymIntArg::AsName(n)) => outs.push(n.clone()),
                    Arg::AsNone(_) => {}
                    // Other outputs (symbolic floats, …) surface when the op is mapped.
                    _ => outs.push(String::new()),
                }
            }
            let mut args: Vec<(String, Arg)> = raw_node
                .inputs
                .into_iter()
                .map(|a| (a.name, a.arg))
                .collect();
            crate::ops::apply_defaults(&op, &mut args);
            nodes.push(Node {
                op,
                args,
                outputs: outs,
            });
        }
        let symbols = raw
            .range_constraints
            .iter()
            .map(|(k, r)| {
                (
                    k.clone(),
                    SymbolRange {
                        min: r.min_val,
                        max: r.max_val,
                    },
                )
            })
            .collect();
        Ok(Program {
            schema: raw.schema_version,
            torch_version: raw.torch_version,
            inputs,
            outputs,
            nodes,
            tensors,
            sym_ints,
            symbols,
        })
    }

    /// Op names with their counts, sorted by name (assertion nodes included).
    pub fn op_counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for n in &self.nodes {
            *counts.entry(n.op.clone()).or_insert(0) += 1;
        }
        counts
    }

    /// The user inputs' names, in call order.
    pub fn user_inputs(&self) -> Vec<&str> {
        self.inputs
            .iter()
            .filter(|i| i.kind == InputKind::User)
            .map(|i| i.name.as_str())
            .collect()
    }
}

fn input_arg_name(arg: &serde_json::Value) -> Option<String> {
    // `{"name": ..}` for lifted inputs, `{"as_tensor": {"name": ..}}` for user inputs.
    arg.get("name")
        .or_else(|| arg.get("as_tensor").and_then(|t| t.get("name")))
        .and_then(|n| n.as_str())
        .map(str::to_string)
}
