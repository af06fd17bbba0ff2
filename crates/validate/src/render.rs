//! The one actionable `next_action` line and the human rendering of a report.

use crate::{is_local, Attempt, StopReason, TraceReport};
use std::fmt::Write as _;

fn degenerate_note(report: &TraceReport) -> Option<String> {
    let bad: Vec<&ddmlip_domain::PartitionHealth> = report
        .diagnostics
        .partition_health
        .iter()
        .filter(|h| !h.degenerate.is_empty())
        .collect();
    let first = bad.first()?;
    let findings: Vec<&str> = first
        .degenerate
        .iter()
        .take(3)
        .map(String::as_str)
        .collect();
    Some(format!(
        "the partition is degenerate ({} finding(s), e.g. {}). Along an axis split k ways every \
         domain has remote atoms once box > 2·ghost_width·k/(k−1) when periodic, \
         box > ghost_width·k/⌊k/2⌋ otherwise (ghost width {:.3} Å here). {}",
        first.degenerate.len(),
        findings.join("; "),
        first.ghost_width,
        first.advice()
    ))
}

fn preflight_note(report: &TraceReport) -> Option<String> {
    let p = &report.diagnostics.preflight;
    let delta = p.spec_delta.as_ref()?;
    Some(format!(
        "Pre-flight: opaque op(s) {} are not declared in the starting spec; paste into the spec: {}",
        p.undeclared_opaque_ops.join(", "),
        serde_json::to_string(delta).unwrap_or_default()
    ))
}

/// When every failing output of `a` is off by rounding only, the tolerance
/// is tighter than floating point allows: say so and suggest one.
fn rounding_note(report: &TraceReport, a: &Attempt) -> Option<String> {
    if a.failed_outputs.is_empty() || a.error.is_some() {
        return None;
    }
    if !crate::within_rounding(a, report.dtype) {
        return None;
    }
    let worst = crate::worst_failed_rel(a);
    // One decade above the worst difference, as a round number.
    let suggest = 10f64.powi((worst.max(f64::MIN_POSITIVE).log10().floor() as i32) + 1);
    let defaults = crate::ValidateOptions::for_dtype(report.dtype);
    Some(format!(
        "The differences (at most {worst:.1e} relative) are floating-point rounding: the ranks \
         add the same terms in another order. atol {:e} / rtol {:e} is tighter than {} \
         arithmetic allows; use --rtol {suggest:e} or more (the {} defaults are --atol {:e} \
         --rtol {:e}). Nothing in the spec is wrong.",
        report.atol, report.rtol, report.dtype, report.dtype, defaults.atol, defaults.rtol
    ))
}

/// Builds `next_action`: what to do now, most important first.
pub(crate) fn next_action(report: &TraceReport, winner: Option<usize>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let n = report.attempts.len();
    if let Some(w) = winner {
        let degenerate = degenerate_note(report);
        if let Some(d) = &degenerate {
            parts.push(format!(
                "WARNING: this pass is not evidence that the spec is right: {d} Then validate again."
            ));
        }
        let mut ok = format!(
            "OK — the {}-rank run matches the single-process run (attempt #{} of {n}).",
            report.ranks,
            w + 1
        );
        match &report.fix_applied {
            Some(fix) => {
                let _ = write!(
                    ok,
                    " The starting spec ({}) failed; fix applied: {fix}. Save the fixed spec \
                     (report.spec) and declare it in the model's declared_spec().",
                    report.prior_source,
                    fix = fix.trim_end_matches('.')
                );
            }
            None => ok.push_str(" The spec that passed is report.spec; save it to reuse it."),
        }
        parts.push(ok);
        if let Some(p) = preflight_note(report) {
            parts.push(p);
        }
        return parts.join("\n");
    }
    let last = report.attempts.last();
    let err = report.diagnostics.errors.last();
    match (last, err) {
        (None, Some(e)) => parts.push(format!(
            "FAIL — the single-process reference run failed, so nothing was split: {}",
            e.advice
        )),
        (Some(a), Some(e)) if a.error.is_some() => {
            parts.push(format!("FAIL — {}", e.advice));
        }
        (Some(a), _) => {
            let worst = a
                .failed_outputs
                .iter()
                .map(|o| {
                    format!(
                        "`{o}` abs {:.3e} rel {:.3e}",
                        a.max_abs_diff.get(o).copied().unwrap_or(f64::NAN),
                        a.max_rel_diff.get(o).copied().unwrap_or(f64::NAN)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let how = match report.stop_reason {
                StopReason::AutofixOff => "auto-fix is off".to_string(),
                StopReason::MaxAttempts => {
                    format!("the limit of {n} attempt(s) was reached with fixes left to try")
                }
                _ if n > 1 => format!("after {n} attempts auto-fix has no further rule"),
                _ => "auto-fix has no rule for this failure".to_string(),
            };
            parts.push(format!(
                "FAIL — the {}-rank run differs from the single-process run ({how}); failing: \
                 {worst}. Best spec so far in report.spec.",
                report.ranks
            ));
            if let Some(fix) = &report.untried_fix {
                let rerun = match report.stop_reason {
                    StopReason::MaxAttempts => "raise the attempt limit (--max-attempts)",
                    _ => "run again with auto-fix on (without --no-autofix)",
                };
                parts.push(format!(
                    "Next fix to try: {}. To try it, {rerun}.",
                    fix.trim_end_matches('.')
                ));
            }
            if let Some(note) = rounding_note(report, a) {
                parts.push(note);
                return parts.join("\n");
            }
        }
        (None, None) => parts.push("FAIL — nothing was run".to_string()),
    }
    if let Some(d) = degenerate_note(report) {
        parts.push(format!("Partition: {d}"));
    }
    if let Some(h) = &report.diagnostics.halo_completeness {
        parts.push(format!("Halo coverage: {}", h.interpretation));
    }
    if let Some(l) = &report.diagnostics.layer_divergence {
        if l.first_divergent {
            parts.push(format!(
                "First divergent op: `{}`{} (#{}), ranks' sum {:.6e} vs reference {:.6e} (rel {:.2e}; {} op(s) checked; {}). Look there for the missing distributed meaning.",
                l.op,
                if l.scope.is_empty() { String::new() } else { format!(" in `{}`", l.scope) },
                l.seq,
                l.ranks_sum,
                l.reference_sum,
                l.rel_diff,
                l.checked,
                l.note
            ));
        } else {
            parts.push(format!(
                "Op-by-op check: {} forward op(s) agree summed over ranks; {}.",
                l.checked, l.note
            ));
        }
    }
    if let Some(p) = preflight_note(report) {
        parts.push(p);
    }
    if let Some(a) = last {
        if is_local(&a.spec) && a.error.is_none() {
            parts.push(format!(
                "Spec uses scatter local with halo_depth {}: ghosts are never exchanged between layers.",
                a.spec.halo_depth
            ));
        }
    }
    parts.join("\n")
}

/// Multi-line human rendering.
pub(crate) fn render(r: &TraceReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "validate {} on {} rank(s): {} ({} attempt(s), {:.2} s; atol {:e}, rtol {:e})",
        r.model,
        r.ranks,
        if r.ok { "PASS" } else { "FAIL" },
        r.attempts.len(),
        r.seconds,
        r.atol,
        r.rtol
    );
    let _ = writeln!(s, "starting spec: {}", r.prior_source);
    if !r.inferred.is_empty() {
        let _ = writeln!(s, "\ninferred fields:");
        for i in &r.inferred {
            let _ = writeln!(s, "  {} = {}  ({})", i.field, i.value, i.evidence);
        }
    }
    let _ = writeln!(s, "\nattempts:");
    for (k, a) in r.attempts.iter().enumerate() {
        let _ = writeln!(
            s,
            "  #{} {} ({:.2} s) — {}",
            k + 1,
            if a.passed() { "pass" } else { "FAIL" },
            a.seconds,
            a.rationale
        );
        if let Some(e) = &a.error {
            let _ = writeln!(s, "      error: {e}");
        }
        for (name, abs) in &a.max_abs_diff {
            let rel = a.max_rel_diff.get(name).copied().unwrap_or(f64::NAN);
            let ratio = a.ratio.get(name).copied().unwrap_or(f64::NAN);
            let _ = writeln!(
                s,
                "      {:<16} abs {:>10.3e}  rel {:>10.3e}  scale {:>8.4}  {}",
                name,
                abs,
                rel,
                ratio,
                if a.failed_outputs.contains(name) {
                    "FAIL"
                } else {
                    "ok"
                }
            );
        }
        if let Some(l) = a
            .diagnostics
            .layer_divergence
            .as_ref()
            .filter(|l| l.first_divergent)
        {
            let _ = writeln!(
                s,
                "      first divergent op: #{} `{}`{} (rel {:.2e})",
                l.seq,
                l.op,
                if l.scope.is_empty() {
                    String::new()
                } else {
                    format!(" in `{}`", l.scope)
                },
                l.rel_diff
            );
        }
        if !a.handler_counts.is_empty() {
            let h: Vec<String> = a
                .handler_counts
                .iter()
                .map(|(k, v)| format!("{k}×{v}"))
                .collect();
            let _ = writeln!(s, "      handlers: {}", h.join(", "));
        }
    }
    let _ = writeln!(s, "\ndiagnostics:");
    if let Some(f) = &r.diagnostics.receptive_field {
        let _ = writeln!(
            s,
            "  receptive field: {} message-passing hop(s){}, {} Edge → Atom scatter(s)",
            f.hops,
            if f.scope.is_empty() {
                String::new()
            } else {
                format!(" (deepest in `{}`)", f.scope)
            },
            f.edge_scatters
        );
    }
    for (k, h) in r.diagnostics.partition_health.iter().enumerate() {
        let _ = writeln!(
            s,
            "  partition (system {k}): grid {:?}, ghost width {:.3} Å, {}",
            h.grid,
            h.ghost_width,
            if h.degenerate.is_empty() {
                "healthy".to_string()
            } else {
                format!("DEGENERATE ({} finding(s))", h.degenerate.len())
            }
        );
    }
    if let Some(h) = &r.diagnostics.halo_completeness {
        let _ = writeln!(s, "  halo: {}", h.interpretation);
        for m in &h.examples {
            let _ = writeln!(
                s,
                "    atom {} (system {}, rank {}): {} neighbours expected, {} seen",
                m.atom,
                m.system,
                m.rank,
                m.expected,
                m.seen.map(|v| v.to_string()).unwrap_or_else(|| "?".into())
            );
        }
    }
    if let Some(l) = &r.diagnostics.layer_divergence {
        if l.first_divergent {
            let _ = writeln!(
                s,
                "  first divergent op: #{} `{}` @{} ranks {:.6e} vs reference {:.6e} ({})",
                l.seq, l.op, l.scope, l.ranks_sum, l.reference_sum, l.note
            );
        } else {
            let _ = writeln!(s, "  op-by-op: {} ops agree; {}", l.checked, l.note);
        }
    }
    for e in &r.diagnostics.errors {
        let _ = writeln!(s, "  error ({}, {}): {}", e.stage, e.kind, e.advice);
    }
    if let Some(p) = preflight_note(r) {
        let _ = writeln!(s, "  {p}");
    }
    let _ = writeln!(s, "\nspec:\n{}", r.spec.to_json());
    let _ = writeln!(s, "\nnext action:\n{}", r.next_action);
    s
}
