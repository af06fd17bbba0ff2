//! Evaluate a model on a structure file and write the results back.
//!
//! Writes a rattled copper crystal as extended XYZ, reads it back as a batch,
//! evaluates the built-in SchNet-style model in one process and on 4 ranks,
//! checks the split run gives the single-process answer, and writes the
//! energies, forces and stress into a new XYZ file.
//!
//! ```sh
//! cargo run --release -p ddmlip --example evaluate
//! ```

use ddmlip::{build, evaluate, load_model, read_structure, write_structure, EvalOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("ddmlip-example-evaluate-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let input = dir.join("cu.xyz");
    write_structure(&input, &[build::demo_copper(3)])?;

    let frames = read_structure(&input)?;
    let model = load_model("schnet-demo")?;
    let single = evaluate(model.as_ref(), &frames, &EvalOptions::default())?;
    let split = evaluate(
        model.as_ref(),
        &frames,
        &EvalOptions {
            ranks: 4,
            ..Default::default()
        },
    )?;
    let energy = |r: &ddmlip::EvalResult| r.energy().map(|e| e[0]).ok_or("the run has no energy");
    println!(
        "{} on {} atoms: E = {:.12} eV (1 process), {:.12} eV (4 ranks)",
        model.name(),
        frames[0].len(),
        energy(&single)?,
        energy(&split)?
    );
    let (f_single, f_split) = (
        single.forces().ok_or("no forces")?,
        split.forces().ok_or("no forces")?,
    );
    let worst = f_single
        .iter()
        .flatten()
        .zip(f_split.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    println!("largest force difference between the two runs: {worst:.2e} eV/Å");
    if worst > 1e-10 {
        return Err(
            format!("the split run differs from the single-process run by {worst:e} eV/Å").into(),
        );
    }

    let output = dir.join("cu-evaluated.xyz");
    write_structure(&output, &split.annotate(&frames))?;
    let back = read_structure(&output)?;
    let energy = back[0].energy().ok_or("the written file has no energy")?;
    println!("wrote {} (energy {energy:.6} eV)", output.display());
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn evaluate_example_runs() {
    main().unwrap();
}
