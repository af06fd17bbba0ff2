//! The auto-fix rule engine: known failure patterns → spec mutations.
//!
//! Rules are listed in the order they are tried. Each looks at the static
//! evidence (reference trace facts) and at the failed attempt (which outputs
//! failed, by what ratio, which handlers fired) and proposes one mutation of
//! that attempt's spec with a rationale.

use crate::compare::Comparison;
use crate::infer::{adapter_for, TraceFacts};
use ddmlip_spec::{MLIPSpec, ScatterMode};
use std::collections::BTreeMap;

/// What a rule may look at.
pub(crate) struct Evidence<'a> {
    pub facts: &'a TraceFacts,
    pub uses_runtime_graph: bool,
    pub ranks: usize,
    /// Halo depth the receptive field needs under `scatter: local`.
    pub required_depth: u32,
    /// Text describing how `required_depth` was obtained.
    pub depth_reason: String,
}

/// The outcome of one attempt, as the rules see it.
pub(crate) struct Outcome<'a> {
    pub spec: &'a MLIPSpec,
    pub comparison: Option<&'a Comparison>,
    pub handler_counts: &'a BTreeMap<String, usize>,
    /// The halo-completeness check failed for this attempt's ghost width.
    pub halo_incomplete: bool,
}

fn failed(o: &Outcome<'_>, name: &str) -> bool {
    o.comparison
        .is_some_and(|c| c.failed.iter().any(|f| f == name))
}

fn near(x: f64, target: f64) -> bool {
    x.is_finite() && (x - target).abs() <= 0.05 * target.abs().max(1.0)
}

/// Every applicable mutation of `o.spec`, in rule order.
pub(crate) fn candidates(o: &Outcome<'_>, ev: &Evidence<'_>) -> Vec<(MLIPSpec, String)> {
    let mut out = Vec::new();
    let spec = o.spec;
    let any_failed = o.comparison.is_none_or(|c| !c.failed.is_empty());
    if !any_failed {
        return out;
    }
    let ratio = |name: &str| {
        o.comparison
            .and_then(|c| c.ratio.get(name).copied())
            .unwrap_or(f64::NAN)
    };

    // (a) A graph built inside the model already contains ghost-centred
    // pairs: halo-correcting its scatters adds those pairs a second time.
    if spec.policy.scatter != ScatterMode::Local
        && (ev.facts.model_graph_edges.is_some() || !ev.uses_runtime_graph)
    {
        let mut s = spec.clone();
        s.policy.scatter = ScatterMode::Local;
        let ae = ratio("atomic_energies");
        let energies = if ae.is_finite() && ae > 1.05 {
            format!(" Owned atoms' energies come out {ae:.2}× too large, the double count.")
        } else {
            String::new()
        };
        let graph = match ev.facts.model_graph_edges {
            Some(n) => format!("the model builds its own neighbour list in forward ({n} edges)"),
            None => "the model does not use the runtime graph".to_string(),
        };
        out.push((
            s,
            format!(
                "halo-unaware graph double count: {graph}, which already covers ghost-centred \
                 pairs, so `scatter: {}` sums their contributions onto owners twice → \
                 `scatter: local`.{energies}",
                mode_name(spec.policy.scatter)
            ),
        ));
    }

    // (a′) The converse: the runtime graph only has owned-centred edges, so
    // with `scatter: local` ghost rows of every scatter stay empty and the
    // next layer reads stale ghosts.
    if spec.policy.scatter == ScatterMode::Local
        && ev.facts.model_graph_edges.is_none()
        && ev.uses_runtime_graph
        && ev.facts.edge_scatters > 0
    {
        let mut s = spec.clone();
        s.policy.scatter = ScatterMode::HaloCorrection;
        out.push((
            s,
            format!(
                "`scatter: local` on the runtime graph: its edges are centred on owned atoms only, \
                 so the {} Edge → Atom scatter(s) leave ghost rows unset{} (message-passing depth \
                 {}) → `scatter: halo_correction`, which refreshes ghosts after every scatter",
                ev.facts.edge_scatters,
                if spec.policy.gather == ddmlip_spec::GatherMode::Local {
                    " and `gather: local` reads them stale"
                } else {
                    ""
                },
                ev.facts.reach
            ),
        ));
    }

    // (b) Per-system autograd outputs are per-rank partials.
    for (name, kind) in &spec.output_kinds {
        if *kind != ddmlip_spec::OutputKind::PerSystem
            || name == "energy"
            || spec.all_reduce_outputs.iter().any(|o| o == name)
            || !failed(o, name)
            || near(ratio(name), ev.ranks as f64)
        {
            continue;
        }
        let mut s = spec.clone();
        s.all_reduce_outputs.push(name.clone());
        let r = ratio(name);
        out.push((
            s,
            format!(
                "per-rank partial: `{name}` is per-system and came out as {} of the reference; \
                 each rank only holds its own share (strain gradients are partial sums over the \
                 rank's ops) → add `{name}` to all_reduce_outputs",
                if r.is_finite() {
                    format!("{r:.3}×")
                } else {
                    "a fraction".to_string()
                }
            ),
        ));
    }

    // (c) × world size: an output summed over ranks although every rank
    // already held the full value.
    for name in &spec.all_reduce_outputs {
        let r = ratio(name);
        if failed(o, name) && near(r, ev.ranks as f64) {
            let mut s = spec.clone();
            s.all_reduce_outputs.retain(|x| x != name);
            out.push((
                s,
                format!(
                    "× world_size blow-up: `{name}` is {r:.3}× the reference with {} ranks — it \
                     was already complete on every rank and the extra all-reduce summed the \
                     copies → remove `{name}` from all_reduce_outputs",
                    ev.ranks
                ),
            ));
        }
    }

    // (d) Undeclared opaque ops see ghost rows as if they were owned.
    let undeclared: Vec<_> = ev
        .facts
        .opaque
        .iter()
        .filter(|op| spec.adapter(&op.name).is_none())
        .collect();
    if !undeclared.is_empty() {
        let mut s = spec.clone();
        let mut why = Vec::new();
        for op in undeclared {
            let (a, reason) = adapter_for(op);
            let fired = o
                .handler_counts
                .get(&format!("opaque:{}(undeclared)", op.name))
                .copied()
                .unwrap_or(0);
            why.push(format!(
                "`{}` (fired undeclared {fired}×): {reason}",
                op.name
            ));
            s.op_adapters.push(a);
        }
        out.push((
            s,
            format!(
                "undeclared opaque op(s) ran on all local rows, ghosts included → add adapter(s): {}",
                why.join("; ")
            ),
        ));
    }

    // (e) Reductions that count ghosts.
    if !spec.system_reductions && ev.facts.system_reductions > 0 {
        let mut s = spec.clone();
        s.system_reductions = true;
        let fired = o
            .handler_counts
            .get("reduce:system(local)")
            .copied()
            .unwrap_or(0);
        let feeds = match ev.facts.reduction_feeds_atoms {
            Some(seq) => format!(
                "; the result is gathered back onto atoms (op #{seq}), so the error spreads into \
                 per-atom features"
            ),
            None => String::new(),
        };
        out.push((
            s,
            format!(
                "missing system_reductions: {} Atom → System segment_sum(s) summed ghost rows as \
                 well as owned ones (handler reduce:system(local) fired {fired}×){feeds} → \
                 `system_reductions: true`",
                ev.facts.system_reductions
            ),
        ));
    }

    // (f) Halo thinner than the receptive field of a model without
    // per-layer exchange.
    if spec.policy.scatter == ScatterMode::Local
        && (ev.required_depth > spec.halo_depth || o.halo_incomplete)
    {
        let mut s = spec.clone();
        s.halo_depth = ev.required_depth.max(spec.halo_depth + 1);
        out.push((
            s.clone(),
            format!(
                "halo too thin for the receptive field: with `scatter: local` ghosts are never \
                 exchanged between layers, so they must carry the whole receptive field; {} → \
                 halo_depth {} → {}",
                ev.depth_reason, spec.halo_depth, s.halo_depth
            ),
        ));
    }
    out
}

pub(crate) fn mode_name(m: ScatterMode) -> &'static str {
    match m {
        ScatterMode::HaloCorrection => "halo_correction",
        ScatterMode::Refresh => "refresh",
        ScatterMode::Local => "local",
    }
}
