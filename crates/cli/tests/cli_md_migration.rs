//! `ddmlip md`'s migration flags through the real binary: impossible values
//! and a checkpoint whose domains are damaged exit 2 naming the problem;
//! `--migration collective` gives the same final state.

mod common;

use common::md;
use ddmlip_testkit::cli::{argon_fcc, path_str as s};

#[test]
fn migration_flags_and_checkpointed_domains_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("ar.xyz");
    ddmlip_atoms::extxyz::write_file(&st, &[argon_fcc(3, 0.1, false)]).unwrap();
    let (ck, a, b) = (
        dir.path().join("md.ck"),
        dir.path().join("p2p.xyz"),
        dir.path().join("coll.xyz"),
    );
    let base = [
        "--model",
        "lj",
        "--structure",
        s(&st),
        "--ensemble",
        "nve",
        "--init-temperature",
        "600",
        "--seed",
        "2",
        "--dt",
        "2",
        "--steps",
        "60",
        "--skin",
        "0.3",
        "--ranks",
        "2",
        "--balance",
        "atoms",
    ];
    for (flag, value) in [
        ("--max-imbalance", "0.5"),
        ("--max-imbalance", "nan"),
        ("--migration", "sideways"),
    ] {
        let o = md(&[&base[..], &[flag, value]].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
    let o = md(&[&base[..], &["--checkpoint", s(&ck), "--output", s(&a)]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = md(&[&base[..], &["--migration", "collective", "--output", s(&b)]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (x, y) = (
        ddmlip_atoms::extxyz::read_file(&a).unwrap().remove(0),
        ddmlip_atoms::extxyz::read_file(&b).unwrap().remove(0),
    );
    assert_eq!(x.positions, y.positions);

    // Damaged domains: the first axis' cuts out of order.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ck).unwrap()).unwrap();
    let cuts = v["domains"]["layouts"]["a"]["cuts"].as_array_mut().unwrap();
    cuts.reverse();
    let bad = dir.path().join("bad.ck");
    std::fs::write(&bad, v.to_string()).unwrap();
    let o = md(&[&base[..], &["--restart", s(&bad)]].concat());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("domain map"), "{err}");
}
