//! The publisher's settings: vLLM's `--kv-events-config` keys plus the two this engine adds (the
//! event encoding and the wire block size), with vLLM's defaults.

use crate::encode::Encoding;

/// Settings of one [`crate::Publisher`].
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// PUB endpoint (`tcp://*:5557`); bound when it holds `*`, `::`, `ipc://` or `inproc://`,
    /// connected otherwise (vLLM's rule).
    pub endpoint: String,
    /// ROUTER endpoint answering replay requests (always bound); `None`: no replay.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay (vLLM: 10 000).
    pub buffer_steps: usize,
    /// Accepted for vLLM compatibility; the socket library bounds each subscriber's queue itself
    /// and drops for a slow subscriber, which is what a high-water mark does.
    pub hwm: usize,
    /// Batches waiting for the publisher thread before new ones are dropped (vLLM: 100 000).
    pub max_queue_size: usize,
    /// First frame of every message (vLLM: `""`; llm-d: `kv@<host>:<port>@<model>`).
    pub topic: String,
    /// Event layout inside the batch.
    pub encoding: Encoding,
    /// Tokens per wire block (default 16); must divide `sub_block_size`.
    pub block_size: u32,
    /// The engine's prefix-cache sub-block size (the grain of the core's events).
    pub sub_block_size: u32,
    /// Publish this KV group only, untagged (`Some`), or every group with `group_idx` (`None`).
    pub group: Option<u32>,
    /// `data_parallel_rank` in each batch (left out when `None`).
    pub data_parallel_rank: Option<i64>,
    /// Tier named in every event (`"GPU"`: the engine's device memory).
    pub medium: String,
}

impl PublisherConfig {
    /// vLLM's defaults for `sub_block_size`-token sub-blocks.
    pub fn new(sub_block_size: u32) -> Self {
        PublisherConfig {
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
            encoding: Encoding::Array,
            block_size: 16,
            sub_block_size,
            group: Some(0),
            data_parallel_rank: None,
            medium: "GPU".into(),
        }
    }

    /// Rejects settings the publisher cannot honour, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_queue_size == 0 {
            return Err("max_queue_size must be >= 1".into());
        }
        if self.endpoint.starts_with("inproc://") {
            return Err(format!(
                "endpoint {:?}: inproc:// reaches only threads of the same process; use tcp:// or ipc://",
                self.endpoint
            ));
        }
        for ep in std::iter::once(&self.endpoint).chain(self.replay_endpoint.iter()) {
            if !(ep.starts_with("tcp://") || ep.starts_with("ipc://")) {
                return Err(format!("endpoint {ep:?} must start with tcp:// or ipc://"));
            }
        }
        Ok(())
    }
}
