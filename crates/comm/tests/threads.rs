//! Threads backend: exchange patterns, deterministic collectives, failure
//! propagation and deadlines.

use std::time::{Duration, Instant};

use ddmlip_comm::{
    run_threads, thread_world, CommError, Communicator, FailureKind, RankFailure, ThreadsConfig,
};
use proptest::prelude::*;

fn config(timeout_s: f64) -> ThreadsConfig {
    ThreadsConfig {
        timeout: Duration::from_secs_f64(timeout_s),
        ..Default::default()
    }
}

fn all_ok<R: std::fmt::Debug>(results: Vec<Result<R, RankFailure>>) -> Vec<R> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// A value that identifies (source, destination, element) uniquely.
fn token(src: usize, dst: usize, k: usize) -> f64 {
    (src * 1000 + dst * 10 + k) as f64 + 0.5
}

#[test]
fn point_to_point_ring_preserves_order_and_types() {
    let n = 4;
    let results = run_threads(n, config(30.0), |comm| -> Result<_, CommError> {
        let (rank, size) = (comm.rank(), comm.size());
        let next = (rank + 1) % size;
        let prev = (rank + size - 1) % size;
        // Two messages on the same tag must arrive in send order; a message on
        // another tag sent first must not be delivered to the wrong receive.
        comm.send_u64(next, 9, &[rank as u64, 77])?;
        comm.send_f64(next, 3, &[token(rank, next, 0)])?;
        comm.send_f64(next, 3, &[token(rank, next, 1), 2.0])?;
        comm.send_f32(next, 4, &[1.5f32; 3])?;
        comm.send_bytes(next, 5, b"halo")?;
        let first = comm.recv_f64(prev, 3)?;
        let mut second = [0.0; 2];
        comm.recv_f64_into(prev, 3, &mut second)?;
        let floats = comm.recv_f32(prev, 4)?;
        let bytes = comm.recv_bytes(prev, 5)?;
        let ids = comm.recv_u64(prev, 9)?;
        Ok((prev, first, second, floats, bytes, ids))
    });
    for (rank, (prev, first, second, floats, bytes, ids)) in all_ok(results).into_iter().enumerate()
    {
        assert_eq!(prev, (rank + n - 1) % n);
        assert_eq!(first, vec![token(prev, rank, 0)]);
        assert_eq!(second, [token(prev, rank, 1), 2.0]);
        assert_eq!(floats, vec![1.5f32; 3]);
        assert_eq!(bytes, b"halo".to_vec());
        assert_eq!(ids, vec![prev as u64, 77]);
    }
}

#[test]
fn exchange_all_to_all_including_self() {
    for n in 1..=5 {
        let results = run_threads(n, config(30.0), |comm| -> Result<_, CommError> {
            let rank = comm.rank();
            let payloads: Vec<Vec<f64>> = (0..n)
                .map(|dst| (0..dst + 1).map(|k| token(rank, dst, k)).collect())
                .collect();
            let sends: Vec<(usize, &[f64])> = payloads
                .iter()
                .enumerate()
                .map(|(dst, p)| (dst, p.as_slice()))
                .collect();
            let recv_from: Vec<usize> = (0..n).rev().collect();
            comm.exchange_f64(&sends, &recv_from, 11)
        });
        for (rank, received) in all_ok(results).into_iter().enumerate() {
            assert_eq!(received.len(), n);
            for (i, src) in (0..n).rev().enumerate() {
                let expected: Vec<f64> = (0..rank + 1).map(|k| token(src, rank, k)).collect();
                assert_eq!(received[i], expected, "n={n} rank={rank} src={src}");
            }
        }
    }
}

#[test]
fn exchange_self_peer_repeated_in_tiny_periodic_box() {
    // One rank that is its own neighbour on both sides (as in a periodic box
    // split once): it sends two different halos to itself and must get them
    // back in send order.
    let results = run_threads(1, config(30.0), |comm| -> Result<_, CommError> {
        let left = [1.0, 2.0];
        let right = [3.0];
        comm.exchange_f64(&[(0, &left[..]), (0, &right[..])], &[0, 0], 1)
    });
    let received = all_ok(results).remove(0);
    assert_eq!(received, vec![vec![1.0, 2.0], vec![3.0]]);

    // Two ranks, each appearing twice as the other's neighbour, plus itself.
    let results = run_threads(2, config(30.0), |comm| -> Result<_, CommError> {
        let rank = comm.rank();
        let other = 1 - rank;
        let a = [token(rank, other, 0)];
        let b = [token(rank, other, 1)];
        let s = [token(rank, rank, 0)];
        let sends = [(other, &a[..]), (rank, &s[..]), (other, &b[..])];
        let got = comm.exchange_f64(&sends, &[other, rank, other], 2)?;
        let ids = comm.exchange_u64(&[(other, &[rank as u64][..])], &[other], 3)?;
        Ok((got, ids))
    });
    for (rank, (got, ids)) in all_ok(results).into_iter().enumerate() {
        let other = 1 - rank;
        assert_eq!(
            got,
            vec![
                vec![token(other, rank, 0)],
                vec![token(rank, rank, 0)],
                vec![token(other, rank, 1)]
            ]
        );
        assert_eq!(ids, vec![vec![other as u64]]);
    }
}

#[test]
fn all_gather_is_in_rank_order_with_variable_sizes() {
    let n = 6;
    let results = run_threads(n, config(30.0), |comm| -> Result<_, CommError> {
        let rank = comm.rank();
        let values: Vec<f64> = (0..rank).map(|k| token(rank, 0, k)).collect();
        let ids: Vec<u64> = (0..(rank % 3)).map(|k| (rank * 100 + k) as u64).collect();
        let text = format!("rank{rank}");
        let f = comm.all_gather_f64(&values)?;
        let u = comm.all_gather_u64(&ids)?;
        let b = comm.all_gather_bytes(text.as_bytes())?;
        let h = comm.all_gather_f32(&[rank as f32])?;
        Ok((f, u, b, h))
    });
    for (f, u, b, h) in all_ok(results) {
        for r in 0..n {
            let values: Vec<f64> = (0..r).map(|k| token(r, 0, k)).collect();
            assert_eq!(f[r], values);
            let ids: Vec<u64> = (0..(r % 3)).map(|k| (r * 100 + k) as u64).collect();
            assert_eq!(u[r], ids);
            assert_eq!(b[r], format!("rank{r}").into_bytes());
            assert_eq!(h[r], vec![r as f32]);
        }
    }
}

#[test]
fn barrier_orders_side_effects() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let n = 5;
    let arrived = AtomicUsize::new(0);
    let results = run_threads(n, config(30.0), |comm| -> Result<_, CommError> {
        if comm.rank() == 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
        arrived.fetch_add(1, Ordering::SeqCst);
        comm.barrier()?;
        // Nobody leaves the barrier before everyone entered it.
        Ok(arrived.load(Ordering::SeqCst))
    });
    assert!(all_ok(results).iter().all(|&seen| seen == n));
}

/// A rank that waits does the world's idle work meanwhile, and still gets
/// its message; with no idle work to do it waits as before.
#[test]
fn waiting_ranks_do_idle_work() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let config = ThreadsConfig {
        idle: Some(Arc::new(move || {
            // Some work for the first 50 calls, then none.
            counter.fetch_add(1, Ordering::SeqCst) < 50
        })),
        ..config(30.0)
    };
    let results = run_threads(2, config, |comm| -> Result<_, CommError> {
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(100));
            comm.send_f64(0, 7, &[42.0])?;
            return Ok(0.0);
        }
        Ok(comm.recv_f64(1, 7)?[0])
    });
    assert_eq!(all_ok(results), vec![42.0, 0.0]);
    // 50 calls that did work, then looks at growing intervals for about 100 ms.
    assert!(
        calls.load(Ordering::SeqCst) > 50,
        "idle work was not called"
    );
}

/// Left fold in rank order, the documented reduction order.
fn serial_sum_f64(contributions: &[Vec<f64>]) -> Vec<f64> {
    let mut sum = contributions[0].clone();
    for c in &contributions[1..] {
        for (s, v) in sum.iter_mut().zip(c) {
            *s += v;
        }
    }
    sum
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn all_reduce_is_rank_order_sum_and_bitwise_replicated(
        n in 1usize..=8,
        len in 0usize..40,
        seed in proptest::collection::vec(-1e6f64..1e6, 8 * 40),
        scale in proptest::collection::vec(1e-8f64..1e8, 8),
    ) {
        // Mixed magnitudes make the sum order visible in the last bits.
        let data: Vec<Vec<f64>> = (0..n)
            .map(|r| (0..len).map(|i| seed[r * 40 + i] * scale[r]).collect())
            .collect();
        let results = run_threads(n, config(30.0), |comm| -> Result<_, CommError> {
            let mut mine = data[comm.rank()].clone();
            comm.all_reduce_sum_f64(&mut mine)?;
            let mut mine32: Vec<f32> = data[comm.rank()].iter().map(|&x| x as f32).collect();
            comm.all_reduce_sum_f32(&mut mine32)?;
            Ok((mine, mine32))
        });
        let results = all_ok(results);
        let expected = serial_sum_f64(&data);
        let data32: Vec<Vec<f32>> = data.iter().map(|c| c.iter().map(|&x| x as f32).collect()).collect();
        let mut expected32 = data32[0].clone();
        for c in &data32[1..] {
            for (s, v) in expected32.iter_mut().zip(c) {
                *s += v;
            }
        }
        for (got, got32) in &results {
            let bits: Vec<u64> = got.iter().map(|x| x.to_bits()).collect();
            let want: Vec<u64> = expected.iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(bits, want);
            let bits32: Vec<u32> = got32.iter().map(|x| x.to_bits()).collect();
            let want32: Vec<u32> = expected32.iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(bits32, want32);
        }
    }
}

#[test]
fn all_reduce_length_mismatch_is_reported_on_every_rank() {
    let results = run_threads(3, config(10.0), |comm| {
        let mut data = vec![1.0; if comm.rank() == 2 { 4 } else { 3 }];
        comm.all_reduce_sum_f64(&mut data)
    });
    for result in results {
        let failure = result.expect_err("mismatch must fail");
        assert!(
            failure
                .message
                .contains("rank 2 has 4 elements, expected 3"),
            "{failure}"
        );
    }
}

#[test]
fn collective_mismatch_is_detected() {
    let results = run_threads(2, config(10.0), |comm| {
        if comm.rank() == 0 {
            comm.barrier()
        } else {
            comm.all_gather_u64(&[1]).map(|_| ())
        }
    });
    assert!(results.iter().all(|r| r.is_err()));
    let root = results[0].as_ref().expect_err("root fails");
    assert!(root.message.contains("collective mismatch"), "{root}");
}

#[derive(Debug, Clone, Copy)]
enum Blocked {
    Recv,
    AllReduce,
    Barrier,
    Exchange,
}

fn failing_rank_wakes_everyone(blocked: Blocked, panic: bool) {
    failing_rank_wakes_everyone_from(2, blocked, panic);
}

fn failing_rank_wakes_everyone_from(failing: usize, blocked: Blocked, panic: bool) {
    let n = 4;
    let start = Instant::now();
    let results = run_threads(n, config(60.0), |comm| -> Result<(), String> {
        if comm.rank() == failing {
            // Let the others block first.
            std::thread::sleep(Duration::from_millis(100));
            if panic {
                panic!("boom in rank");
            }
            return Err("model diverged at layer 3".to_string());
        }
        let outcome = match blocked {
            Blocked::Recv => comm.recv_f64(failing, 0).map(|_| ()),
            Blocked::AllReduce => comm.all_reduce_sum_f64(&mut [1.0, 2.0]),
            Blocked::Barrier => comm.barrier(),
            Blocked::Exchange => {
                let rank = comm.rank();
                let peers: Vec<usize> = (0..n).filter(|&p| p != rank).collect();
                let data = [rank as f64];
                let sends: Vec<(usize, &[f64])> = peers.iter().map(|&p| (p, &data[..])).collect();
                comm.exchange_f64(&sends, &peers, 7).map(|_| ())
            }
        };
        outcome.map_err(|e| {
            // Every blocked call must report the failed rank itself.
            match &e {
                CommError::PeerFailed { rank, .. } => assert_eq!(*rank, failing),
                other => panic!("expected PeerFailed, got {other:?}"),
            }
            e.to_string()
        })
    });
    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_secs(5),
        "{blocked:?}: took {elapsed:?}"
    );
    let expected_message = if panic {
        "panic: boom in rank"
    } else {
        "model diverged at layer 3"
    };
    for (rank, result) in results.into_iter().enumerate() {
        let failure = result.expect_err("every rank fails");
        assert_eq!(failure.rank, rank);
        assert_eq!(failure.first.rank, failing, "{blocked:?}");
        assert_eq!(failure.first.message, expected_message);
        if rank == failing {
            let kind = if panic {
                FailureKind::Panic
            } else {
                FailureKind::Error
            };
            assert_eq!(failure.kind, kind);
        } else {
            assert_eq!(failure.kind, FailureKind::Error);
            assert!(
                failure
                    .message
                    .contains(&format!("rank {failing} failed: {expected_message}")),
                "{failure}"
            );
        }
    }
}

#[test]
fn error_in_one_rank_wakes_blocked_recv() {
    failing_rank_wakes_everyone(Blocked::Recv, false);
}

#[test]
fn panic_in_one_rank_wakes_blocked_recv() {
    failing_rank_wakes_everyone(Blocked::Recv, true);
}

#[test]
fn error_in_one_rank_wakes_blocked_all_reduce() {
    failing_rank_wakes_everyone(Blocked::AllReduce, false);
}

#[test]
fn panic_in_one_rank_wakes_blocked_all_reduce() {
    failing_rank_wakes_everyone(Blocked::AllReduce, true);
}

#[test]
fn error_in_one_rank_wakes_blocked_barrier() {
    failing_rank_wakes_everyone(Blocked::Barrier, false);
}

#[test]
fn panic_in_one_rank_wakes_blocked_barrier() {
    failing_rank_wakes_everyone(Blocked::Barrier, true);
}

#[test]
fn panic_in_one_rank_wakes_blocked_exchange() {
    failing_rank_wakes_everyone(Blocked::Exchange, true);
}

#[test]
fn failing_root_wakes_ranks_blocked_in_collectives() {
    // Rank 0 reduces for everyone; its failure must also wake the others.
    failing_rank_wakes_everyone_from(0, Blocked::AllReduce, false);
    failing_rank_wakes_everyone_from(0, Blocked::Barrier, true);
}

#[test]
fn explicit_abort_reaches_later_calls() {
    let results = run_threads(3, config(60.0), |comm| -> Result<(), CommError> {
        if comm.rank() == 1 {
            comm.abort("bad input on rank 1");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
        // A call made after the abort fails immediately, sends included.
        let err = comm.send_f64(0, 0, &[1.0]).expect_err("world is failed");
        assert_eq!(
            err,
            CommError::PeerFailed {
                rank: 1,
                message: "bad input on rank 1".into()
            }
        );
        Err(err)
    });
    assert!(results[1].is_ok());
    assert!(results[0].is_err() && results[2].is_err());
}

#[test]
fn timeout_fires_when_peer_never_sends() {
    let comms = thread_world(
        2,
        ThreadsConfig {
            timeout: Duration::from_millis(200),
            ..Default::default()
        },
    )
    .unwrap();
    let start = Instant::now();
    // Rank 1 exists (not dropped) but never sends.
    let err = comms[0].recv_f64(1, 0).expect_err("must time out");
    let elapsed = start.elapsed();
    match err {
        CommError::Timeout { op, peer, waited } => {
            assert_eq!(op, "recv");
            assert_eq!(peer, Some(1));
            assert!(waited >= Duration::from_millis(200));
        }
        other => panic!("expected timeout, got {other:?}"),
    }
    assert!(elapsed >= Duration::from_millis(200) && elapsed < Duration::from_secs(5));
    // All-reduce on rank 0 alone times out waiting for rank 1's contribution.
    let err = comms[0]
        .all_reduce_sum_f64(&mut [1.0])
        .expect_err("timeout");
    assert!(
        matches!(err, CommError::Timeout { peer: Some(1), .. }),
        "{err:?}"
    );
}

#[test]
fn finished_peer_is_reported_instead_of_waiting() {
    let start = Instant::now();
    let results = run_threads(2, config(60.0), |comm| {
        if comm.rank() == 1 {
            return Ok(());
        }
        comm.recv_f64(1, 0).map(|_| ())
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    let failure = results[0].as_ref().expect_err("rank 1 never sent");
    assert!(failure.message.contains("finished"), "{failure}");
}

#[test]
fn stats_count_traffic() {
    let results = run_threads(2, config(30.0), |comm| -> Result<_, CommError> {
        let rank = comm.rank();
        let other = 1 - rank;
        let before = comm.stats();
        let data = [0.0f64; 5];
        let own = [0.0f32; 3];
        comm.exchange_f64(&[(other, &data[..])], &[other], 0)?;
        comm.exchange_f32(&[(rank, &own[..])], &[rank], 0)?;
        comm.all_reduce_sum_f64(&mut [1.0, 2.0])?;
        comm.barrier()?;
        Ok(comm.stats().since(&before))
    });
    for stats in all_ok(results) {
        assert_eq!(stats.bytes_sent, 5 * 8);
        assert_eq!(stats.messages_sent, 1);
        assert_eq!(stats.bytes_received, 5 * 8);
        assert_eq!(stats.messages_received, 1);
        assert_eq!(stats.self_bytes, 3 * 4);
        assert_eq!(stats.all_reduces, 1);
        assert_eq!(stats.barriers, 1);
        assert_eq!(stats.collective_bytes, 2 * 8);
    }
}

#[test]
fn type_mismatch_and_invalid_peer_are_errors() {
    let results = run_threads(2, config(10.0), |comm| -> Result<_, CommError> {
        let bad_peer = comm.send_f64(5, 0, &[1.0]).expect_err("invalid");
        let other = 1 - comm.rank();
        comm.send_f32(other, 1, &[1.0])?;
        let mismatch = comm.recv_f64(other, 1).expect_err("type mismatch");
        Ok((bad_peer, mismatch))
    });
    for (bad_peer, mismatch) in all_ok(results) {
        assert_eq!(bad_peer, CommError::InvalidPeer { peer: 5, size: 2 });
        assert!(
            matches!(mismatch, CommError::TypeMismatch { .. }),
            "{mismatch:?}"
        );
    }
}

#[test]
fn boxed_communicators_work_on_own_threads() {
    let comms: Vec<Box<dyn Communicator>> = thread_world(3, config(30.0))
        .unwrap()
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn Communicator>)
        .collect();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|comm| {
            std::thread::spawn(move || {
                let mut v = [comm.rank() as f64 + 1.0];
                comm.all_reduce_sum_f64(&mut v).map(|()| v[0])
            })
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.join().unwrap().unwrap(), 6.0);
    }
}
