//! For unit tests: the ranks of one group, each built on its own thread of
//! this process (over TCP on loopback).

use burn_ddp_comm::ProcessGroup;
use std::thread;

/// The `n` ranks of a fresh group, in rank order.
pub(crate) fn ranks(n: usize) -> Vec<ProcessGroup> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let job = format!("unit-{}-{port}", std::process::id());
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let job = job.clone();
            thread::spawn(move || {
                ProcessGroup::builder(rank, n)
                    .master("127.0.0.1", port)
                    .local(rank, n)
                    .job(job, None)
                    .build()
                    .unwrap()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}
