//! A summary of an archive for `ddmlip models --inspect`.

use crate::ir::InputKind;
use crate::{Pt2Archive, Pt2Error};
use std::fmt::Write as _;
use std::path::Path;

/// What an archive holds, as `ddmlip models --inspect` prints it.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The archive.
    pub archive: Pt2Archive,
    /// Every op with its count and whether the importer maps it, by name.
    pub ops: Vec<(String, usize, bool)>,
}

/// Reads `path` and summarises it. An archive with unsupported ops is
/// inspected (they are listed); an unreadable one is an error.
pub fn inspect(path: impl AsRef<Path>) -> Result<Inspection, Pt2Error> {
    let archive = Pt2Archive::read(path)?;
    let ops = archive
        .program
        .op_counts()
        .into_iter()
        .map(|(op, n)| {
            let ok = crate::ops::is_supported(&op);
            (op, n, ok)
        })
        .collect();
    Ok(Inspection { archive, ops })
}

impl Inspection {
    /// The ops the importer does not map, with counts.
    pub fn unsupported(&self) -> Vec<(String, usize)> {
        self.ops
            .iter()
            .filter(|(_, _, ok)| !ok)
            .map(|(op, n, _)| (op.clone(), *n))
            .collect()
    }

    /// A human-readable report (several lines, ending in a newline).
    pub fn render(&self) -> String {
        let a = &self.archive;
        let p = &a.program;
        let mut s = String::new();
        let _ = writeln!(s, "archive: {}", a.path.display());
        let _ = writeln!(
            s,
            "format: pt2 archive_version {}, graph schema {}.{}, written by torch {}",
            a.archive_version,
            p.schema.major,
            p.schema.minor,
            p.torch_version.as_deref().unwrap_or("(unrecorded)")
        );
        let m = &a.metadata;
        let _ = writeln!(
            s,
            "model: {} (cutoff {} Å, species Z = {:?}, contract {})",
            m.model,
            m.cutoff,
            m.species,
            m.contract.as_deref().unwrap_or("(unrecorded)")
        );
        let _ = writeln!(
            s,
            "size symbols: atoms = {}, edges = {}",
            a.symbols.atoms, a.symbols.edges
        );
        for (name, r) in &p.symbols {
            let _ = writeln!(
                s,
                "  {name}: {} ≤ {name} ≤ {}",
                r.min.map_or("?".into(), |v| v.to_string()),
                r.max.map_or("?".into(), |v| v.to_string())
            );
        }
        let _ = writeln!(s, "inputs:");
        for i in p.inputs.iter().filter(|i| i.kind == InputKind::User) {
            let shape = p.tensors.get(&i.name).map_or(String::from("?"), |t| {
                let dims: Vec<String> = t.sizes.iter().map(ToString::to_string).collect();
                format!("[{}] {}", dims.join(", "), dtype_name(t.dtype))
            });
            let _ = writeln!(s, "  {}: {shape}", i.name);
        }
        let n_params: usize = a.weights.values().map(|w| w.values.len()).sum();
        let _ = writeln!(s, "weights: {} tensors, {n_params} values", a.weights.len());
        let total: usize = self.ops.iter().map(|(_, n, _)| n).sum();
        let _ = writeln!(s, "ops: {} nodes, {} distinct", total, self.ops.len());
        for (op, n, ok) in &self.ops {
            let _ = writeln!(
                s,
                "  {:>4}  {op}{}",
                n,
                if *ok { "" } else { "  UNSUPPORTED" }
            );
        }
        let bad = self.unsupported();
        if bad.is_empty() {
            let _ = writeln!(s, "coverage: every op is supported");
        } else {
            let _ = writeln!(
                s,
                "coverage: {} of {} ops unsupported ({} nodes)",
                bad.len(),
                self.ops.len(),
                bad.iter().map(|(_, n)| n).sum::<usize>()
            );
        }
        s
    }
}

/// The schema's dtype code as torch names it.
fn dtype_name(code: i64) -> String {
    use crate::ir::dtype;
    match code {
        dtype::FLOAT64 => "float64".into(),
        dtype::FLOAT32 => "float32".into(),
        dtype::INT64 => "int64".into(),
        dtype::INT32 => "int32".into(),
        dtype::BOOL => "bool".into(),
        other => format!("dtype code {other}"),
    }
}
