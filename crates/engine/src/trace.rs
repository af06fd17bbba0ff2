use crate::RowDomain;
use serde::{Deserialize, Serialize};

/// Forward or backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Recorded while the model builds its outputs.
    Forward,
    /// Run while differentiating the outputs.
    Backward,
}

/// Domain and shape of one tensor in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceShape {
    /// What the rows index (atoms, edges, systems…).
    pub domain: RowDomain,
    /// Number of rows on this rank.
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
}

/// One op call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// Position in the trace (0-based).
    pub seq: usize,
    /// Whether the event was recorded in the forward or the backward pass.
    pub phase: Phase,
    /// Op name (`gather`, `scatter_add`, `halo_refresh`, an opaque op's name, …).
    pub op: String,
    /// Scope labels pushed by the model (e.g. `interaction_2`), joined by `/`.
    pub scope: String,
    /// Shapes of the op's tensor inputs, in argument order.
    pub inputs: Vec<TraceShape>,
    /// Shape of the op's output.
    pub output: TraceShape,
    /// Index arrays the op used, e.g. `edge_center (Edge → Atom)`.
    pub indices: Vec<String>,
    /// Distributed handler that fired, if any.
    pub handler: Option<String>,
    /// Sum of the output over owned rows (all rows for non-Atom domains).
    pub owned_sum: f64,
    /// Sum of squares over the same rows.
    pub owned_sum_sq: f64,
    /// Whether the output is identical on every rank.
    pub replicated: bool,
    /// Tensor ids of the inputs (data flow; ids are positions in the graph).
    pub input_ids: Vec<usize>,
    /// Tensor id of the output.
    pub output_id: usize,
    /// The device the op ran on (`cuda:0`); absent for the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// The record of one run: every op in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// Events in execution order (`seq` = index).
    pub events: Vec<TraceEvent>,
}

impl Trace {
    pub(crate) fn push(&mut self, mut e: TraceEvent) {
        e.seq = self.events.len();
        self.events.push(e);
    }

    /// Forward events only.
    pub fn forward(&self) -> impl Iterator<Item = &TraceEvent> {
        self.events.iter().filter(|e| e.phase == Phase::Forward)
    }

    /// Serialises to JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// One line per event, for humans.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for e in &self.events {
            let ins: Vec<String> = e
                .inputs
                .iter()
                .map(|s| format!("{:?}[{}×{}]", s.domain, s.rows, s.cols))
                .collect();
            out.push_str(&format!(
                "{:>5} {:<8} {:<28} {:<24} -> {:?}[{}×{}]",
                e.seq,
                match e.phase {
                    Phase::Forward => "fwd",
                    Phase::Backward => "bwd",
                },
                e.op,
                ins.join(", "),
                e.output.domain,
                e.output.rows,
                e.output.cols
            ));
            if !e.indices.is_empty() {
                out.push_str(&format!("  by {}", e.indices.join(", ")));
            }
            if let Some(h) = &e.handler {
                out.push_str(&format!("  [{h}]"));
            }
            if !e.scope.is_empty() {
                out.push_str(&format!("  @{}", e.scope));
            }
            out.push('\n');
        }
        out
    }
}
