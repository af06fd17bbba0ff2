//! The step progress bar of `md` and `relax`: drawn on stderr only when
//! stderr is a terminal, so piped runs (and stdout, `--json`) never see it.

use ddmlip_md::{StepObserver, StepProgress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// A bar over `total` steps and the observer that moves it; `None` when
/// stderr is not a terminal.
pub(crate) fn step_bar(total: u64, label: &'static str) -> Option<(ProgressBar, StepObserver)> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} {bar:30} step {pos}/{len} | {msg} | {elapsed_precise}, ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(label);
    let moved = bar.clone();
    let observer = StepObserver::new(move |p: &StepProgress| {
        moved.set_position(p.done);
        moved.set_message(message(p));
    });
    Some((bar, observer))
}

/// The bar's message: temperature and ns/day for MD, the largest force
/// for a relaxation.
fn message(p: &StepProgress) -> String {
    match (p.ns_per_day, p.temperature, p.fmax) {
        (Some(rate), Some(t), _) => format!("T {t:.1} K | {rate:.3} ns/day"),
        (Some(rate), None, _) => format!("{rate:.3} ns/day"),
        (None, _, Some(f)) => format!("max |F| {f:.3e} eV/Å"),
        (None, _, None) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_shows_the_rate_or_the_force() {
        let mut p = StepProgress {
            done: 3,
            total: 10,
            ns_per_day: Some(12.3456),
            temperature: Some(301.26),
            fmax: None,
        };
        assert_eq!(message(&p), "T 301.3 K | 12.346 ns/day");
        p.ns_per_day = None;
        p.fmax = Some(0.0123);
        assert_eq!(message(&p), "max |F| 1.230e-2 eV/Å");
    }
}
