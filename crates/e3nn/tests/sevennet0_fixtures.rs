//! SevenNet-0 against the reference outputs of the real sevenn code
//! (shared fixtures) and against the published numbers of the architecture
//! guide (§5.3/§5.4).

use ddmlip_e3nn::sevennet::{
    evaluate, forces_from_edge_gradients, stress_from_virial, types_from_numbers,
    virial_from_edge_gradients, SevenNet, SevenNetWeights,
};
use ddmlip_e3nn::Real;
use serde_json::Value;
use std::sync::OnceLock;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/fixtures/sevennet0/sevennet0_public.json"
);

/// The checkpoint (fetched once by CI setup; a missing one fails the test:
/// it is the only source of the weights).
fn checkpoint_path() -> std::path::PathBuf {
    ddmlip_testkit::sevennet_checkpoint()
}

fn weights() -> &'static SevenNetWeights {
    static W: OnceLock<SevenNetWeights> = OnceLock::new();
    W.get_or_init(|| {
        SevenNetWeights::from_checkpoint(checkpoint_path()).expect("SevenNet-0 weights")
    })
}

struct Structure {
    name: String,
    numbers: Vec<u32>,
    positions: Vec<[f64; 3]>,
    cell: [[f64; 3]; 3],
    pbc: [bool; 3],
}

struct Graph {
    centers: Vec<u32>,
    neighbors: Vec<u32>,
    vectors: Vec<[f64; 3]>,
}

fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}
fn dot(a: [f64; 3], b: [f64; 3]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}
fn volume(cell: &[[f64; 3]; 3]) -> f64 {
    dot(cell[0], cross(cell[1], cell[2])).abs()
}

/// Full neighbour list by brute force over atom pairs and cell images:
/// every (i, j, S) with 0 < |r_j + S·cell − r_i| < rc, periodic self-images included.
fn brute_force_graph(s: &Structure, rc: f64) -> Graph {
    let v = volume(&s.cell);
    let mut reps = [0i64; 3];
    for (k, rep) in reps.iter_mut().enumerate() {
        if s.pbc[k] {
            let (a, b) = (s.cell[(k + 1) % 3], s.cell[(k + 2) % 3]);
            let n = cross(a, b);
            let spacing = v / dot(n, n).sqrt();
            // +1 image covers atoms that sit slightly outside the cell.
            *rep = (rc / spacing).ceil() as i64 + 1;
        }
    }
    let mut g = Graph {
        centers: vec![],
        neighbors: vec![],
        vectors: vec![],
    };
    let n = s.positions.len();
    for i in 0..n {
        for j in 0..n {
            for a in -reps[0]..=reps[0] {
                for b in -reps[1]..=reps[1] {
                    for c in -reps[2]..=reps[2] {
                        let sh = [0, 1, 2].map(|k| {
                            a as f64 * s.cell[0][k]
                                + b as f64 * s.cell[1][k]
                                + c as f64 * s.cell[2][k]
                        });
                        let r = [0, 1, 2].map(|k| s.positions[j][k] + sh[k] - s.positions[i][k]);
                        let d = dot(r, r).sqrt();
                        if d > 0.0 && d < rc {
                            g.centers.push(i as u32);
                            g.neighbors.push(j as u32);
                            g.vectors.push(r);
                        }
                    }
                }
            }
        }
    }
    g
}

struct Result3 {
    energies: Vec<f64>,
    forces: Vec<[f64; 3]>,
    stress: [f64; 6],
}

fn run<T: Real>(model: &SevenNet<T>, s: &Structure, g: &Graph) -> Result3 {
    let types = types_from_numbers(&s.numbers).unwrap();
    let vecs: Vec<[T; 3]> = g.vectors.iter().map(|v| v.map(T::from_f64)).collect();
    let ev = evaluate(model, &types, &g.centers, &g.neighbors, &vecs).unwrap();
    let forces = forces_from_edge_gradients(
        s.numbers.len(),
        &g.centers,
        &g.neighbors,
        &ev.edge_gradients,
    )
    .unwrap();
    let w = virial_from_edge_gradients(&vecs, &ev.edge_gradients).unwrap();
    Result3 {
        energies: ev
            .atomic_energies
            .iter()
            .map(|e| e.to_f64_lossless())
            .collect(),
        forces,
        stress: stress_from_virial(&w, volume(&s.cell)),
    }
}

fn arr3(v: &Value) -> Vec<[f64; 3]> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| [0, 1, 2].map(|k| r[k].as_f64().unwrap()))
        .collect()
}
fn arr(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[derive(Default, Debug)]
struct MaxDev {
    energy_per_atom: f64,
    atomic_energy: f64,
    force: f64,
    stress: f64,
}

fn compare(r: &Result3, reference: &Value, dev: &mut MaxDev) {
    let n = r.energies.len() as f64;
    let e: f64 = r.energies.iter().sum();
    dev.energy_per_atom = dev
        .energy_per_atom
        .max((e - reference["energy"].as_f64().unwrap()).abs() / n);
    for (a, b) in r.energies.iter().zip(arr(&reference["energies"])) {
        dev.atomic_energy = dev.atomic_energy.max((a - b).abs());
    }
    for (a, b) in r.forces.iter().zip(arr3(&reference["forces"])) {
        for k in 0..3 {
            dev.force = dev.force.max((a[k] - b[k]).abs());
        }
    }
    for (a, b) in r.stress.iter().zip(arr(&reference["stress"])) {
        dev.stress = dev.stress.max((a - b).abs());
    }
}

#[test]
fn public_fixtures_f64_and_f32() {
    let text = std::fs::read_to_string(FIXTURE).expect("fixture JSON");
    let json: Value = serde_json::from_str(&text).unwrap();
    let m64 = SevenNet::<f64>::new(weights()).unwrap();
    let m32 = SevenNet::<f32>::new(weights()).unwrap();
    let mut worst64 = MaxDev::default();
    let mut worst32 = MaxDev::default();
    for st in json["structures"].as_array().unwrap() {
        let cell = arr3(&st["cell"]);
        let pbc = st["pbc"].as_array().unwrap();
        let s = Structure {
            name: st["name"].as_str().unwrap().to_string(),
            numbers: st["numbers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|z| z.as_u64().unwrap() as u32)
                .collect(),
            positions: arr3(&st["positions"]),
            cell: [cell[0], cell[1], cell[2]],
            pbc: [0, 1, 2].map(|k| pbc[k].as_bool().unwrap()),
        };
        let g = brute_force_graph(&s, 5.0);
        assert_eq!(
            g.centers.len() as u64,
            st["float64"]["n_edges"].as_u64().unwrap(),
            "{}: edge count",
            s.name
        );
        let mut d64 = MaxDev::default();
        compare(&run(&m64, &s, &g), &st["float64"], &mut d64);
        let mut d32 = MaxDev::default();
        compare(&run(&m32, &s, &g), &st["float32"], &mut d32);
        println!("{:<26} f64 {:?}\n{:<26} f32 {:?}", s.name, d64, "", d32);
        assert!(
            d64.energy_per_atom < 1e-8 && d64.atomic_energy < 1e-8,
            "{}: f64 energy {:?}",
            s.name,
            d64
        );
        assert!(d64.force < 1e-7, "{}: f64 forces {:?}", s.name, d64);
        assert!(d64.stress < 1e-8, "{}: f64 stress {:?}", s.name, d64);
        // f32 against sevenn's own f32 run: both are ~1e-6 (energy) and
        // ~1e-5 (forces) away from the f64 truth.
        assert!(
            d32.energy_per_atom < 2e-6 && d32.atomic_energy < 1e-5,
            "{}: f32 energy {:?}",
            s.name,
            d32
        );
        assert!(d32.force < 5e-5, "{}: f32 forces {:?}", s.name, d32);
        assert!(d32.stress < 2e-7, "{}: f32 stress {:?}", s.name, d32);
        for (w, d) in [(&mut worst64, &d64), (&mut worst32, &d32)] {
            w.energy_per_atom = w.energy_per_atom.max(d.energy_per_atom);
            w.atomic_energy = w.atomic_energy.max(d.atomic_energy);
            w.force = w.force.max(d.force);
            w.stress = w.stress.max(d.stress);
        }
    }
    println!("max over structures: f64 {worst64:?}\nmax over structures: f32 {worst32:?}");
}

fn sums(v: &[f64]) -> (f64, f64) {
    (v.iter().sum(), v.iter().map(|x| x * x).sum())
}

fn check_sum(what: &str, v: &[f64], want: (f64, f64)) {
    let got = sums(v);
    // The guide prints 11 significant digits.
    for (g, w) in [(got.0, want.0), (got.1, want.1)] {
        assert!(
            (g - w).abs() <= 2e-9 * w.abs().max(1.0),
            "{what}: {got:?} vs {want:?}"
        );
    }
}

fn tric8() -> Structure {
    Structure {
        name: "tric8".into(),
        numbers: vec![3, 3, 40, 15, 16, 16, 8, 8],
        positions: vec![
            [0.125, 0.175, 0.061],
            [3.072, 2.702, 0.122],
            [2.248, 0.483, 3.233],
            [0.342, 3.241, 2.867],
            [1.451, 1.68, 1.464],
            [4.385, 4.494, 1.586],
            [3.715, 1.806, 4.514],
            [1.47, 4.795, 4.697],
        ],
        cell: [[5.2, 0.0, 0.0], [0.9, 5.6, 0.0], [-0.6, 0.7, 6.1]],
        pbc: [true; 3],
    }
}

/// Layer-by-layer checksums of the guide (§5.4, sevenn float64 on tric8),
/// through the public per-layer API.
#[test]
fn tric8_layer_checksums() {
    let model = SevenNet::<f64>::new(weights()).unwrap();
    let s = tric8();
    let g = brute_force_graph(&s, 5.0);
    assert_eq!(g.centers.len(), 200);
    let types = types_from_numbers(&s.numbers).unwrap();
    let graph = ddmlip_e3nn::ConvGraph::new(8, &g.centers, &g.neighbors).unwrap();
    let f = model.edge_features(&g.vectors).unwrap();
    check_sum(
        "edge_embedding",
        &f.emb,
        (7.2161186862e+00, 9.9944971853e+00),
    );
    check_sum("edge_attr", &f.sh, (2.1702731665e+02, 1.8000000000e+03));
    let mut x = model.initial_features(&types).unwrap();
    check_sum("x0", &x, (2.2181925545e+00, 2.6120223094e+01));
    let want: [[(f64, f64); 3]; 5] = [
        [
            (1.9143866853e+01, 2.9782304311e+02),
            (-4.6567460630e+01, 5.5789243101e+02),
            (-2.9852017323e+01, 1.3222272801e+02),
        ],
        [
            (2.7992746465e+01, 9.5105022009e+02),
            (-3.3179694979e+02, 1.9979862818e+03),
            (-6.4197218601e+01, 5.0269801740e+02),
        ],
        [
            (-2.2705524069e+01, 2.8656979139e+03),
            (-6.3277238034e+02, 3.6954122158e+03),
            (6.3838433914e+01, 2.1244678382e+03),
        ],
        [
            (2.2216424484e+02, 1.0519714763e+04),
            (-7.3032804781e+02, 1.2565769732e+04),
            (1.4022546863e+02, 3.7895966276e+04),
        ],
        [
            (2.4373731423e+02, 1.3322833727e+05),
            (-7.5693698633e+02, 3.9000642491e+03),
            (2.1483675325e+02, 3.7098332422e+03),
        ],
    ];
    let sc_want = [
        (1.3718271912e+01, 5.4714977056e+02),
        (-6.5074909993e+00, 1.6457753842e+03),
        (-4.2346695198e+02, 3.2278271306e+03),
        (-5.4681975409e+02, 1.1050151339e+04),
        (-7.4091025325e+02, 3.5925540172e+03),
    ];
    let a_want = [
        (-2.2417986736e+00, 1.1004152073e+01),
        (4.9722512722e+00, 6.6590971584e+01),
        (4.9612168429e+00, 1.9672597946e+02),
        (8.2899378929e+00, 8.6439282940e+02),
        (-1.0275182423e+01, 1.2174272769e+02),
    ];
    for (t, block) in model.blocks.iter().enumerate() {
        // Self-connection and the aggregated messages through the kernels.
        let mut sc = vec![0.0; 8 * block.gate.dim_in()];
        block.self_connection.forward(&x, &types, &mut sc).unwrap();
        check_sum(&format!("sc t={t}"), &sc, sc_want[t]);
        let (out, cache) = block.forward(&graph, &x, &types, &f.emb, &f.sh).unwrap();
        let mut w = vec![0.0; 200 * block.radial.dim_out()];
        block.radial.forward(&f.emb, 200, &mut w).unwrap();
        let mut a = vec![0.0; 8 * block.conv.dim_msg()];
        ddmlip_e3nn::conv_forward(
            &block.conv,
            &graph,
            &cache.h,
            &f.sh,
            &w,
            block.denominator,
            &mut a,
        )
        .unwrap();
        check_sum(&format!("A t={t}"), &a, a_want[t]);
        check_sum(&format!("h t={t}"), &cache.h, want[t][0]);
        check_sum(&format!("y t={t}"), &cache.y, want[t][1]);
        check_sum(&format!("x out t={t}"), &out, want[t][2]);
        x = out;
    }
    let e = model.readout(&x, &types).unwrap();
    check_sum("E_i", &e, (-4.2036163542e+01, 2.5281476672e+02));
}

/// Structure, edge count, E_i, F_i and (periodic only) stress.
type Case = (Structure, usize, Vec<f64>, Vec<[f64; 3]>, Option<[f64; 6]>);

/// Published per-atom energies and forces of the guide's §5.3 structures
/// (sevenn float64), including the non-periodic molecule and a slab.
#[test]
fn guide_reference_structures() {
    let model = SevenNet::<f64>::new(weights()).unwrap();
    let si = Structure {
        name: "si_prim".into(),
        numbers: vec![14, 14],
        positions: vec![[0.0, 0.0, 0.0], [1.40, 1.33, 1.37]],
        cell: [
            [0.0, 2.715, 2.715],
            [2.715, 0.0, 2.715],
            [2.715, 2.715, 0.0],
        ],
        pbc: [true; 3],
    };
    let methanol = Structure {
        name: "methanol".into(),
        numbers: vec![6, 8, 1, 1, 1, 1],
        positions: vec![
            [0.0, 0.0, 0.0],
            [1.42, 0.0, 0.0],
            [-0.36, 1.03, 0.0],
            [-0.36, -0.51, 0.89],
            [-0.36, -0.51, -0.89],
            [1.75, 0.0, 0.9],
        ],
        cell: [[0.0; 3]; 3],
        pbc: [false; 3],
    };
    let mgo = Structure {
        name: "mgo_slab".into(),
        numbers: vec![12, 12, 8, 8],
        positions: vec![
            [0.0, 0.0, 0.0],
            [2.1, 2.1, 0.0],
            [2.1, 0.0, 0.1],
            [0.0, 2.1, -0.1],
        ],
        cell: [[4.2, 0.0, 0.0], [0.0, 4.2, 0.0], [0.0, 0.0, 20.0]],
        pbc: [true, true, false],
    };
    let cases: Vec<Case> = vec![
        (
            si,
            56,
            vec![-5.3943880563, -5.3943880562],
            vec![
                [0.4005096971, -0.2674458057, 0.1441588437],
                [-0.4005096971, 0.2674458057, -0.1441588437],
            ],
            Some([
                -1.1508171104e-2,
                -1.1951457131e-2,
                -1.2258636352e-2,
                8.3151915154e-3,
                -5.4361204367e-3,
                2.6338575213e-3,
            ]),
        ),
        (
            tric8(),
            200,
            vec![
                -3.7139564449,
                -3.6893573125,
                -10.2972498126,
                -4.8159921507,
                -4.3087632127,
                -4.5562615929,
                -5.5483944476,
                -5.1061885680,
            ],
            vec![
                [-0.2784960535, -0.3293338281, -1.5538499769],
                [0.1331149536, 0.4767840912, -1.5557166947],
                [1.6381735239, -0.5105700082, 5.7328609828],
                [-0.1896592336, 0.8160093413, 1.5252454419],
                [-0.9980766412, 0.9654260697, -1.4105023757],
                [0.3489441270, -0.3846254631, 0.5541866232],
                [-2.7774374437, -2.4076707479, -1.6394198411],
                [2.1234367675, 1.3739805451, -1.6528041594],
            ],
            Some([
                6.1903214395e-2,
                5.3776507586e-2,
                5.3087504286e-2,
                1.7062827611e-2,
                1.9254342910e-3,
                3.1277654700e-2,
            ]),
        ),
        (
            methanol,
            30,
            vec![
                -8.2814322331,
                -7.3169549129,
                -3.6041039894,
                -3.6200716555,
                -3.6408375376,
                -3.4588934992,
            ],
            vec![
                [0.2165167331, 0.1178976633, 0.3742624614],
                [0.3429915962, -0.0999872855, -0.8934278552],
                [-0.2308798478, 0.3236973176, 0.0014293414],
                [-0.3544335327, -0.1977537526, 0.2527271333],
                [0.0340228188, -0.1728290284, -0.2574768403],
                [-0.0082177676, 0.0289750855, 0.5224857594],
            ],
            None,
        ),
        (
            mgo,
            80,
            vec![-3.8840026197, -3.8840026197, -7.1093397754, -7.1093397754],
            vec![
                [0.0, 0.0, 0.0],
                [0.0, 0.0, 0.0],
                [0.0, 0.0, -0.1092488430],
                [0.0, 0.0, 0.1092488430],
            ],
            Some([
                1.8426779094e-2,
                1.8426779094e-2,
                6.1932452849e-5,
                0.0,
                0.0,
                0.0,
            ]),
        ),
    ];
    for (s, n_edges, energies, forces, stress) in cases {
        let g = brute_force_graph(&s, 5.0);
        assert_eq!(g.centers.len(), n_edges, "{}", s.name);
        let r = run(&model, &s, &g);
        for (a, b) in r.energies.iter().zip(&energies) {
            assert!((a - b).abs() < 1e-9, "{}: E_i {a} vs {b}", s.name);
        }
        for (a, b) in r.forces.iter().zip(&forces) {
            for k in 0..3 {
                assert!((a[k] - b[k]).abs() < 1e-9, "{}: F {a:?} vs {b:?}", s.name);
            }
        }
        if let Some(st) = stress {
            // The guide's runs divided by a volume computed from the float32
            // cell (relative 3e-8 off); the JSON fixtures above use f64.
            for (a, b) in r.stress.iter().zip(st) {
                assert!(
                    (a - b).abs() < 1e-12 + 1e-7 * b.abs(),
                    "{}: stress {:?} vs {st:?}",
                    s.name,
                    r.stress
                );
            }
        }
    }
}

/// An element outside the 89 species is a clear error naming it.
#[test]
fn unknown_element_is_reported() {
    let err = types_from_numbers(&[14, 118]).unwrap_err().to_string();
    assert!(err.contains("118"), "{err}");
}

/// A zero or NaN message denominator is a broken checkpoint: the loader
/// refuses it, naming the tensor, instead of failing at the first evaluation.
#[test]
fn zero_or_nan_denominator_is_refused_at_load() {
    let ckpt = ddmlip_checkpoint::load(checkpoint_path()).unwrap();
    let entries: Vec<(String, Vec<usize>, Vec<f32>)> = ckpt
        .state_dict()
        .unwrap()
        .into_iter()
        .map(|(name, t)| (name, t.shape, t.data))
        .collect();
    assert!(SevenNetWeights::from_state_dict(&entries).is_ok());
    for bad in [0.0f32, f32::NAN, f32::INFINITY] {
        let mut broken = entries.clone();
        let slot = broken
            .iter_mut()
            .find(|(name, _, _)| name == "2_convolution.denominator")
            .expect("SevenNet-0 stores each layer's denominator");
        slot.2[0] = bad;
        let e = SevenNetWeights::from_state_dict(&broken).unwrap_err();
        assert!(
            e.to_string().contains("2_convolution.denominator"),
            "{bad}: {e}"
        );
    }
}
