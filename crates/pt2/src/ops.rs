//! The core-ATen ops the importer maps to engine ops, and the default
//! arguments the archive omits (torch.export drops arguments equal to their
//! schema default; the importer puts them back so that the mapping reads
//! every argument it depends on).

use crate::ir::Arg;

/// One supported op: its name and its defaulted arguments.
struct OpSchema {
    name: &'static str,
    defaults: &'static [(&'static str, Default)],
}

/// A schema default, written without allocation.
#[derive(Clone, Copy)]
enum Default {
    None,
    Int(i64),
    Float(f64),
    Bool(bool),
    EmptyInts,
}

impl Default {
    fn to_arg(self) -> Arg {
        match self {
            Default::None => Arg::AsNone(serde_json::Value::Bool(true)),
            Default::Int(v) => Arg::AsInt(v),
            Default::Float(v) => Arg::AsFloat(v),
            Default::Bool(v) => Arg::AsBool(v),
            Default::EmptyInts => Arg::AsInts(Vec::new()),
        }
    }
}

const SCHEMAS: &[OpSchema] = &[
    OpSchema {
        name: "aten._assert_tensor_metadata.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.sym_size.int",
        defaults: &[],
    },
    OpSchema {
        name: "aten.select.int",
        defaults: &[],
    },
    OpSchema {
        name: "aten.index.Tensor",
        defaults: &[],
    },
    OpSchema {
        name: "aten.add.Tensor",
        defaults: &[("alpha", Default::Int(1))],
    },
    OpSchema {
        name: "aten.sub.Tensor",
        defaults: &[("alpha", Default::Int(1))],
    },
    OpSchema {
        name: "aten.mul.Tensor",
        defaults: &[],
    },
    OpSchema {
        name: "aten.div.Tensor",
        defaults: &[],
    },
    OpSchema {
        name: "aten.linalg_norm.default",
        defaults: &[
            ("ord", Default::None),
            ("dim", Default::None),
            ("keepdim", Default::Bool(false)),
        ],
    },
    OpSchema {
        name: "aten.linalg_vector_norm.default",
        defaults: &[
            ("ord", Default::Float(2.0)),
            ("dim", Default::None),
            ("keepdim", Default::Bool(false)),
        ],
    },
    OpSchema {
        name: "aten.linspace.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.unsqueeze.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.squeeze.dim",
        defaults: &[],
    },
    OpSchema {
        name: "aten.pow.Tensor_Scalar",
        defaults: &[],
    },
    OpSchema {
        name: "aten.exp.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.cos.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.sin.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.sqrt.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.silu.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.tanh.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.sigmoid.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.neg.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.linear.default",
        defaults: &[("bias", Default::None)],
    },
    OpSchema {
        name: "aten.lt.Scalar",
        defaults: &[],
    },
    OpSchema {
        name: "aten.to.dtype",
        defaults: &[
            ("non_blocking", Default::Bool(false)),
            ("copy", Default::Bool(false)),
        ],
    },
    OpSchema {
        name: "aten.zeros.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.zeros_like.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.index_add.default",
        defaults: &[("alpha", Default::Int(1))],
    },
    OpSchema {
        name: "aten.sum.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.sum.dim_IntList",
        defaults: &[
            ("dim", Default::EmptyInts),
            ("keepdim", Default::Bool(false)),
        ],
    },
    OpSchema {
        name: "aten.embedding.default",
        defaults: &[
            ("padding_idx", Default::Int(-1)),
            ("scale_grad_by_freq", Default::Bool(false)),
            ("sparse", Default::Bool(false)),
        ],
    },
    OpSchema {
        name: "aten.einsum.default",
        defaults: &[("path", Default::None)],
    },
    OpSchema {
        name: "aten.tensordot.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.permute.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.reshape.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.narrow.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.slice.Tensor",
        defaults: &[
            ("dim", Default::Int(0)),
            ("start", Default::None),
            ("end", Default::None),
            ("step", Default::Int(1)),
        ],
    },
    OpSchema {
        name: "aten.cat.default",
        defaults: &[("dim", Default::Int(0))],
    },
    OpSchema {
        name: "aten.stack.default",
        defaults: &[("dim", Default::Int(0))],
    },
    OpSchema {
        name: "aten.expand.default",
        defaults: &[("implicit", Default::Bool(false))],
    },
    OpSchema {
        name: "aten.expand_as.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.broadcast_tensors.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.clamp_min.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.ones_like.default",
        defaults: &[],
    },
    // What NequIP, Allegro and MACE graphs add (functionalized by
    // `run_decompositions({})`: in-place writes become `copy`/`slice_scatter`).
    OpSchema {
        name: "aten.view.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten._unsafe_view.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.clone.default",
        defaults: &[("memory_format", Default::None)],
    },
    OpSchema {
        name: "aten.alias.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten._to_copy.default",
        defaults: &[
            ("dtype", Default::None),
            ("non_blocking", Default::Bool(false)),
        ],
    },
    OpSchema {
        name: "aten.new_zeros.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.ones.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.copy.default",
        defaults: &[("non_blocking", Default::Bool(false))],
    },
    OpSchema {
        name: "aten.slice_scatter.default",
        defaults: &[
            ("dim", Default::Int(0)),
            ("start", Default::None),
            ("end", Default::None),
            ("step", Default::Int(1)),
        ],
    },
    OpSchema {
        name: "aten.scatter_add.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.index_select.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.mm.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.matmul.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.addcmul.default",
        defaults: &[("value", Default::Int(1))],
    },
    OpSchema {
        name: "aten.rsub.Scalar",
        defaults: &[("alpha", Default::Int(1))],
    },
    OpSchema {
        name: "aten.square.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.sinc.default",
        defaults: &[],
    },
    OpSchema {
        name: "aten.pow.Tensor_Tensor",
        defaults: &[],
    },
    OpSchema {
        name: "aten.lt.Tensor",
        defaults: &[],
    },
    OpSchema {
        name: "aten.one_hot.default",
        defaults: &[("num_classes", Default::Int(-1))],
    },
    OpSchema {
        name: "_operator.mul",
        defaults: &[],
    },
    OpSchema {
        name: "_operator.add",
        defaults: &[],
    },
    OpSchema {
        name: "_operator.sub",
        defaults: &[],
    },
    OpSchema {
        name: "_operator.floordiv",
        defaults: &[],
    },
];

/// Whether the importer maps `op` (e.g. `aten.index_add.default`).
pub fn is_supported(op: &str) -> bool {
    SCHEMAS.iter().any(|s| s.name == op)
}

/// The supported ops, sorted.
pub fn supported_ops() -> Vec<&'static str> {
    let mut v: Vec<_> = SCHEMAS.iter().map(|s| s.name).collect();
    v.sort_unstable();
    v
}

/// Appends the schema defaults of `op` that `args` lacks.
pub(crate) fn apply_defaults(op: &str, args: &mut Vec<(String, Arg)>) {
    let Some(schema) = SCHEMAS.iter().find(|s| s.name == op) else {
        return;
    };
    for (name, default) in schema.defaults {
        if !args.iter().any(|(n, _)| n == name) {
            args.push((name.to_string(), default.to_arg()));
        }
    }
}
