//! Publishes KV events on vLLM's ZMQ wire: a PUB socket for the live stream and a ROUTER
//! socket answering replay requests from a ring buffer of recent batches.
//!
//! Endpoint rules follow vLLM's `--kv-events-config`: the PUB socket binds when the endpoint
//! contains `*` or `::` (`*` is replaced by the worker's host, since the ZMQ implementation
//! does not treat it as a wildcard), and connects otherwise; the replay socket always binds.
//! Sequence numbers start at 0 per publisher and grow by one per batch.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::engine::KvEvent;
use crate::faults::Faults;
use crate::wire::{END_SEQ, WireFormat, encode_batch};

/// Where and how to publish.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// PUB endpoint as configured (`tcp://*:5557`).
    pub endpoint: String,
    /// ROUTER endpoint for replay, if any.
    pub replay_endpoint: Option<String>,
    /// Topic frame.
    pub topic: String,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// Event encoding.
    pub format: WireFormat,
    /// Host that replaces `*` in endpoints.
    pub host: String,
    /// Data-parallel rank written into every batch.
    pub dp_rank: u32,
}

/// What the engine loop sends to the publisher.
#[derive(Debug)]
pub enum PublisherCommand {
    /// One step's events.
    Batch(Vec<KvEvent>),
    /// An engine restart: sequence back to 0, replay buffer emptied, then this batch
    /// (normally `AllBlocksCleared`) is published as seq 0.
    Restart(Vec<KvEvent>),
}

/// Why the publisher could not start.
#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    /// A socket could not bind or connect.
    #[error("kv events endpoint {endpoint}: {source}")]
    Socket {
        /// Endpoint.
        endpoint: String,
        /// Cause.
        #[source]
        source: zeromq::ZmqError,
    },
}

type Ring = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// Replaces vLLM's `*` wildcard by a concrete host.
pub fn concrete_endpoint(endpoint: &str, host: &str) -> String {
    endpoint.replace('*', host)
}

/// Whether vLLM would bind (rather than connect) the PUB socket for `endpoint`.
pub fn binds(endpoint: &str) -> bool {
    endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
}

/// Started sockets; run them with [`Publisher::run`].
pub struct Publisher {
    cfg: PublisherConfig,
    pub_socket: PubSocket,
    router: Option<RouterSocket>,
    /// Actual bound PUB endpoint (useful with port 0).
    pub bound: String,
    /// Actual bound replay endpoint.
    pub replay_bound: Option<String>,
}

impl Publisher {
    /// Binds or connects the sockets.
    pub async fn start(cfg: PublisherConfig) -> Result<Publisher, PublisherError> {
        let err = |endpoint: &str| {
            let endpoint = endpoint.to_owned();
            move |source| PublisherError::Socket { endpoint, source }
        };
        let endpoint = concrete_endpoint(&cfg.endpoint, &cfg.host);
        let mut pub_socket = PubSocket::new();
        let bound = if binds(&cfg.endpoint) {
            pub_socket.bind(&endpoint).await.map_err(err(&endpoint))?.to_string()
        } else {
            pub_socket.connect(&endpoint).await.map_err(err(&endpoint))?;
            endpoint.clone()
        };
        let (router, replay_bound) = match &cfg.replay_endpoint {
            Some(r) => {
                let r = concrete_endpoint(r, &cfg.host);
                let mut router = RouterSocket::new();
                let b = router.bind(&r).await.map_err(err(&r))?.to_string();
                (Some(router), Some(b))
            }
            None => (None, None),
        };
        Ok(Publisher { cfg, pub_socket, router, bound, replay_bound })
    }

    /// Publishes batches from `rx` until it closes or `shutdown` fires; answers replay
    /// requests meanwhile.
    pub async fn run(
        self,
        mut rx: mpsc::UnboundedReceiver<PublisherCommand>,
        faults: Arc<Faults>,
        shutdown: CancellationToken,
    ) {
        let Publisher { cfg, mut pub_socket, router, .. } = self;
        let ring: Ring = Arc::new(Mutex::new(VecDeque::new()));
        let replay = router.map(|r| tokio::spawn(serve_replay(r, ring.clone(), cfg.clone(), shutdown.clone())));
        let topic = Bytes::from(cfg.topic.clone().into_bytes());
        let mut seq: u64 = 0;
        loop {
            let cmd = tokio::select! {
                c = rx.recv() => c,
                () = shutdown.cancelled() => None,
            };
            let Some(cmd) = cmd else { break };
            let events = match cmd {
                PublisherCommand::Batch(e) => e,
                PublisherCommand::Restart(e) => {
                    seq = 0;
                    if let Ok(mut r) = ring.lock() {
                        r.clear();
                    }
                    e
                }
            };
            let ts = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
            let payload = Bytes::from(encode_batch(ts, &events, cfg.dp_rank, cfg.format));
            let this = seq;
            seq += 1;
            if faults.take_lose() {
                continue;
            }
            if let Ok(mut r) = ring.lock() {
                r.push_back((this, payload.clone()));
                while r.len() > cfg.buffer_steps.max(1) {
                    r.pop_front();
                }
            }
            if faults.take_drop() {
                continue;
            }
            let copies = if faults.take_duplicate() { 2 } else { 1 };
            for _ in 0..copies {
                let frames = vec![topic.clone(), Bytes::copy_from_slice(&this.to_be_bytes()), payload.clone()];
                if let Ok(msg) = ZmqMessage::try_from(frames) {
                    // No subscriber yet is not an error for a PUB socket.
                    let _ = pub_socket.send(msg).await;
                }
            }
        }
        if let Some(h) = replay {
            h.abort();
        }
    }
}

async fn serve_replay(mut router: RouterSocket, ring: Ring, cfg: PublisherConfig, shutdown: CancellationToken) {
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    loop {
        let msg = tokio::select! {
            m = router.recv() => m,
            () = shutdown.cancelled() => return,
        };
        let Ok(msg) = msg else { continue };
        let frames = msg.into_vec();
        // [identity, "", start_seq (8 bytes)]; anything else is ignored, as vLLM does.
        if frames.len() != 3 || !frames[1].is_empty() || frames[2].len() != 8 {
            continue;
        }
        let identity = frames[0].clone();
        let mut start = [0u8; 8];
        start.copy_from_slice(&frames[2]);
        let start = u64::from_be_bytes(start);
        let batches: Vec<(u64, Bytes)> =
            ring.lock().map(|r| r.iter().filter(|(s, _)| *s >= start).cloned().collect()).unwrap_or_default();
        // Current vLLM puts the topic before the seq (an empty one on the end marker).
        let reply = |seq: u64, payload: Bytes| {
            let mut f = vec![identity.clone(), Bytes::new()];
            if cfg.format == WireFormat::Current {
                f.push(if seq == END_SEQ { Bytes::new() } else { topic.clone() });
            }
            f.push(Bytes::copy_from_slice(&seq.to_be_bytes()));
            f.push(payload);
            ZmqMessage::try_from(f)
        };
        for (s, p) in batches {
            if let Ok(m) = reply(s, p)
                && router.send(m).await.is_err()
            {
                break;
            }
        }
        if let Ok(m) = reply(END_SEQ, Bytes::new()) {
            let _ = router.send(m).await;
        }
    }
}
