//! Imported NequIP, Allegro and MACE on structures with no edges (atoms
//! farther apart than the cutoff): the graphs' per-edge tensors have zero
//! rows, which every row-local kernel must keep at zero rows. With no
//! neighbours an atom's energy depends on its species alone, so the
//! structure's energy is the sum of its parts' evaluated apart, atoms of one
//! species have one energy, and no force acts. (Parts of two atoms: a
//! one-atom system is not supported.)

mod common;

use common::data;
use ddmlip_atoms::{Cell, System};
use ddmlip_pt2::ImportedModel;
use ddmlip_runtime::{evaluate, EvalOptions};

/// Atoms of `numbers` on a line 6 Å apart (cutoff 4 Å) in a large open box.
fn apart(numbers: &[u32]) -> System {
    let positions = (0..numbers.len())
        .map(|k| [6.0 * k as f64 + 1.0, 2.0, 3.0])
        .collect();
    let cell = Cell::new([[40.0, 0.0, 0.0], [0.0, 40.0, 0.0], [0.0, 0.0, 40.0]]);
    System::new(positions, numbers.to_vec(), Some(cell), [false; 3])
}

#[test]
fn isolated_atoms_sum_their_energies_and_feel_no_force() {
    for name in ["nequip", "allegro", "mace"] {
        let model = ImportedModel::load(data(&format!("{name}.pt2"))).unwrap();
        let opts = EvalOptions::default();
        let numbers = [1, 6, 8, 6];
        let all = evaluate(&model, &[apart(&numbers)], &opts).unwrap();
        let energy = all.outputs["energy"].values[0];
        let mut sum = 0.0;
        for part in numbers.chunks(2) {
            sum += evaluate(&model, &[apart(part)], &opts).unwrap().outputs["energy"].values[0];
        }
        let per_atom = &all.outputs["atomic_energies"].values;
        assert_eq!(per_atom[1], per_atom[3], "{name}: two carbons");
        assert_ne!(per_atom[0], per_atom[1], "{name}: H and C");
        assert!(energy.is_finite(), "{name}: {energy}");
        assert!(
            (energy - sum).abs() <= 1e-12 * sum.abs().max(1.0),
            "{name}: {energy} vs the atoms alone {sum}"
        );
        let forces = &all.outputs["forces"].values;
        assert_eq!(forces.len(), 3 * numbers.len(), "{name}");
        assert!(forces.iter().all(|&f| f == 0.0), "{name}: {forces:?}");
    }
}
