//! `ddmlip bench model --phases` through the real binary: the JSON record
//! carries every SevenNet kernel phase of both passes with FLOPs that match
//! the per-layer pattern of the architecture, the phases fit inside the
//! evaluation, and a decomposed run is refused with exit status 2.

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_ddmlip");

fn run(args: &[&str]) -> (i32, String, String) {
    ddmlip_testkit::cli::run_binary(BIN, args)
}

#[test]
fn phases_of_sevennet_are_reported_per_kernel() {
    ddmlip_testkit::sevennet_checkpoint();
    let (code, out, err) = run(&[
        "bench",
        "model",
        "--model",
        "sevennet-0",
        "--crystal",
        "si",
        "--repeat",
        "2",
        "--threads",
        "1",
        "--repeats",
        "2",
        "--phases",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON summary");
    let rec = &v["records"][0];
    let p = &rec["kernel_phases"];
    assert_eq!(p["atoms"], 64);
    assert_eq!(p["steps"], 2);
    let phases = p["phases"].as_array().expect("phases");
    let find = |name: &str, pass: &str| {
        phases
            .iter()
            .find(|x| x["name"] == name && x["pass"] == pass)
            .unwrap_or_else(|| panic!("{name} {pass} missing"))
    };
    let edges = rec["edges"].as_f64().unwrap();
    assert!(edges > 0.0);
    for pass in ["forward", "backward"] {
        for t in 0..5 {
            for kind in [
                "self_connection",
                "self_interaction_1",
                "convolution",
                "self_interaction_2",
                "equivariant_gate",
            ] {
                // Layer 0's self-connection and linear_1 read the species
                // embedding, a constant: no backward.
                let constant_input = kind == "self_connection" || kind == "self_interaction_1";
                if t == 0 && pass == "backward" && constant_input {
                    continue;
                }
                let x = find(&format!("{t}_{kind}"), pass);
                assert_eq!(x["calls"].as_f64(), Some(1.0), "{t}_{kind} {pass}");
                assert!(x["wall_s"].as_f64().unwrap() > 0.0);
            }
        }
        // Layers 1–3 have the same shapes, so the same FLOPs per edge.
        let f1 = find("1_convolution", pass)["flops"].as_f64().unwrap();
        assert_eq!(f1, find("3_convolution", pass)["flops"].as_f64().unwrap());
        assert_eq!(f1 % edges, 0.0, "FLOPs are per edge");
    }
    // The backward runs the radial part twice (the weights again, then
    // their gradient) and the tensor products once. `bench model` runs f32
    // by default, which reads each radial network from its table: 6
    // multiply-adds per weight, 960 weights in layer 2.
    let fwd = find("2_convolution", "forward")["flops"].as_f64().unwrap();
    let bwd = find("2_convolution", "backward")["flops"].as_f64().unwrap();
    let radial = edges * 2.0 * 6.0 * 960.0;
    assert_eq!(bwd - fwd, radial);
    let sum: f64 = phases.iter().map(|x| x["wall_s"].as_f64().unwrap()).sum();
    let step = p["step_wall_s"].as_f64().unwrap();
    assert!(
        sum > 0.0 && sum <= step,
        "phases {sum} s within the step's {step} s"
    );
}

#[test]
fn phases_table_is_printed() {
    ddmlip_testkit::sevennet_checkpoint();
    let (code, out, err) = run(&[
        "bench",
        "model",
        "--model",
        "sevennet-0",
        "--crystal",
        "si",
        "--repeat",
        "1",
        "--threads",
        "1",
        "--repeats",
        "1",
        "--phases",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("SevenNet phases per evaluation"), "{out}");
    assert!(out.contains("4_convolution"), "{out}");
    assert!(out.contains("merged over layers"), "{out}");
    assert!(out.contains("outside the kernels"), "{out}");
}

#[test]
fn phases_of_a_decomposed_run_are_refused() {
    let (code, _out, err) = run(&[
        "bench", "model", "--model", "lj", "--repeat", "1", "--ranks", "1,2", "--phases",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--phases") && err.contains("--ranks 1"),
        "{err}"
    );
}
