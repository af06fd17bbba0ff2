//! Tests against the real SevenNet-0 checkpoint (sevenn 0.13.0 wheel).
//!
//! Every expected value comes from an independent reference: the SevenNet-0
//! architecture guide (checkpoint dump made with a stub Python unpickler,
//! section 1 and appendix A), or Clebsch–Gordan coefficients recomputed
//! here from the Racah formula (guide section 4.4).
//!
//! The checkpoint must be there (CI setup fetches it once); tests do not download.

use std::path::PathBuf;
use std::sync::OnceLock;

use ddmlip_checkpoint::{load, Checkpoint, CheckpointError, PyValue, StorageDtype, Tensor};

/// (key, shape, storage key, explicit stride or None for contiguous), copied from the
/// SevenNet-0 architecture guide, section 1.5 (state dict table).
type TableRow = (
    &'static str,
    &'static [usize],
    &'static str,
    Option<&'static [u64]>,
);

const STATE_DICT_TABLE: &[TableRow] = &[
    ("edge_embedding.basis_function.coeffs", &[8], "0", None),
    ("onehot_to_feature_x.linear.weight", &[11392], "1", None),
    ("onehot_to_feature_x.linear.bias", &[0], "2", None),
    ("onehot_to_feature_x.linear.output_mask", &[128], "3", None),
    ("0_self_connection_intro.linear.weight", &[28672], "4", None),
    ("0_self_connection_intro.linear.bias", &[0], "5", None),
    (
        "0_self_connection_intro.linear.output_mask",
        &[576],
        "6",
        None,
    ),
    ("0_self_interaction_1.linear.weight", &[16384], "7", None),
    ("0_self_interaction_1.linear.bias", &[0], "8", None),
    ("0_self_interaction_1.linear.output_mask", &[128], "9", None),
    ("0_convolution.denominator", &[1], "10", None),
    ("0_convolution.convolution.weight", &[0], "11", None),
    ("0_convolution.convolution.output_mask", &[1152], "12", None),
    (
        "0_convolution.weight_nn.layer0.weight",
        &[8, 64],
        "13",
        None,
    ),
    (
        "0_convolution.weight_nn.layer1.weight",
        &[64, 64],
        "14",
        None,
    ),
    (
        "0_convolution.weight_nn.layer2.weight",
        &[64, 384],
        "15",
        None,
    ),
    ("0_self_interaction_2.linear.weight", &[40960], "16", None),
    ("0_self_interaction_2.linear.bias", &[0], "17", None),
    (
        "0_self_interaction_2.linear.output_mask",
        &[576],
        "18",
        None,
    ),
    ("0_equivariant_gate.gate.mul.weight", &[0], "19", None),
    (
        "0_equivariant_gate.gate.mul.output_mask",
        &[352],
        "20",
        None,
    ),
    (
        "1_self_connection_intro.linear.weight",
        &[33792],
        "21",
        None,
    ),
    ("1_self_connection_intro.linear.bias", &[0], "22", None),
    (
        "1_self_connection_intro.linear.output_mask",
        &[576],
        "23",
        None,
    ),
    ("1_self_interaction_1.linear.weight", &[21504], "24", None),
    ("1_self_interaction_1.linear.bias", &[0], "25", None),
    (
        "1_self_interaction_1.linear.output_mask",
        &[480],
        "26",
        None,
    ),
    ("1_convolution.denominator", &[1], "27", None),
    ("1_convolution.convolution.weight", &[0], "28", None),
    ("1_convolution.convolution.output_mask", &[3136], "29", None),
    (
        "1_convolution.convolution._compiled_main_left_right._w3j_1_1_1",
        &[3, 3, 3],
        "30",
        Some(&[3, 1, 9]),
    ),
    (
        "1_convolution.convolution._compiled_main_left_right._w3j_1_1_2",
        &[3, 3, 5],
        "31",
        Some(&[5, 15, 1]),
    ),
    (
        "1_convolution.convolution._compiled_main_left_right._w3j_1_2_1",
        &[3, 5, 3],
        "32",
        Some(&[5, 1, 15]),
    ),
    (
        "1_convolution.convolution._compiled_main_left_right._w3j_1_2_2",
        &[3, 5, 5],
        "33",
        Some(&[25, 1, 5]),
    ),
    (
        "1_convolution.convolution._compiled_main_left_right._w3j_2_1_1",
        &[5, 3, 3],
        "34",
        Some(&[1, 15, 5]),
    ),
    (
        "1_convolution.convolution._compiled_main_left_right._w3j_2_1_2",
        &[5, 3, 5],
        "35",
        Some(&[1, 25, 5]),
    ),
    (
        "1_convolution.convolution._compiled_main_left_right._w3j_2_2_1",
        &[5, 5, 3],
        "36",
        Some(&[5, 1, 25]),
    ),
    (
        "1_convolution.convolution._compiled_main_left_right._w3j_2_2_2",
        &[5, 5, 5],
        "37",
        Some(&[5, 1, 25]),
    ),
    (
        "1_convolution.weight_nn.layer0.weight",
        &[8, 64],
        "38",
        None,
    ),
    (
        "1_convolution.weight_nn.layer1.weight",
        &[64, 64],
        "39",
        None,
    ),
    (
        "1_convolution.weight_nn.layer2.weight",
        &[64, 960],
        "40",
        None,
    ),
    ("1_self_interaction_2.linear.weight", &[86016], "41", None),
    ("1_self_interaction_2.linear.bias", &[0], "42", None),
    (
        "1_self_interaction_2.linear.output_mask",
        &[576],
        "43",
        None,
    ),
    ("1_equivariant_gate.gate.mul.weight", &[0], "44", None),
    (
        "1_equivariant_gate.gate.mul.output_mask",
        &[352],
        "45",
        None,
    ),
    (
        "2_self_connection_intro.linear.weight",
        &[33792],
        "46",
        None,
    ),
    ("2_self_connection_intro.linear.bias", &[0], "47", None),
    (
        "2_self_connection_intro.linear.output_mask",
        &[576],
        "48",
        None,
    ),
    ("2_self_interaction_1.linear.weight", &[21504], "49", None),
    ("2_self_interaction_1.linear.bias", &[0], "50", None),
    (
        "2_self_interaction_1.linear.output_mask",
        &[480],
        "51",
        None,
    ),
    ("2_convolution.denominator", &[1], "52", None),
    ("2_convolution.convolution.weight", &[0], "53", None),
    ("2_convolution.convolution.output_mask", &[3136], "54", None),
    (
        "2_convolution.convolution._compiled_main_left_right._w3j_1_1_1",
        &[3, 3, 3],
        "55",
        Some(&[3, 1, 9]),
    ),
    (
        "2_convolution.convolution._compiled_main_left_right._w3j_1_1_2",
        &[3, 3, 5],
        "56",
        Some(&[5, 15, 1]),
    ),
    (
        "2_convolution.convolution._compiled_main_left_right._w3j_1_2_1",
        &[3, 5, 3],
        "57",
        Some(&[5, 1, 15]),
    ),
    (
        "2_convolution.convolution._compiled_main_left_right._w3j_1_2_2",
        &[3, 5, 5],
        "58",
        Some(&[25, 1, 5]),
    ),
    (
        "2_convolution.convolution._compiled_main_left_right._w3j_2_1_1",
        &[5, 3, 3],
        "59",
        Some(&[1, 15, 5]),
    ),
    (
        "2_convolution.convolution._compiled_main_left_right._w3j_2_1_2",
        &[5, 3, 5],
        "60",
        Some(&[1, 25, 5]),
    ),
    (
        "2_convolution.convolution._compiled_main_left_right._w3j_2_2_1",
        &[5, 5, 3],
        "61",
        Some(&[5, 1, 25]),
    ),
    (
        "2_convolution.convolution._compiled_main_left_right._w3j_2_2_2",
        &[5, 5, 5],
        "62",
        Some(&[5, 1, 25]),
    ),
    (
        "2_convolution.weight_nn.layer0.weight",
        &[8, 64],
        "63",
        None,
    ),
    (
        "2_convolution.weight_nn.layer1.weight",
        &[64, 64],
        "64",
        None,
    ),
    (
        "2_convolution.weight_nn.layer2.weight",
        &[64, 960],
        "65",
        None,
    ),
    ("2_self_interaction_2.linear.weight", &[86016], "66", None),
    ("2_self_interaction_2.linear.bias", &[0], "67", None),
    (
        "2_self_interaction_2.linear.output_mask",
        &[576],
        "68",
        None,
    ),
    ("2_equivariant_gate.gate.mul.weight", &[0], "69", None),
    (
        "2_equivariant_gate.gate.mul.output_mask",
        &[352],
        "70",
        None,
    ),
    (
        "3_self_connection_intro.linear.weight",
        &[33792],
        "71",
        None,
    ),
    ("3_self_connection_intro.linear.bias", &[0], "72", None),
    (
        "3_self_connection_intro.linear.output_mask",
        &[576],
        "73",
        None,
    ),
    ("3_self_interaction_1.linear.weight", &[21504], "74", None),
    ("3_self_interaction_1.linear.bias", &[0], "75", None),
    (
        "3_self_interaction_1.linear.output_mask",
        &[480],
        "76",
        None,
    ),
    ("3_convolution.denominator", &[1], "77", None),
    ("3_convolution.convolution.weight", &[0], "78", None),
    ("3_convolution.convolution.output_mask", &[3136], "79", None),
    (
        "3_convolution.convolution._compiled_main_left_right._w3j_1_1_1",
        &[3, 3, 3],
        "80",
        Some(&[3, 1, 9]),
    ),
    (
        "3_convolution.convolution._compiled_main_left_right._w3j_1_1_2",
        &[3, 3, 5],
        "81",
        Some(&[5, 15, 1]),
    ),
    (
        "3_convolution.convolution._compiled_main_left_right._w3j_1_2_1",
        &[3, 5, 3],
        "82",
        Some(&[5, 1, 15]),
    ),
    (
        "3_convolution.convolution._compiled_main_left_right._w3j_1_2_2",
        &[3, 5, 5],
        "83",
        Some(&[25, 1, 5]),
    ),
    (
        "3_convolution.convolution._compiled_main_left_right._w3j_2_1_1",
        &[5, 3, 3],
        "84",
        Some(&[1, 15, 5]),
    ),
    (
        "3_convolution.convolution._compiled_main_left_right._w3j_2_1_2",
        &[5, 3, 5],
        "85",
        Some(&[1, 25, 5]),
    ),
    (
        "3_convolution.convolution._compiled_main_left_right._w3j_2_2_1",
        &[5, 5, 3],
        "86",
        Some(&[5, 1, 25]),
    ),
    (
        "3_convolution.convolution._compiled_main_left_right._w3j_2_2_2",
        &[5, 5, 5],
        "87",
        Some(&[5, 1, 25]),
    ),
    (
        "3_convolution.weight_nn.layer0.weight",
        &[8, 64],
        "88",
        None,
    ),
    (
        "3_convolution.weight_nn.layer1.weight",
        &[64, 64],
        "89",
        None,
    ),
    (
        "3_convolution.weight_nn.layer2.weight",
        &[64, 960],
        "90",
        None,
    ),
    ("3_self_interaction_2.linear.weight", &[86016], "91", None),
    ("3_self_interaction_2.linear.bias", &[0], "92", None),
    (
        "3_self_interaction_2.linear.output_mask",
        &[576],
        "93",
        None,
    ),
    ("3_equivariant_gate.gate.mul.weight", &[0], "94", None),
    (
        "3_equivariant_gate.gate.mul.output_mask",
        &[352],
        "95",
        None,
    ),
    (
        "4_self_connection_intro.linear.weight",
        &[16384],
        "96",
        None,
    ),
    ("4_self_connection_intro.linear.bias", &[0], "97", None),
    (
        "4_self_connection_intro.linear.output_mask",
        &[128],
        "98",
        None,
    ),
    ("4_self_interaction_1.linear.weight", &[21504], "99", None),
    ("4_self_interaction_1.linear.bias", &[0], "100", None),
    (
        "4_self_interaction_1.linear.output_mask",
        &[480],
        "101",
        None,
    ),
    ("4_convolution.denominator", &[1], "102", None),
    ("4_convolution.convolution.weight", &[0], "103", None),
    ("4_convolution.convolution.output_mask", &[224], "104", None),
    (
        "4_convolution.weight_nn.layer0.weight",
        &[8, 64],
        "105",
        None,
    ),
    (
        "4_convolution.weight_nn.layer1.weight",
        &[64, 64],
        "106",
        None,
    ),
    (
        "4_convolution.weight_nn.layer2.weight",
        &[64, 224],
        "107",
        None,
    ),
    ("4_self_interaction_2.linear.weight", &[28672], "108", None),
    ("4_self_interaction_2.linear.bias", &[0], "109", None),
    (
        "4_self_interaction_2.linear.output_mask",
        &[128],
        "110",
        None,
    ),
    ("4_equivariant_gate.gate.mul.weight", &[0], "111", None),
    ("4_equivariant_gate.gate.mul.output_mask", &[0], "112", None),
    ("reduce_input_to_hidden.linear.weight", &[8192], "113", None),
    ("reduce_input_to_hidden.linear.bias", &[0], "114", None),
    (
        "reduce_input_to_hidden.linear.output_mask",
        &[64],
        "115",
        None,
    ),
    ("reduce_hidden_to_energy.linear.weight", &[64], "116", None),
    ("reduce_hidden_to_energy.linear.bias", &[0], "117", None),
    (
        "reduce_hidden_to_energy.linear.output_mask",
        &[1],
        "118",
        None,
    ),
    ("rescale_atomic_energy.shift", &[89], "119", None),
    ("rescale_atomic_energy.scale", &[89], "120", None),
];

/// Total number of elements over the 121 state-dict tensors (guide §0).
const STATE_DICT_NUMEL: usize = 863_456;

fn checkpoint_path() -> PathBuf {
    ddmlip_testkit::sevennet_checkpoint()
}

fn ckpt() -> &'static Checkpoint {
    static CKPT: OnceLock<Checkpoint> = OnceLock::new();
    CKPT.get_or_init(|| load(checkpoint_path()).unwrap_or_else(|e| panic!("{e}")))
}

fn state_dict() -> &'static Vec<(String, Tensor)> {
    static SD: OnceLock<Vec<(String, Tensor)>> = OnceLock::new();
    SD.get_or_init(|| ckpt().state_dict().unwrap())
}

fn sd_tensor(name: &str) -> &'static Tensor {
    &state_dict()
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .1
}

#[test]
fn container_layout_matches_the_guide() {
    let c = ckpt();
    assert_eq!(c.root_dir(), "tmp/");
    assert_eq!(c.entry_names().count(), 227);
    assert_eq!(c.num_storages(), 223);
    let names: Vec<&str> = c.entry_names().collect();
    for expected in [
        "tmp/data.pkl",
        "tmp/byteorder",
        "tmp/version",
        "tmp/data/0",
        "tmp/data/222",
    ] {
        assert!(names.contains(&expected), "missing {expected}");
    }
}

#[test]
fn top_level_keys_and_epoch() {
    let top = ckpt().object().as_dict().expect("top level is a dict");
    let keys: Vec<&str> = top.iter().map(|(k, _)| k.as_str().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "model_state_dict",
            "optimizer_state_dict",
            "scheduler_state_dict",
            "config",
            "epoch"
        ]
    );
    assert_eq!(ckpt().object().get("epoch"), Some(&PyValue::Int(600)));
}

#[test]
fn state_dict_matches_the_guide_table() {
    let refs = ckpt().state_dict_refs().unwrap();
    assert_eq!(refs.len(), STATE_DICT_TABLE.len());
    for ((name, view), (key, shape, storage, stride)) in refs.iter().zip(STATE_DICT_TABLE) {
        assert_eq!(name, key);
        assert_eq!(&view.shape, shape, "{key}");
        assert_eq!(view.storage.key, *storage, "{key}");
        assert_eq!(view.storage.dtype, StorageDtype::F32, "{key}");
        assert_eq!(view.offset, 0, "{key}");
        match stride {
            Some(s) => {
                assert_eq!(&view.stride, s, "{key}");
                assert!(!view.is_contiguous(), "{key}");
            }
            None => assert!(view.is_contiguous(), "{key}: stride {:?}", view.stride),
        }
    }
    let sd = state_dict();
    let total: usize = sd.iter().map(|(_, t)| t.data.len()).sum();
    assert_eq!(total, STATE_DICT_NUMEL);
    for (name, t) in sd {
        assert_eq!(t.data.len(), t.shape.iter().product::<usize>(), "{name}");
        assert!(t.data.iter().all(|x| x.is_finite()), "{name}");
    }
    assert_eq!(sd[0].0, "edge_embedding.basis_function.coeffs");
    assert_eq!(sd[0].1.shape, [8]);
    assert_eq!(sd[120].0, "rescale_atomic_energy.scale");
}

#[test]
fn denominators_equal_the_published_value() {
    for layer in 0..5 {
        let t = sd_tensor(&format!("{layer}_convolution.denominator"));
        assert_eq!(t.data, [35.989_574_432_373_05_f64 as f32], "layer {layer}");
    }
    assert_eq!(
        sd_tensor("edge_embedding.basis_function.coeffs").data.len(),
        8
    );
}

#[test]
fn species_shift_and_scale_match_appendix_a() {
    let shift = sd_tensor("rescale_atomic_energy.shift");
    let scale = sd_tensor("rescale_atomic_energy.scale");
    assert_eq!(shift.shape, [89]);
    // Si, type index 69: exact float32 value from the guide §5.2.
    assert_eq!(f64::from(shift.data[69]), -7.694_902_420_043_945);
    assert!(scale
        .data
        .iter()
        .all(|&s| f64::from(s) == 1.730_000_019_073_486_3));
    // (index, shift) printed with 9 significant digits in appendix A.
    for (i, expected) in [
        (0, -5.06276846),
        (28, -3.66714215),
        (31, 0.249460995),
        (37, 6.75830269),
        (51, -7.28465319),
        (84, 9.84386349),
        (88, -11.8468266),
    ] {
        let got = f64::from(shift.data[i]);
        assert!(
            (got - expected).abs() <= 1e-8 * expected.abs().max(1.0),
            "{i}: {got}"
        );
    }
}

#[test]
fn silicon_embedding_row_matches_guide_5_2() {
    // x = W0[69, :] / sqrt(89), W0 = onehot Linear weight viewed as (89, 128).
    let w0 = sd_tensor("onehot_to_feature_x.linear.weight");
    assert_eq!(w0.data.len(), 89 * 128);
    let row: Vec<f64> = w0.data[69 * 128..70 * 128]
        .iter()
        .map(|&w| f64::from(w) / 89f64.sqrt())
        .collect();
    let expected = [
        0.20466141704972185,
        -0.03645532624503718,
        0.0761020345951324,
        0.022427905139037054,
    ];
    for (g, e) in row.iter().zip(expected) {
        assert!((g - e).abs() < 1e-12, "{g} vs {e}");
    }
    let sum: f64 = row.iter().sum();
    assert!((sum - 1.2519879745978268).abs() < 1e-10, "{sum}");
}

// ---- Clebsch–Gordan reference (guide §4.4), complex numbers as (re, im) ----

type C64 = (f64, f64);

fn cmul(a: C64, b: C64) -> C64 {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

fn fact(n: i64) -> f64 {
    (1..=n).map(|k| k as f64).product()
}

/// ⟨l1 m1; l2 m2 | l3 m3⟩, Condon–Shortley, Racah formula.
fn su2_cg(l1: i64, m1: i64, l2: i64, m2: i64, l3: i64, m3: i64) -> f64 {
    if m3 != m1 + m2 {
        return 0.0;
    }
    let vmin = (-l1 + l2 + m3).max(-l1 + m1).max(0);
    let vmax = (l2 + l3 + m1).min(l3 - l1 + l2).min(l3 + m3);
    let c = ((2 * l3 + 1) as f64
        * fact(l3 + l1 - l2)
        * fact(l3 - l1 + l2)
        * fact(l1 + l2 - l3)
        * fact(l3 + m3)
        * fact(l3 - m3)
        / (fact(l1 + l2 + l3 + 1) * fact(l1 - m1) * fact(l1 + m1) * fact(l2 - m2) * fact(l2 + m2)))
    .sqrt();
    let mut s = 0.0;
    for v in vmin..=vmax {
        let sign = if (v + l2 + m2).rem_euclid(2) == 0 {
            1.0
        } else {
            -1.0
        };
        s += sign * fact(l2 + l3 + m1 - v) * fact(l1 - m1 + v)
            / (fact(v) * fact(l3 - l1 + l2 - v) * fact(l3 + m3 - v) * fact(v + l1 - l2 - m3));
    }
    c * s
}

/// Real-to-complex change of basis Q_l, row l+m, column = real component.
fn q_matrix(l: i64) -> Vec<Vec<C64>> {
    let n = (2 * l + 1) as usize;
    let h = 1.0 / 2f64.sqrt();
    let mut q = vec![vec![(0.0, 0.0); n]; n];
    for m in -l..0 {
        q[(l + m) as usize][(l - m) as usize] = (h, 0.0);
        q[(l + m) as usize][(l + m) as usize] = (0.0, -h);
    }
    q[l as usize][l as usize] = (1.0, 0.0);
    for m in 1..=l {
        let s = if m % 2 == 0 { 1.0 } else { -1.0 };
        q[(l + m) as usize][(l + m) as usize] = (s * h, 0.0);
        q[(l + m) as usize][(l - m) as usize] = (0.0, s * h);
    }
    // Multiply by (-i)^l.
    let mut phase = (1.0, 0.0);
    for _ in 0..l {
        phase = cmul(phase, (0.0, -1.0));
    }
    for row in &mut q {
        for x in row.iter_mut() {
            *x = cmul(*x, phase);
        }
    }
    q
}

/// e3nn `wigner_3j(l1, l2, l3)`, row-major (2l1+1, 2l2+1, 2l3+1), unit norm.
// Index loops mirror the summation formula of the guide one to one.
#[allow(clippy::needless_range_loop)]
fn wigner_3j(l1: i64, l2: i64, l3: i64) -> Vec<f64> {
    let (n1, n2, n3) = (
        (2 * l1 + 1) as usize,
        (2 * l2 + 1) as usize,
        (2 * l3 + 1) as usize,
    );
    let (q1, q2, q3) = (q_matrix(l1), q_matrix(l2), q_matrix(l3));
    let mut out = vec![0.0; n1 * n2 * n3];
    for a in 0..n1 {
        for b in 0..n2 {
            for c in 0..n3 {
                let mut acc = (0.0, 0.0);
                for i in 0..n1 {
                    for k in 0..n2 {
                        for n in 0..n3 {
                            let s = su2_cg(l1, i as i64 - l1, l2, k as i64 - l2, l3, n as i64 - l3);
                            if s == 0.0 {
                                continue;
                            }
                            let q3c = (q3[n][c].0, -q3[n][c].1);
                            let t = cmul(cmul(q1[i][a], q2[k][b]), q3c);
                            acc.0 += t.0 * s;
                            acc.1 += t.1 * s;
                        }
                    }
                }
                out[(a * n2 + b) * n3 + c] = acc.0;
            }
        }
    }
    let norm = out.iter().map(|x| x * x).sum::<f64>().sqrt();
    out.iter().map(|x| x / norm).collect()
}

#[test]
fn cg_reference_reproduces_the_guide_check_values() {
    let c111 = wigner_3j(1, 1, 1);
    assert!(
        (c111[5] - 0.408248290464).abs() < 1e-12,
        "C111[0,1,2] = {}",
        c111[5]
    );
    // C^{112}: the 11 nonzeros listed in the guide, row-major.
    let c112 = wigner_3j(1, 1, 2);
    let listed = [
        ((0, 0, 2), -0.182574185835),
        ((0, 0, 4), -0.316227766017),
        ((0, 1, 1), 0.316227766017),
        ((0, 2, 0), 0.316227766017),
        ((1, 0, 1), 0.316227766017),
        ((1, 1, 2), 0.365148371670),
        ((1, 2, 3), 0.316227766017),
        ((2, 0, 0), 0.316227766017),
        ((2, 1, 3), 0.316227766017),
        ((2, 2, 2), -0.182574185835),
        ((2, 2, 4), 0.316227766017),
    ];
    let mut nonzero = 0;
    for (i, &x) in c112.iter().enumerate() {
        if x.abs() > 1e-12 {
            nonzero += 1;
            let (a, b, c) = (i / 15, (i / 5) % 3, i % 5);
            let want = listed
                .iter()
                .find(|(idx, _)| *idx == (a, b, c))
                .map(|(_, v)| *v);
            assert_eq!(
                want.map(|w| (w - x).abs() < 1e-11),
                Some(true),
                "({a},{b},{c}) = {x}"
            );
        }
    }
    assert_eq!(nonzero, listed.len());
    let c222 = wigner_3j(2, 2, 2);
    assert!((c222.iter().sum::<f64>() - 0.764026563082).abs() < 1e-11);
}

#[test]
fn strided_w3j_buffers_equal_recomputed_clebsch_gordan() {
    // Guide §1.6 / §5.2: in layers 1-3 the stored (1,2,2), (2,1,2), (2,2,1)
    // buffers equal -wigner_3j, the other five +wigner_3j, to ~1.5e-8.
    let triples = [
        (1, 1, 1),
        (1, 1, 2),
        (1, 2, 1),
        (1, 2, 2),
        (2, 1, 1),
        (2, 1, 2),
        (2, 2, 1),
        (2, 2, 2),
    ];
    for layer in 1..=3 {
        for (l1, l2, l3) in triples {
            let name = format!(
                "{layer}_convolution.convolution._compiled_main_left_right._w3j_{l1}_{l2}_{l3}"
            );
            let t = sd_tensor(&name);
            assert_eq!(t.shape, [2 * l1 + 1, 2 * l2 + 1, 2 * l3 + 1], "{name}");
            let flipped = matches!((l1, l2, l3), (1, 2, 2) | (2, 1, 2) | (2, 2, 1));
            let sign = if flipped { -1.0 } else { 1.0 };
            let exact = wigner_3j(l1 as i64, l2 as i64, l3 as i64);
            let max_err = t
                .data
                .iter()
                .zip(&exact)
                .map(|(&s, &e)| (f64::from(s) - sign * e).abs())
                .fold(0.0, f64::max);
            assert!(max_err < 1e-7, "{name}: max deviation {max_err}");
            let norm: f64 = t
                .data
                .iter()
                .map(|&x| f64::from(x).powi(2))
                .sum::<f64>()
                .sqrt();
            assert!((norm - 1.0).abs() < 1e-6, "{name}: norm {norm}");
        }
    }
}

#[test]
fn config_values_match_the_guide() {
    let c = ckpt();
    assert_eq!(c.config().unwrap().as_dict().unwrap().len(), 75);
    assert_eq!(c.config_f64("cutoff").unwrap(), 5.0);
    assert_eq!(c.config_str("version").unwrap(), "0.9.1");
    assert_eq!(c.config_i64("_number_of_species").unwrap(), 89);
    assert_eq!(c.config_i64("num_convolution_layer").unwrap(), 5);
    assert_eq!(c.config_i64("lmax").unwrap(), 2);
    assert!(!c.config_bool("is_parity").unwrap());
    assert!(c.config_bool("_normalize_sph").unwrap());
    assert_eq!(c.config_str("self_connection_type").unwrap(), "linear");
    assert_eq!(
        c.config_f64_list("weight_nn_hidden_neurons").unwrap(),
        [64.0, 64.0]
    );

    let species = c.config_str_list("chemical_species").unwrap();
    assert_eq!(species.len(), 89);
    assert!(
        species.windows(2).all(|w| w[0] < w[1]),
        "not alphabetically sorted"
    );
    assert_eq!(
        (
            species[0].as_str(),
            species[69].as_str(),
            species[88].as_str()
        ),
        ("Ac", "Si", "Zr")
    );

    let irreps = c.config_str_list("irreps_manual").unwrap();
    let hidden = "128x0e+64x1e+32x2e";
    assert_eq!(irreps, ["128x0e", hidden, hidden, hidden, hidden, "128x0e"]);

    let type_map = c.config_int_map("_type_map").unwrap();
    assert_eq!(type_map.len(), 89);
    for (z, idx) in [(14, 69), (1, 28), (89, 0), (40, 88), (8, 51), (79, 5)] {
        assert!(type_map.contains(&(z, idx)), "Z={z} should map to {idx}");
    }
    let by_z = c
        .config_f64_list("_chemical_species_by_atomic_number")
        .unwrap();
    for (i, z) in by_z.iter().enumerate() {
        assert!(type_map.contains(&(*z as i64, i as i64)), "index {i}");
    }

    let rb = c.config_value("radial_basis").unwrap();
    assert_eq!(
        rb.get("radial_basis_name"),
        Some(&PyValue::Str("bessel".into()))
    );
    assert_eq!(rb.get("bessel_basis_num"), Some(&PyValue::Int(8)));
    let cf = c.config_value("cutoff_function").unwrap();
    assert_eq!(
        cf.get("cutoff_function_name"),
        Some(&PyValue::Str("XPLOR".into()))
    );
    assert_eq!(cf.get("cutoff_on"), Some(&PyValue::Float(4.5)));

    match c.config_value("device").unwrap() {
        PyValue::Opaque { class, args, .. } => {
            assert_eq!(class, "torch.device");
            assert_eq!(**args, PyValue::Tuple(vec![PyValue::Str("cuda".into())]));
        }
        other => panic!("device decoded as {other:?}"),
    }
}

#[test]
fn config_numpy_shift_equals_state_dict_shift() {
    let c = ckpt();
    let shift_sd: Vec<f64> = sd_tensor("rescale_atomic_energy.shift")
        .data
        .iter()
        .map(|&x| f64::from(x))
        .collect();
    match c.config_value("shift").unwrap() {
        PyValue::NdArray(a) => {
            assert_eq!(a.shape, [89]);
            assert_eq!((a.descr.as_str(), a.byteorder), ("f4", '<'));
        }
        other => panic!("shift decoded as {other:?}"),
    }
    assert_eq!(c.config_f64_list("shift").unwrap(), shift_sd);
    // `shift_cp` is a memo reference taken before the array's BUILD: with
    // reference semantics it shows the filled array (guide §1.2).
    assert_eq!(c.config_f64_list("shift_cp").unwrap(), shift_sd);
    let scale = c.config_f64_list("scale").unwrap();
    assert_eq!(scale.len(), 89);
    assert!(scale.iter().all(|&s| s == 1.73));
}

#[test]
fn optimizer_step_counters_are_zero_dimensional_cpu_tensors() {
    let state = ckpt()
        .object()
        .get("optimizer_state_dict")
        .and_then(|o| o.get("state"))
        .and_then(PyValue::as_dict)
        .expect("optimizer_state_dict.state");
    assert_eq!(state.len(), 34);
    for (_, entry) in state {
        let Some(PyValue::Tensor(step)) = entry.get("step") else {
            panic!("no step tensor");
        };
        assert!(step.shape.is_empty());
        assert_eq!(step.storage.location, "cpu");
        assert_eq!(ckpt().tensor(step).unwrap().data.len(), 1);
    }
}

#[test]
fn truncated_and_foreign_files_are_rejected_clearly() {
    let bytes = std::fs::read(checkpoint_path()).unwrap();
    for cut in [10, 1000, bytes.len() / 2, bytes.len() - 30] {
        let err = Checkpoint::from_bytes("cut.pth".into(), bytes[..cut].to_vec()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                CheckpointError::NotTorchZip { .. } | CheckpointError::Zip { .. }
            ),
            "{cut}: {msg}"
        );
    }
    let err = Checkpoint::from_bytes("half.pth".into(), bytes[..bytes.len() / 2].to_vec())
        .unwrap_err()
        .to_string();
    assert!(err.contains("truncated"), "{err}");

    // Legacy torch.save format: a bare pickle stream.
    let legacy = b"\x80\x02\x8a\x0alp\xfc\x9cF\xf9 j\xa8P\x19.".to_vec();
    let err = Checkpoint::from_bytes("old.pth".into(), legacy)
        .unwrap_err()
        .to_string();
    assert!(err.contains("legacy"), "{err}");

    let random: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let err = Checkpoint::from_bytes("rand.bin".into(), random).unwrap_err();
    assert!(matches!(err, CheckpointError::NotTorchZip { .. }), "{err}");

    let err = load("/nonexistent/dir/checkpoint.pth").unwrap_err();
    assert!(matches!(err, CheckpointError::Io { .. }), "{err}");
}
