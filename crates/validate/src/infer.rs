//! Spec inference from the single-process trace: what the model's ops mean
//! across ranks, each conclusion with the trace evidence behind it.

use crate::Inferred;
use ddmlip_atoms::System;
use ddmlip_engine::{Model, Phase, RowDomain, Trace, TraceShape};
use ddmlip_neighbors::{neighbor_list, NeighborOptions};
use ddmlip_runtime::EvalResult;
use ddmlip_spec::{InputTransform, MLIPSpec, OpAdapter, OutputTransform, ScatterMode};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};

/// One call of an opaque op in the reference trace.
#[derive(Debug, Clone)]
pub(crate) struct OpaqueUse {
    /// Op name without the `opaque:` prefix (the adapter key).
    pub name: String,
    pub inputs: Vec<TraceShape>,
    pub output: TraceShape,
    pub seq: usize,
}

/// What the reference trace says about the model, read once.
#[derive(Debug, Clone, Default)]
pub(crate) struct TraceFacts {
    /// Edges of the largest neighbour list the model built in `forward`
    /// (`None` when it only uses the runtime graph).
    pub model_graph_edges: Option<usize>,
    /// Scope of that neighbour-list op.
    pub model_graph_scope: String,
    /// Atom → System `segment_sum` calls.
    pub system_reductions: usize,
    /// Seq of a System → Atom gather whose input derives from a reduction.
    pub reduction_feeds_atoms: Option<usize>,
    /// Edge → Atom scatter-adds, fused ones (pair sums, message passing)
    /// included.
    pub edge_scatters: usize,
    /// Opaque op calls, first call of each name.
    pub opaque: Vec<OpaqueUse>,
    /// Message-passing depth: cutoffs of the receptive field of the deepest
    /// Atom tensor, measured along the model's own edges.
    pub reach: u32,
    /// Scope of the op where `reach` was attained.
    pub reach_scope: String,
}

fn index_role(index: &str) -> &str {
    index.split(" (").next().unwrap_or(index)
}

fn is_edge_to_atom(index: &str) -> bool {
    index.contains("(Edge → Atom)")
}

/// Reads the facts from the forward events of a single-process trace.
pub(crate) fn trace_facts(trace: &Trace) -> TraceFacts {
    let mut f = TraceFacts::default();
    let mut reach: HashMap<usize, u32> = HashMap::new();
    let mut from_reduction: HashSet<usize> = HashSet::new();
    let mut seen_opaque: HashSet<String> = HashSet::new();
    for e in trace.events.iter().filter(|e| e.phase == Phase::Forward) {
        let in_reach = e
            .input_ids
            .iter()
            .filter_map(|i| reach.get(i))
            .copied()
            .max()
            .unwrap_or(0);
        let by_center = e.indices.iter().any(|i| index_role(i).contains("center"));
        let r = match e.op.as_str() {
            "neighbor_list" => {
                if f.model_graph_edges.is_none_or(|n| e.output.rows > n) {
                    f.model_graph_edges = Some(e.output.rows);
                    f.model_graph_scope = e.scope.clone();
                }
                continue;
            }
            "leaf" | "constant" => 0,
            // An edge vector or length spans one edge: one cutoff from its
            // centre.
            "edge_vectors" | "edge_lengths" => in_reach + 1,
            // A pair sum reads each edge's length (one cutoff from its
            // centre) and adds it onto that centre: an Edge → Atom scatter.
            op if op.starts_with("pair_sum:") => {
                f.edge_scatters += 1;
                in_reach + 1
            }
            // A fused message-passing op is a gather at each edge's
            // neighbour, a per-edge message and a scatter-add onto its centre
            // in one kernel (DESIGN.md §2): count it as the Edge → Atom
            // scatter it is, and let its node inputs, read one edge away,
            // widen the receptive field by one cutoff.
            op if op.starts_with("message:") => {
                f.edge_scatters += 1;
                e.input_ids
                    .iter()
                    .zip(&e.inputs)
                    .map(|(id, shape)| {
                        let r = reach.get(id).copied().unwrap_or(0);
                        if shape.domain == RowDomain::Atom {
                            r + 1
                        } else {
                            r
                        }
                    })
                    .max()
                    .unwrap_or(0)
            }
            "gather"
                if e.inputs.first().map(|s| s.domain) == Some(RowDomain::Atom)
                    && e.output.domain == RowDomain::Edge =>
            {
                // Reading the centre's own row adds nothing; a neighbour's row
                // is one edge further away.
                if by_center {
                    in_reach
                } else {
                    in_reach + 1
                }
            }
            "scatter_add" if e.indices.iter().any(|i| is_edge_to_atom(i)) => {
                f.edge_scatters += 1;
                if by_center {
                    in_reach
                } else {
                    in_reach + 1
                }
            }
            "segment_sum" if e.output.domain == RowDomain::System => {
                f.system_reductions += 1;
                from_reduction.insert(e.output_id);
                0
            }
            _ => in_reach,
        };
        if e.op != "segment_sum" && e.input_ids.iter().any(|i| from_reduction.contains(i)) {
            if e.op == "gather" && e.output.domain == RowDomain::Atom {
                f.reduction_feeds_atoms.get_or_insert(e.seq);
            } else if e.output.domain == RowDomain::System {
                from_reduction.insert(e.output_id);
            }
        }
        if let Some(name) = e.op.strip_prefix("opaque:") {
            if seen_opaque.insert(name.to_string()) {
                f.opaque.push(OpaqueUse {
                    name: name.to_string(),
                    inputs: e.inputs.clone(),
                    output: e.output,
                    seq: e.seq,
                });
            }
        }
        let r = if e.output.domain == RowDomain::System || e.output.domain == RowDomain::None {
            // System rows are exact sums over all atoms once reduced; their
            // receptive field is the whole system, which the reduction handles.
            0
        } else {
            r
        };
        reach.insert(e.output_id, r);
        if e.output.domain == RowDomain::Atom && r > f.reach {
            f.reach = r;
            f.reach_scope = e.scope.clone();
        }
    }
    f
}

/// The adapter the trace shapes of an opaque op call for, with the reason.
pub(crate) fn adapter_for(op: &OpaqueUse) -> (OpAdapter, String) {
    let mut inputs = BTreeMap::new();
    let mut outputs = BTreeMap::new();
    let atom_in: Vec<usize> = op
        .inputs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.domain == RowDomain::Atom)
        .map(|(k, _)| k)
        .collect();
    let edge_in = op.inputs.iter().any(|s| s.domain == RowDomain::Edge);
    let why = match op.output.domain {
        RowDomain::System | RowDomain::None => {
            for k in &atom_in {
                inputs.insert(k.to_string(), InputTransform::SliceOwned);
            }
            outputs.insert("0".to_string(), OutputTransform::AllReduceSum);
            "Atom rows in, System rows out: a reduction over atoms. Each rank must feed only its \
             owned rows (ghost copies would be counted twice) and the per-rank partial results \
             summed over ranks: inputs slice_owned, output all_reduce_sum"
                .to_string()
        }
        RowDomain::Atom if edge_in => {
            for k in &atom_in {
                inputs.insert(k.to_string(), InputTransform::GatherHalo);
            }
            outputs.insert("0".to_string(), OutputTransform::ScatterOutputs);
            "Edge rows in, Atom rows out: the kernel accumulates edge terms onto atoms, so partial \
             sums can land on ghost rows and must be summed home: output scatter_outputs"
                .to_string()
        }
        RowDomain::Atom => {
            for k in &atom_in {
                inputs.insert(k.to_string(), InputTransform::GatherHalo);
            }
            outputs.insert("0".to_string(), OutputTransform::SliceOutputsOwned);
            "Atom rows in, Atom rows out: a per-atom map. Ghost inputs must be fresh \
             (gather_halo) and the owner's row is authoritative, so ghost outputs are refreshed \
             from owners (slice_outputs_owned); scatter_outputs would add ghost rows into \
             owners and double-count a row-wise map"
                .to_string()
        }
        RowDomain::Edge => {
            for k in &atom_in {
                inputs.insert(k.to_string(), InputTransform::GatherHalo);
            }
            "Atom rows in, Edge rows out: the kernel reads atom rows along edges, so ghost rows \
             must be fresh: inputs gather_halo; edge rows are local, no output transform"
                .to_string()
        }
    };
    (
        OpAdapter {
            op: op.name.clone(),
            inputs,
            outputs,
        },
        why,
    )
}

/// The radius (Å) of the model's own neighbour graph, bracketed from the
/// reference geometry: the graph has `edges` pairs, so its cutoff lies
/// between the `edges`-th and the next pair distance. Returns
/// `(largest included distance, first excluded distance)`; `None` when the
/// graph is larger than every pair within `4 × cutoff`.
pub(crate) fn effective_radius(batch: &[System], edges: usize, cutoff: f64) -> Option<(f64, f64)> {
    for factor in [1.0, 1.5, 2.0, 3.0, 4.0] {
        let radius = cutoff * factor;
        let mut distances = Vec::new();
        for sys in batch {
            let nl = neighbor_list(
                &sys.positions,
                sys.cell.as_ref(),
                sys.pbc,
                &NeighborOptions {
                    cutoff: radius,
                    half: false,
                },
            )
            .ok()?;
            distances.extend_from_slice(&nl.distances);
        }
        if distances.len() > edges || (factor == 4.0 && distances.len() == edges) {
            distances.sort_by(f64::total_cmp);
            let included = if edges == 0 {
                0.0
            } else {
                distances[edges - 1]
            };
            let excluded = distances.get(edges).copied().unwrap_or(radius);
            return Some((included, excluded));
        }
    }
    None
}

/// The halo depth (cutoffs of ghosts) a `scatter: local` model needs: its
/// message-passing depth times its graph radius, in units of its cutoff.
pub(crate) fn required_halo_depth(facts: &TraceFacts, radius_upper: f64, cutoff: f64) -> u32 {
    let hops = facts.reach.max(1) as f64;
    let ratio = (radius_upper / cutoff).max(1.0);
    // Distances are compared with a small relative slack so that a graph
    // radius equal to the cutoff does not round up to two.
    ((hops * ratio) * (1.0 - 1e-9)).ceil().max(1.0) as u32
}

/// Inference context.
pub(crate) struct InferInput<'a> {
    pub model: &'a dyn Model,
    pub prior: Option<MLIPSpec>,
    pub facts: &'a TraceFacts,
    pub reference: &'a EvalResult,
    /// Upper bound of the model's own graph radius (Å), when it builds one.
    pub graph_radius: Option<(f64, f64)>,
}

fn output_evidence(name: &str, width: usize, kind: &str) -> String {
    match name {
        "energy" => "model output `energy`: one row per system (System×1)".into(),
        "forces" => "autograd output −∂E/∂positions: one row of 3 per atom".into(),
        "stress" => "autograd output (1/V)·∂E/∂strain: one row of 6 per system".into(),
        "atomic_energies" => "model output `atomic_energies`: Atom×1 rows".into(),
        _ => format!("extra model output `{name}`: {kind} rows of width {width}"),
    }
}

/// Builds the candidate spec. The prior is kept verbatim; only output kinds
/// it does not mention are added. Without a prior every field is inferred.
pub(crate) fn infer_spec(input: &InferInput<'_>) -> (MLIPSpec, Vec<Inferred>) {
    let facts = input.facts;
    let mut inferred = Vec::new();
    let has_prior = input.prior.is_some();
    let mut spec = input.prior.clone().unwrap_or_default();
    for (name, out) in &input.reference.outputs {
        if name.starts_with('_') || spec.output_kinds.contains_key(name) {
            continue;
        }
        let kind_text = serde_json::to_value(out.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        spec.output_kinds.insert(name.clone(), out.kind);
        inferred.push(Inferred {
            field: format!("output_kinds.{name}"),
            value: json!(kind_text),
            evidence: output_evidence(name, out.width, &kind_text),
        });
    }
    if has_prior {
        return (spec, inferred);
    }
    // Scatter mode.
    if let Some(edges) = facts.model_graph_edges {
        spec.policy.scatter = ScatterMode::Local;
        inferred.push(Inferred {
            field: "policy.scatter".into(),
            value: json!("local"),
            evidence: format!(
                "the model builds its own neighbour list in forward ({edges} edges{}); that \
                 graph already holds ghost-centred pairs, so halo-correcting its scatters would \
                 count them twice",
                scope_suffix(&facts.model_graph_scope)
            ),
        });
    } else {
        spec.policy.scatter = ScatterMode::HaloCorrection;
        inferred.push(Inferred {
            field: "policy.scatter".into(),
            value: json!("halo_correction"),
            evidence: format!(
                "{} Edge → Atom scatter-add(s) over the runtime graph, which holds only \
                 owned-centred edges: partial sums on ghost rows are summed home, then ghosts \
                 refreshed for the next layer",
                facts.edge_scatters
            ),
        });
    }
    inferred.push(Inferred {
        field: "policy.gather".into(),
        value: json!("halo_read"),
        evidence: "Atom → Edge gathers read ghost rows; they are refreshed when stale".into(),
    });
    spec.system_reductions = true;
    let red_evidence = match (facts.system_reductions, facts.reduction_feeds_atoms) {
        (0, _) => "no Atom → System reduction seen; on by default (harmless)".to_string(),
        (n, Some(seq)) => format!(
            "{n} Atom → System segment_sum(s); a reduction result is gathered back onto atoms at \
             op #{seq}, so every rank needs the exact total: sum owned rows only, then all-reduce"
        ),
        (n, None) => format!(
            "{n} Atom → System segment_sum(s): ghosts must not be counted, so sum owned rows, \
             then all-reduce"
        ),
    };
    inferred.push(Inferred {
        field: "system_reductions".into(),
        value: json!(true),
        evidence: red_evidence,
    });
    if input.reference.outputs.contains_key("stress")
        && !spec.all_reduce_outputs.iter().any(|o| o == "stress")
    {
        spec.all_reduce_outputs.push("stress".into());
        inferred.push(Inferred {
            field: "all_reduce_outputs".into(),
            value: json!(["stress"]),
            evidence: "stress comes from the strain gradient, which each rank only holds as the \
                       partial over its own ops: it must be summed over ranks"
                .into(),
        });
    }
    for op in &facts.opaque {
        let (adapter, why) = adapter_for(op);
        inferred.push(Inferred {
            field: format!("op_adapters.{}", op.name),
            value: serde_json::to_value(&adapter).unwrap_or_default(),
            evidence: format!("opaque op at #{}: {why}", op.seq),
        });
        spec.op_adapters.push(adapter);
    }
    let depth = if spec.policy.scatter == ScatterMode::Local {
        let cutoff = input.model.cutoff();
        let upper = crate::graph_upper(input.graph_radius, cutoff);
        let d = required_halo_depth(facts, upper, cutoff);
        inferred.push(Inferred {
            field: "halo_depth".into(),
            value: json!(d),
            evidence: format!(
                "scatter local means no per-layer exchange: ghosts must carry the whole receptive \
                 field, {} message-passing hop(s) × graph radius ≤ {upper:.3} Å over cutoff {cutoff} Å",
                facts.reach.max(1)
            ),
        });
        d
    } else {
        1
    };
    spec.halo_depth = depth;
    (spec, inferred)
}

fn scope_suffix(scope: &str) -> String {
    if scope.is_empty() {
        String::new()
    } else {
        format!(" in `{scope}`")
    }
}
