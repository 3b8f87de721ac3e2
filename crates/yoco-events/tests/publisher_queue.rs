//! The publisher never blocks the step loop: a full queue drops (and counts) batches, every batch
//! is either sent or dropped, and shutdown flushes what was queued.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use yoco_core::kv::{KvEvent, KvEventBatch};
use yoco_events::{Publisher, PublisherConfig};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn stored(i: u64) -> KvEvent {
    KvEvent::Stored {
        group: 0,
        parent: None,
        hashes: vec![i],
        token_ids: vec![1; 16],
        block_size: 16,
    }
}

#[test]
fn a_full_queue_drops_batches_without_blocking_and_counts_them() {
    let mut cfg = PublisherConfig::new(16);
    cfg.endpoint = format!("tcp://*:{}", free_port());
    cfg.max_queue_size = 1;
    let mut p = Publisher::start(cfg).unwrap();
    let n = 20_000u64;
    let t = Instant::now();
    for i in 0..n {
        p.publish(KvEventBatch::from_events(&[stored(i)]));
    }
    let per_call = t.elapsed() / n as u32;
    assert!(
        per_call < Duration::from_micros(50),
        "publish blocked: {per_call:?} per call"
    );
    p.shutdown(Duration::from_secs(5));
    let (sent, dropped) = (p.published(), p.dropped());
    assert!(
        dropped > 0,
        "a one-slot queue under a tight loop must overflow"
    );
    assert_eq!(
        sent + dropped,
        n,
        "every batch is sent or counted as dropped"
    );
}

#[test]
fn events_of_unpublished_groups_are_not_queued() {
    let mut cfg = PublisherConfig::new(16);
    cfg.endpoint = format!("tcp://*:{}", free_port());
    cfg.group = Some(1);
    let mut p = Publisher::start(cfg).unwrap();
    p.publish(KvEventBatch::from_events(&[stored(1)])); // group 0
    p.shutdown(Duration::from_secs(5));
    assert_eq!((p.published(), p.dropped()), (0, 0));
}

#[test]
fn a_connect_endpoint_is_not_bound() {
    // vLLM's rule: no wildcard, so the publisher connects (to an indexer that binds).
    assert!(yoco_events::publisher::binds("tcp://*:5557"));
    assert!(yoco_events::publisher::binds("ipc:///tmp/kv"));
    assert!(!yoco_events::publisher::binds("tcp://10.0.0.1:5557"));
}
