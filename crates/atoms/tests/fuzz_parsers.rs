//! Mutated valid inputs never panic the extended XYZ and POSCAR readers:
//! every result is `Ok` or a typed error, quickly. The edits splice in the tokens that broke
//! readers before (huge or tiny numbers, quotes, brackets, newlines).

use ddmlip_atoms::extxyz::read_str;
use ddmlip_atoms::{lammps, poscar};
use proptest::prelude::*;
use std::time::{Duration, Instant};

include!("fuzz_mutate.in");

const VALID: &str = "3\n\
Lattice=\"5.0 0.0 0.0 0.0 5.0 0.0 0.0 0.0 10.0\" Properties=species:S:1:pos:R:3:forces:R:3:tag:I:1 energy=-1.5 stress=\"1 0 0 0 1 0 0 0 1\" pbc=\"T T F\" name=abc\n\
Si 0.0 0.0 5.0 0.1 0.2 0.3 1\n\
O 1.0 1.0 5.5 -0.1 0.0 0.0 2\n\
H 2.0 0.5 6.0 0.0 0.0 0.1 3\n\
2\n\
Properties=species:S:1:pos:R:3 pbc=\"F F F\"\n\
Ar 0 0 0\n\
Ar 3.4 0 0\n";

const VALID_POSCAR: &str = "Na Cl Si\n 1.0\n 5.6 0.0 0.0\n 0.8 5.4 0.0\n -0.6 0.9 5.9\nNa Cl Si\n2 1 1\nSelective dynamics\nDirect\n0.1 0.2 0.3 T T F\n0.5 0.5 0.5 T T T\n0.2 0.7 0.1 F F F\n0.9 0.1 0.6 T T T\n";

const VALID_LAMMPS: &str = "written by hand\n\n3 atoms\n2 atom types\n\n0.0 5.6 xlo xhi\n0.0 5.4 ylo yhi\n0.0 5.9 zlo zhi\n0.8 -0.6 0.9 xy xz yz\n\nMasses\n\n1 22.98977\n2 35.453\n\nAtoms # charge\n\n1 1 0.5 0.1 0.2 0.3\n3 2 -0.5 2.8 0.1 0.2 0 0 1\n2 1 0.0 0.3 2.9 0.1\n\nVelocities\n\n1 0 0 0\n2 0 0 0\n3 0 0 0\n";

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn mutated_extended_xyz_is_ok_or_a_typed_error(e in edits()) {
        let bytes = mutate(VALID.as_bytes(), &e);
        let text = String::from_utf8_lossy(&bytes);
        let started = Instant::now();
        match read_str(&text) {
            Ok(frames) => {
                for f in &frames {
                    // Reading is not checking: the checks must not panic either.
                    let _ = f.validate();
                }
            }
            Err(err) => prop_assert!(!err.to_string().is_empty()),
        }
        prop_assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn mutated_lammps_data_is_ok_or_a_typed_error(e in edits()) {
        let bytes = mutate(VALID_LAMMPS.as_bytes(), &e);
        let text = String::from_utf8_lossy(&bytes);
        let started = Instant::now();
        match lammps::read_str(&text) {
            Ok(system) => {
                let _ = system.validate();
            }
            Err(err) => prop_assert!(!err.to_string().is_empty()),
        }
        prop_assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn mutated_poscars_are_ok_or_a_typed_error(e in edits()) {
        let bytes = mutate(VALID_POSCAR.as_bytes(), &e);
        let text = String::from_utf8_lossy(&bytes);
        let started = Instant::now();
        match poscar::read_str(&text) {
            Ok(system) => {
                let _ = system.validate();
            }
            Err(err) => prop_assert!(!err.to_string().is_empty()),
        }
        prop_assert!(started.elapsed() < Duration::from_secs(2));
    }
}

/// The unmutated inputs are valid, so the mutations start from real files.
#[test]
fn the_seed_inputs_parse() {
    assert_eq!(read_str(VALID).unwrap().len(), 2);
    let system = poscar::read_str(VALID_POSCAR).unwrap();
    assert_eq!(system.numbers, vec![11, 11, 17, 14]);
    let system = lammps::read_str(VALID_LAMMPS).unwrap();
    assert_eq!(system.numbers, vec![11, 11, 17]);
    assert_eq!(system.positions[2], [2.8, 0.1, 0.2]);
}
