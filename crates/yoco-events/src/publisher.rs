//! The ZMQ publisher: a bounded queue the step loop feeds without blocking, drained by one thread
//! that converts, encodes and sends (`[topic, seq (8-byte big-endian), payload]` on a PUB socket)
//! and answers replay requests on a ROUTER socket from the last `buffer_steps` batches.
//!
//! The step loop pays one uncontended lock per step with events: it pushes the step's
//! [`KvEventBatch`] (flat buffers, swapped out of the core) and takes back an emptied batch the
//! publisher thread returned, so steady state allocates nothing. Conversion to the wire grain and
//! msgpack encoding run on the publisher thread, one `KVEventBatch` (one `seq`) per step, as vLLM.
//! When the queue is full the batch is dropped and counted, and the next batch that gets through
//! starts with `AllBlocksCleared` so that consumers forget what they may have missed (sound: they
//! under-estimate this engine's cache, never over-estimate it).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::runtime::Runtime;
use yoco_core::kv::KvEventBatch;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::config::PublisherConfig;
use crate::encode::encode_batch;
use crate::wire::{Regrain, WireEvent};

/// The `seq` frame that ends a replay (vLLM's `END_SEQ`, -1 as 8 big-endian bytes).
pub const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Why the publisher could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Grain(#[from] crate::wire::GrainError),
    #[error("kv-events: {0}")]
    Config(String),
    #[error("kv-events: cannot {what} {endpoint}: {source}")]
    Socket {
        what: &'static str,
        endpoint: String,
        source: zeromq::ZmqError,
    },
    #[error("kv-events: cannot start the publisher thread: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Counters of one publisher (all monotonic).
#[derive(Debug, Default)]
pub struct PublisherStats {
    /// Batches sent on the PUB socket.
    pub published: AtomicU64,
    /// Batches dropped because the queue was full (the step loop never waits).
    pub dropped: AtomicU64,
    /// Sends the socket refused.
    pub send_errors: AtomicU64,
}

struct Job {
    ts: f64,
    batch: KvEventBatch,
    /// Batches were dropped before this one: consumers must forget this engine's blocks first.
    resync: bool,
}

/// Emptied batches the publisher thread keeps for the step loop to reuse.
const SPARES: usize = 8;

/// What the step loop and the publisher thread share under one lock.
#[derive(Default)]
struct Shared {
    jobs: VecDeque<Job>,
    /// Emptied batches, handed back to the step loop by `publish`.
    spares: Vec<KvEventBatch>,
}

/// How often the publisher thread looks at the queue. Polling instead of a wake-up per batch keeps
/// the step thread's cost to one uncontended lock and push (no syscall); 1 ms of added latency is
/// nothing to a router.
const POLL: Duration = Duration::from_millis(1);

/// The queue between the step loop and the publisher thread (bounded by `max_queue_size`).
struct Queue {
    shared: Mutex<Shared>,
    capacity: usize,
    /// Set by `shutdown`: the drain task sends what is left and stops.
    closed: std::sync::atomic::AtomicBool,
    /// Set by the drain task once it has sent everything and closed the socket.
    finished: std::sync::atomic::AtomicBool,
}

/// A running publisher. Dropping it flushes the queue (bounded by a short timeout) and closes
/// the sockets.
pub struct Publisher {
    queue: Arc<Queue>,
    regrain: Regrain,
    stats: Arc<PublisherStats>,
    runtime: Option<Runtime>,
    /// A batch was dropped: the next one must start with `AllCleared`.
    resync: bool,
    endpoint: String,
}

/// vLLM's rule: bind when the endpoint names a wildcard or a local transport, connect otherwise (so
/// a central indexer can bind and engines connect to it).
pub fn binds(endpoint: &str) -> bool {
    ["*", "::", "ipc://", "inproc://"]
        .iter()
        .any(|p| endpoint.contains(p))
}

/// `tcp://*:5557` as the socket library spells a wildcard bind.
fn bind_address(endpoint: &str) -> String {
    endpoint.replace("tcp://*:", "tcp://0.0.0.0:")
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Publisher {
    /// Opens the sockets (errors such as an address in use are reported here) and starts the
    /// publisher thread.
    pub fn start(cfg: PublisherConfig) -> Result<Self, StartError> {
        cfg.validate().map_err(StartError::Config)?;
        let regrain = Regrain::new(cfg.sub_block_size, cfg.block_size, cfg.group)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("yoco-kv-events")
            .enable_all()
            .build()?;
        let (pub_socket, replay) = runtime.block_on(open_sockets(&cfg))?;
        let queue = Arc::new(Queue {
            shared: Mutex::new(Shared::default()),
            capacity: cfg.max_queue_size.max(1),
            closed: std::sync::atomic::AtomicBool::new(false),
            finished: std::sync::atomic::AtomicBool::new(false),
        });
        let stats = Arc::new(PublisherStats::default());
        let buffer = Arc::new(Mutex::new(VecDeque::with_capacity(
            cfg.buffer_steps.min(1 << 16),
        )));
        if let Some(router) = replay {
            runtime.spawn(serve_replay(router, buffer.clone()));
        }
        let endpoint = cfg.endpoint.clone();
        runtime.spawn(drain(
            queue.clone(),
            pub_socket,
            buffer,
            regrain.clone(),
            cfg,
            stats.clone(),
        ));
        Ok(Publisher {
            queue,
            regrain,
            stats,
            runtime: Some(runtime),
            resync: false,
            endpoint,
        })
    }

    /// Queues one step's events without blocking (dropped and counted when the queue is full) and
    /// returns an empty batch for the core to collect the next step's events into (one the
    /// publisher thread has finished with, when there is one).
    pub fn publish(&mut self, mut batch: KvEventBatch) -> KvEventBatch {
        if !batch.iter().any(|e| self.regrain.wants(&e))
            || self.queue.closed.load(Ordering::Relaxed)
        {
            batch.clear();
            return batch;
        }
        let mut shared = self.queue.shared.lock().unwrap_or_else(|p| p.into_inner());
        if shared.jobs.len() < self.queue.capacity {
            shared.jobs.push_back(Job {
                ts: now(),
                batch,
                resync: std::mem::take(&mut self.resync),
            });
            shared.spares.pop().unwrap_or_default()
        } else {
            drop(shared);
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            self.resync = true;
            batch.clear();
            batch
        }
    }

    pub fn stats(&self) -> &PublisherStats {
        &self.stats
    }

    /// Batches dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.stats.dropped.load(Ordering::Relaxed)
    }

    /// Batches sent.
    pub fn published(&self) -> u64 {
        self.stats.published.load(Ordering::Relaxed)
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends what is queued (waiting at most `timeout`), then closes the sockets.
    pub fn shutdown(&mut self, timeout: Duration) {
        self.queue.closed.store(true, Ordering::Relaxed); // the drain task ends once the queue is empty
        if let Some(rt) = self.runtime.take() {
            let deadline = std::time::Instant::now() + timeout;
            while !self.queue.finished.load(Ordering::Acquire)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            rt.shutdown_timeout(Duration::from_millis(100));
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(1));
    }
}

async fn open_sockets(
    cfg: &PublisherConfig,
) -> Result<(PubSocket, Option<RouterSocket>), StartError> {
    let mut pub_socket = PubSocket::new();
    let endpoint = cfg.endpoint.as_str();
    if binds(endpoint) {
        pub_socket
            .bind(&bind_address(endpoint))
            .await
            .map_err(|source| StartError::Socket {
                what: "bind",
                endpoint: endpoint.into(),
                source,
            })?;
    } else {
        pub_socket
            .connect(endpoint)
            .await
            .map_err(|source| StartError::Socket {
                what: "connect to",
                endpoint: endpoint.into(),
                source,
            })?;
    }
    let replay = match &cfg.replay_endpoint {
        Some(ep) => {
            let mut router = RouterSocket::new();
            router
                .bind(&bind_address(ep))
                .await
                .map_err(|source| StartError::Socket {
                    what: "bind",
                    endpoint: ep.clone(),
                    source,
                })?;
            Some(router)
        }
        None => None,
    };
    Ok((pub_socket, replay))
}

type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

async fn drain(
    queue: Arc<Queue>,
    mut socket: PubSocket,
    buffer: ReplayBuffer,
    regrain: Regrain,
    cfg: PublisherConfig,
    stats: Arc<PublisherStats>,
) {
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    let mut seq: u64 = 0;
    let mut wire: Vec<WireEvent> = Vec::new();
    let mut jobs: VecDeque<Job> = VecDeque::new();
    loop {
        std::mem::swap(
            &mut jobs,
            &mut queue.shared.lock().unwrap_or_else(|p| p.into_inner()).jobs,
        );
        if jobs.is_empty() {
            if queue.closed.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(POLL).await;
            continue;
        }
        for job in &jobs {
            wire.clear();
            if job.resync {
                wire.push(WireEvent::AllBlocksCleared);
            }
            for e in job.batch.iter() {
                regrain.convert(&e, &mut wire);
            }
            if wire.is_empty() {
                continue;
            }
            let payload = Bytes::from(encode_batch(
                job.ts,
                &wire,
                cfg.data_parallel_rank,
                cfg.encoding,
                &cfg.medium,
            ));
            let mut msg = ZmqMessage::from(topic.clone());
            msg.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
            msg.push_back(payload.clone());
            match socket.send(msg).await {
                Ok(()) => stats.published.fetch_add(1, Ordering::Relaxed),
                Err(_) => stats.send_errors.fetch_add(1, Ordering::Relaxed),
            };
            if cfg.buffer_steps > 0 {
                let mut buf = buffer.lock().unwrap_or_else(|p| p.into_inner());
                if buf.len() == cfg.buffer_steps {
                    buf.pop_front();
                }
                buf.push_back((seq, payload));
            }
            seq += 1;
        }
        // Hand the emptied batches back for the step loop to reuse.
        let mut shared = queue.shared.lock().unwrap_or_else(|p| p.into_inner());
        for mut job in jobs.drain(..) {
            if shared.spares.len() < SPARES {
                job.batch.clear();
                shared.spares.push(job.batch);
            }
        }
    }
    socket.close().await;
    queue.finished.store(true, Ordering::Release);
}

/// vLLM's replay protocol: a REQ (or DEALER) client sends its start `seq` as 8 big-endian bytes;
/// the reply is `[seq, payload]` for every buffered batch from there on, then `[END_SEQ, b""]`.
async fn serve_replay(mut router: RouterSocket, buffer: ReplayBuffer) {
    loop {
        let Ok(msg) = router.recv().await else {
            continue;
        };
        let frames: Vec<Bytes> = msg.into_vec();
        // [identity, b"", start] from REQ (or DEALER with a delimiter).
        let (id, start) = match frames.as_slice() {
            [id, empty, start] if empty.is_empty() && start.len() == 8 => {
                (id.clone(), start.clone())
            }
            _ => continue,
        };
        let start = u64::from_be_bytes(start[..].try_into().expect("8 bytes"));
        let batches: Vec<(u64, Bytes)> = {
            let buf = buffer.lock().unwrap_or_else(|p| p.into_inner());
            buf.iter().filter(|(s, _)| *s >= start).cloned().collect()
        };
        for (s, payload) in batches
            .into_iter()
            .map(|(s, p)| (Bytes::copy_from_slice(&s.to_be_bytes()), p))
            .chain(std::iter::once((
                Bytes::from_static(&END_SEQ),
                Bytes::new(),
            )))
        {
            let mut reply = ZmqMessage::from(id.clone());
            reply.push_back(Bytes::new());
            reply.push_back(s);
            reply.push_back(payload);
            if router.send(reply).await.is_err() {
                break;
            }
        }
    }
}
