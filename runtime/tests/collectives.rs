//! Shared-memory collectives of the CPU backend: results, ordering and abort.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tessel_runtime::backend::cpu::{CpuBackend, CpuTensor};
use tessel_runtime::backend::shared_memory::World;
use tessel_runtime::backend::Backend;
use tessel_runtime::mesh::{GroupKind, Mesh};
use tessel_runtime::RuntimeError;

fn world(dp: u64, tp: u64) -> Arc<World> {
    World::new(Mesh {
        dp,
        tp,
        pp: 1,
        cp: 1,
        ep: 1,
    })
}

/// Runs `f` on every rank of a `dp×tp` world, one thread each.
fn on_ranks<R: Send>(dp: u64, tp: u64, f: impl Fn(&CpuBackend, usize) -> R + Sync) -> Vec<R> {
    let w = world(dp, tp);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..(dp * tp) as usize)
            .map(|rank| {
                let w = w.clone();
                let f = &f;
                s.spawn(move || f(&CpuBackend::new(w, rank), rank))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn t(values: &[f32], rows: usize) -> CpuTensor {
    CpuTensor {
        rows,
        cols: values.len() / rows,
        data: values.to_vec(),
    }
}

#[test]
fn reductions_and_gathers() {
    let out = on_ranks(2, 2, |b, rank| {
        let mine = t(&[rank as f32, 10.0 * rank as f32], 2);
        let sum = b.all_reduce(GroupKind::World, &mine).unwrap();
        let tp_gather = b.all_gather(GroupKind::Tensor, &mine).unwrap();
        let dp_scatter = b.reduce_scatter(GroupKind::Data, &mine).unwrap();
        let bcast = b.broadcast(GroupKind::World, &mine, 3).unwrap();
        b.barrier(GroupKind::World).unwrap();
        (sum.data, tp_gather.data, dp_scatter.data, bcast.data)
    });
    for (rank, (sum, gather, scatter, bcast)) in out.into_iter().enumerate() {
        assert_eq!(sum, vec![6.0, 60.0]);
        let base = (rank / 2 * 2) as f32;
        assert_eq!(
            gather,
            vec![base, 10.0 * base, base + 1.0, 10.0 * (base + 1.0)]
        );
        // Data group of rank r: {r mod 2, r mod 2 + 2}; member i keeps row i of the sum.
        let tp = (rank % 2) as f32;
        let total = [tp + tp + 2.0, 10.0 * (tp + tp + 2.0)];
        assert_eq!(scatter, vec![total[rank / 2]]);
        assert_eq!(bcast, vec![3.0, 30.0]);
    }
}

#[test]
fn all_to_all_and_point_to_point() {
    let out = on_ranks(3, 1, |b, rank| {
        let parts = (0..3).map(|j| t(&[(10 * rank + j) as f32], 1)).collect();
        let got = b.all_to_all(GroupKind::World, parts).unwrap();
        b.send((rank + 1) % 3, 7, &t(&[rank as f32], 1)).unwrap();
        b.send((rank + 1) % 3, 8, &t(&[100.0 + rank as f32], 1))
            .unwrap();
        // Receive the later tag first: matching is by tag, not arrival order.
        let later = b.recv((rank + 2) % 3, 8).unwrap();
        let first = b.recv((rank + 2) % 3, 7).unwrap();
        (
            got.iter().map(|x| x.data[0]).collect::<Vec<_>>(),
            first.data[0],
            later.data[0],
        )
    });
    for (rank, (got, first, later)) in out.into_iter().enumerate() {
        let r = rank as f32;
        assert_eq!(got, vec![r, 10.0 + r, 20.0 + r]);
        let prev = ((rank + 2) % 3) as f32;
        assert_eq!((first, later), (prev, 100.0 + prev));
    }
}

#[test]
fn sums_are_bit_identical_on_every_member() {
    let out = on_ranks(4, 1, |b, rank| {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 7 + rank * 13) as f32).sin() * 1e3)
            .collect();
        b.all_reduce(GroupKind::World, &t(&x, 1)).unwrap().data
    });
    assert!(out.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn an_abort_releases_waiting_ranks() {
    let w = world(2, 1);
    let waiting = {
        let w = w.clone();
        std::thread::spawn(move || {
            let b = CpuBackend::new(w, 0);
            let start = Instant::now();
            let r = b.all_reduce(GroupKind::World, &t(&[1.0], 1));
            let r2 = b.recv(1, 3);
            (r, r2, start.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    w.abort();
    let (r, r2, elapsed) = waiting.join().unwrap();
    assert_eq!(r.unwrap_err(), RuntimeError::Aborted);
    assert_eq!(r2.unwrap_err(), RuntimeError::Aborted);
    assert!(elapsed < Duration::from_secs(2));
}
