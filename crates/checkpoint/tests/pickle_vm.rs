//! The pickle VM against pickles written by CPython's own pickler
//! (independent reference; bytes generated with `pickle.dumps` and pasted
//! as hex), hand-written torch-style pickles, hostile inputs, and a
//! fuzz-style property test: the VM never panics.

mod common;

use common::{torch_style_pickle, P};
use ddmlip_checkpoint::pickle::unpickle;
use ddmlip_checkpoint::{CheckpointError, PyValue, StorageDtype, StorageRef, TensorRef};
use proptest::prelude::*;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `pickle.dumps(obj, protocol=p)` for p = 2, 3, 4, 5, where (Python)
/// shared = [1.5, 'x']
/// obj = {'ints': [0, 255, 256, 65535, 65536, -1, -2**31, 2**31, 2**40, -(2**63), 2**63 - 1],
///        'big': 2**70, 'negbig': -(2**70), 'f': [-0.25, 1e300], 's': 'h\u00e9llo \u2603',
///        'b': b'\x00\x01\xff', 'empty': '', 't': (None, True, False), 't1': (1,),
///        't2': (1, 2), 't3': (1, 2, 3), 't4': (1, 2, 3, 4), 'shared': shared,
///        'again': shared, 7: 'int key', 'nested': {'a': {'b': []}}}
const CPYTHON_PICKLES: [&str; 4] = [
    "80027d7100285804000000696e747371015d7102284b004bff4d00014dffff4a000001004affffffff4a000000808a0500000080008a060000000000018a0800000000000000808a08ffffffffffffff7f65580300000062696771038a0900000000000000004058060000006e656762696771048a090000000000000000c058010000006671055d71062847bfd0000000000000477e37e43c8800759c655801000000737107580a00000068c3a96c6c6f20e2988371085801000000627109635f636f646563730a656e636f64650a710a58040000000001c3bf710b58060000006c6174696e31710c86710d52710e5805000000656d707479710f5800000000711058010000007471114e88898771125802000000743171134b018571145802000000743271154b014b028671165802000000743371174b014b024b03877118580200000074347119284b014b024b034b0474711a5806000000736861726564711b5d711c28473ff8000000000000580100000078711d655805000000616761696e711e681c4b075807000000696e74206b6579711f58060000006e657374656471207d712158010000006171227d712368095d71247373752e",
    "80037d7100285804000000696e747371015d7102284b004bff4d00014dffff4a000001004affffffff4a000000808a0500000080008a060000000000018a0800000000000000808a08ffffffffffffff7f65580300000062696771038a0900000000000000004058060000006e656762696771048a090000000000000000c058010000006671055d71062847bfd0000000000000477e37e43c8800759c655801000000737107580a00000068c3a96c6c6f20e298837108580100000062710943030001ff710a5805000000656d707479710b5800000000710c580100000074710d4e888987710e58020000007431710f4b018571105802000000743271114b014b028671125802000000743371134b014b024b03877114580200000074347115284b014b024b034b04747116580600000073686172656471175d711828473ff80000000000005801000000787119655805000000616761696e711a68184b075807000000696e74206b6579711b58060000006e6573746564711c7d711d580100000061711e7d711f68095d71207373752e",
    "80049532010000000000007d94288c04696e7473945d94284b004bff4d00014dffff4a000001004affffffff4a000000808a0500000080008a060000000000018a0800000000000000808a08ffffffffffffff7f658c03626967948a090000000000000000408c066e6567626967948a090000000000000000c08c0166945d942847bfd0000000000000477e37e43c8800759c658c0173948c0a68c3a96c6c6f20e29883948c01629443030001ff948c05656d707479948c00948c0174944e888987948c027431944b0185948c027432944b014b0286948c027433944b014b024b0387948c02743494284b014b024b034b0474948c06736861726564945d9428473ff80000000000008c017894658c05616761696e9468184b078c07696e74206b6579948c066e6573746564947d948c0161947d9468095d947373752e",
    "80059532010000000000007d94288c04696e7473945d94284b004bff4d00014dffff4a000001004affffffff4a000000808a0500000080008a060000000000018a0800000000000000808a08ffffffffffffff7f658c03626967948a090000000000000000408c066e6567626967948a090000000000000000c08c0166945d942847bfd0000000000000477e37e43c8800759c658c0173948c0a68c3a96c6c6f20e29883948c01629443030001ff948c05656d707479948c00948c0174944e888987948c027431944b0185948c027432944b014b0286948c027433944b014b024b0387948c02743494284b014b024b034b0474948c06736861726564945d9428473ff80000000000008c017894658c05616761696e9468184b078c07696e74206b6579948c066e6573746564947d948c0161947d9468095d947373752e",
];

fn s(x: &str) -> PyValue {
    PyValue::Str(x.into())
}

fn i(x: i64) -> PyValue {
    PyValue::Int(x)
}

/// The Python object above, written out by hand.
fn expected_cpython_object() -> PyValue {
    let shared = PyValue::List(vec![PyValue::Float(1.5), s("x")]);
    let mut big = vec![0u8; 9];
    big[8] = 0x40; // 2**70 = 0x40 << 64
    let mut negbig = vec![0u8; 9];
    negbig[8] = 0xc0; // -(2**70) in two's complement
    PyValue::Dict(vec![
        (
            s("ints"),
            PyValue::List(
                [
                    0,
                    255,
                    256,
                    65535,
                    65536,
                    -1,
                    -(1 << 31),
                    1 << 31,
                    1 << 40,
                    i64::MIN,
                    i64::MAX,
                ]
                .into_iter()
                .map(i)
                .collect(),
            ),
        ),
        (s("big"), PyValue::BigInt(big)),
        (s("negbig"), PyValue::BigInt(negbig)),
        (
            s("f"),
            PyValue::List(vec![PyValue::Float(-0.25), PyValue::Float(1e300)]),
        ),
        (s("s"), s("h\u{e9}llo \u{2603}")),
        (s("b"), PyValue::Bytes(vec![0, 1, 0xff])),
        (s("empty"), s("")),
        (
            s("t"),
            PyValue::Tuple(vec![
                PyValue::None,
                PyValue::Bool(true),
                PyValue::Bool(false),
            ]),
        ),
        (s("t1"), PyValue::Tuple(vec![i(1)])),
        (s("t2"), PyValue::Tuple(vec![i(1), i(2)])),
        (s("t3"), PyValue::Tuple(vec![i(1), i(2), i(3)])),
        (s("t4"), PyValue::Tuple(vec![i(1), i(2), i(3), i(4)])),
        (s("shared"), shared.clone()),
        (s("again"), shared),
        (i(7), s("int key")),
        (
            s("nested"),
            PyValue::Dict(vec![(
                s("a"),
                PyValue::Dict(vec![(s("b"), PyValue::List(vec![]))]),
            )]),
        ),
    ])
}

#[test]
fn cpython_pickles_of_protocols_2_to_5_decode_to_the_source_object() {
    let expected = expected_cpython_object();
    for (k, hex) in CPYTHON_PICKLES.iter().enumerate() {
        let got = unpickle(&unhex(hex)).unwrap_or_else(|e| panic!("protocol {}: {e}", k + 2));
        assert_eq!(got, expected, "protocol {}", k + 2);
    }
}

#[test]
fn cpython_sets_and_ordered_dict() {
    // pickle.dumps({'s': {3, 'a'}, 'fs': frozenset([5])}, protocol=4)
    let sets =
        unhex("8004951d000000000000007d94288c0173948f94284b038c016194908c02667394284b059194752e");
    assert_eq!(
        unpickle(&sets).unwrap(),
        PyValue::Dict(vec![
            (s("s"), PyValue::Set(vec![i(3), s("a")])),
            (s("fs"), PyValue::Set(vec![i(5)])),
        ])
    );
    // pickle.dumps(collections.OrderedDict([('a', 1)]), protocol=2)
    let od = unhex("800263636f6c6c656374696f6e730a4f726465726564446963740a71002952710158010000006171024b01732e");
    assert_eq!(unpickle(&od).unwrap(), PyValue::Dict(vec![(s("a"), i(1))]));
}

#[test]
fn torch_style_tensor_and_memo_reference() {
    let view = TensorRef {
        storage: StorageRef {
            key: "0".into(),
            dtype: StorageDtype::F32,
            location: "cpu".into(),
            numel: 6,
        },
        offset: 1,
        shape: vec![2, 2],
        stride: vec![1, 2],
    };
    assert_eq!(
        unpickle(&torch_style_pickle("FloatStorage", 6)).unwrap(),
        PyValue::Dict(vec![
            (s("w"), PyValue::Tensor(view.clone())),
            (s("w_again"), PyValue::Tensor(view)),
        ])
    );
    // offset 1 + (2-1)*1 + (2-1)*2 = 4 must be < numel: 4 elements are too few.
    let err = unpickle(&torch_style_pickle("FloatStorage", 4)).unwrap_err();
    assert!(matches!(err, CheckpointError::Malformed { .. }), "{err}");
}

#[test]
fn memo_holds_references_not_snapshots() {
    // d = {}; memo[0] = d; x = [d]; d['k'] = 1  →  [ {'k': 1} ]
    let bytes = P::default()
        .op(b"\x80\x02}q\x00](h\x00e")
        .op(b"h\x00")
        .str("k")
        .int1(1)
        .op(b"s0.")
        .0;
    assert_eq!(
        unpickle(&bytes).unwrap(),
        PyValue::List(vec![PyValue::Dict(vec![(s("k"), i(1))])])
    );
}

#[test]
fn hostile_inputs_fail_cleanly() {
    // 100 000 nested lists: too deep, but no stack overflow.
    let mut deep = b"\x80\x02".to_vec();
    deep.extend(vec![b']'; 100_000]);
    deep.extend(vec![b'a'; 99_999]);
    deep.push(b'.');
    assert!(matches!(
        unpickle(&deep),
        Err(CheckpointError::Malformed { .. })
    ));

    // A list containing itself.
    let cyclic = b"\x80\x02]q\x00h\x00a.".to_vec();
    assert!(matches!(
        unpickle(&cyclic),
        Err(CheckpointError::Malformed { .. })
    ));

    // t = (t, t) 80 times through the memo: 2^80 copies if expanded naively.
    let mut dag = b"\x80\x02Nq\x00".to_vec();
    for _ in 0..80 {
        dag.extend_from_slice(b"h\x00h\x00\x86q\x00");
    }
    dag.push(b'.');
    assert!(matches!(
        unpickle(&dag),
        Err(CheckpointError::Malformed { .. })
    ));

    // Lengths far beyond the input must not allocate.
    for bytes in [
        &b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f"[..],
        b"\x80\x02X\xff\xff\xff\xff",
        b"\x80\x02\x8b\xff\xff\xff\x7f",
        b"\x80\x02r\xff\xff\xff\xff.",
        b"",
        b"\x80\x02",
        b".",
        b"\x80\x02(.",
    ] {
        assert!(unpickle(bytes).is_err(), "{bytes:?}");
    }

    // Unknown callables are kept opaque, never run.
    let opaque = P::default()
        .op(b"\x80\x02")
        .global("os", "system")
        .str("echo hi")
        .op(b"\x85R.")
        .0;
    assert_eq!(
        unpickle(&opaque).unwrap(),
        PyValue::Opaque {
            class: "os.system".into(),
            args: Box::new(PyValue::Tuple(vec![s("echo hi")])),
            state: None,
        }
    );
}

/// Valid seeds for mutation: every CPython pickle plus the torch-style one.
fn seeds() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = CPYTHON_PICKLES.iter().map(|h| unhex(h)).collect();
    v.push(torch_style_pickle("FloatStorage", 6));
    v.push(torch_style_pickle("DoubleStorage", 6));
    v
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = unpickle(&bytes);
        // Also behind a valid protocol header, so more opcodes are reached.
        let mut with_header = b"\x80\x02".to_vec();
        with_header.extend_from_slice(&bytes);
        let _ = unpickle(&with_header);
    }

    #[test]
    fn mutated_valid_pickles_never_panic(
        seed in 0usize..6,
        mutations in proptest::collection::vec(mutation(), 1..8),
    ) {
        let mut bytes = seeds().swap_remove(seed);
        for m in mutations {
            let n = bytes.len().max(1);
            match m {
                Mutation::Set(i, b) => { if !bytes.is_empty() { bytes[i % n] = b; } }
                Mutation::Insert(i, b) => bytes.insert(i % (bytes.len() + 1), b),
                Mutation::Remove(i) => { if !bytes.is_empty() { bytes.remove(i % n); } }
                Mutation::Truncate(i) => bytes.truncate(i % n),
            }
        }
        let _ = unpickle(&bytes);
    }
}
