//! One task per worker keeps the KV index in step with the engine's ZMQ event stream.
//!
//! Transport: a `SubSocket` rebuilt by a small supervisor whenever the monitor reports a
//! disconnect (the ZMQ implementation's own reconnect backs off for up to 30 s, far too slow
//! for routing), and a fresh `DealerSocket` per replay request (a dealer never reconnects).
//! Every connect and receive has a timeout.
//!
//! Ordering (pure, see [`SeqTracker`]): batches must apply in sequence. A gap is filled by
//! replay; when replay cannot fill it, the worker's entries are cleared and the index
//! resynchronises from the live stream (better a cold view than a poisoned one). A sequence
//! that goes back to 0 — or below the last one after a reconnect — is an engine restart: the
//! worker's entries are cleared before applying. Duplicates are dropped.
//!
//! Size limits: the ZMQ implementation (`zeromq` 0.7.0) trusts a frame's announced length —
//! its decoder calls `BytesMut::reserve(len + 64 KiB)` as soon as it has read a frame header
//! (`src/codec/zmq_codec.rs`, `Decoder::decode`, lines 79–85 and 110–127: a 2^40-byte header
//! aborts the process on allocation failure), and it offers neither a message-size option
//! (`SocketOptions::read_buffer` "is not a message-size or memory limit") nor a way to plug in
//! a custom transport or codec (`transport::connect` is crate-private). So every socket here connects through a
//! [`guard`]: a relay on a loopback port, dialled to the worker *before* the socket connects,
//! that reads the worker's byte stream with a [`FrameScanner`] and closes both sides the
//! moment a header announces a message over [`SubscriberSpec::max_message_bytes`]. Invariant:
//! no byte of an over-limit frame header reaches the ZMQ decoder, so it never reserves more
//! than the cap plus one read chunk per connection. The relay is transparent otherwise (the
//! ZMQ library still does the handshake), so interoperability with libzmq peers is unchanged.
//! A refused connection counts as a decode error and is rebuilt like any disconnect. Replay
//! replies are additionally bounded in count (strictly increasing sequences inside the gap)
//! and in total bytes ([`MAX_REPLAY_BYTES`]). The SUB and DEALER sockets decode only when
//! `recv` polls them (no internal message queue), so a connection holds at most one message
//! in flight: about the cap plus one read chunk.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dynamo_kv_router::protocols::{KvCacheEventData, RouterEvent, WorkerId, WorkerWithDpRank};
use dynamo_kv_router::zmq_wire::{ZmqEventNormalizer, decode_event_batch};
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use zeromq::{
    DealerSocket, Endpoint, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage,
};

use crate::index::KvIndex;

/// Connect attempts give up after this long (and are retried).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Replay requests give up after this long without a reply.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Upper bound of the reconnect backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Replay end-marker sequence.
const END_SEQ: u64 = u64::MAX;
/// Default cap on one ZMQ message (all frames) from a worker. vLLM batches are a few KiB to
/// a few MiB (a 128k-token prefill announces ~8k blocks); anything near this is broken or
/// hostile.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 16 << 20;
/// Bookkeeping each frame costs the ZMQ library beyond its payload, counted against the cap so
/// that a flood of empty frames in one multipart message is bounded too.
pub const FRAME_OVERHEAD_BYTES: u64 = 64;
/// Most payload bytes one replay keeps in memory (at least one maximal message). vLLM's
/// default replay buffer (10 000 steps of a few KiB) fits; beyond it the gap is not
/// replayable and the worker resynchronises from the live stream.
pub const MAX_REPLAY_BYTES: u64 = 256 << 20;
/// Length of the ZMTP 3 greeting, which precedes the first frame.
const ZMTP_GREETING_LEN: u8 = 64;
/// Read size of the guard relay.
const RELAY_CHUNK: usize = 64 * 1024;

/// What to do with an arriving batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqAction {
    /// In order: apply it.
    Apply,
    /// Already seen: drop it.
    Stale,
    /// Batches `[from, to)` are missing: replay them first.
    Replay {
        /// First missing seq.
        from: u64,
        /// The arriving seq.
        to: u64,
    },
    /// The engine restarted: clear the worker, then apply.
    Restart,
}

/// Sequence bookkeeping of one worker's stream.
#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    last: Option<u64>,
    reconnected: bool,
}

impl SeqTracker {
    /// Classifies an arriving sequence number.
    pub fn classify(&self, seq: u64) -> SeqAction {
        match self.last {
            None if seq == 0 => SeqAction::Apply,
            None => SeqAction::Replay { from: 0, to: seq },
            Some(l) if seq == l.wrapping_add(1) => SeqAction::Apply,
            Some(l) if seq > l => SeqAction::Replay { from: l + 1, to: seq },
            Some(_) if seq == 0 || self.reconnected => SeqAction::Restart,
            Some(_) => SeqAction::Stale,
        }
    }

    /// Records that `seq` was applied.
    pub fn applied(&mut self, seq: u64) {
        self.last = Some(seq);
        self.reconnected = false;
    }

    /// Marks a new connection: a lower sequence now means a restart, not a duplicate.
    pub fn reconnect(&mut self) {
        if self.last.is_some() {
            self.reconnected = true;
        }
    }

    /// The last applied sequence.
    pub fn last(&self) -> Option<u64> {
        self.last
    }
}

/// Counters of one worker's stream (read by metrics and the debug endpoints).
#[derive(Debug, Default)]
pub struct KvStats {
    /// Batches applied.
    pub batches: AtomicU64,
    /// Gaps detected.
    pub gaps: AtomicU64,
    /// Gaps filled by replay.
    pub replays: AtomicU64,
    /// Subscriptions that joined a stream mid-way (a new or restarted spoke) and caught up
    /// on the engine's history from its replay buffer.
    pub catch_ups: AtomicU64,
    /// Resynchronisations (worker cleared).
    pub resyncs: AtomicU64,
    /// Engine restarts detected.
    pub restarts: AtomicU64,
    /// Batches that failed to decode.
    pub decode_errors: AtomicU64,
    /// Duplicates dropped.
    pub duplicates: AtomicU64,
    /// Last applied sequence + 1 (0 = none yet).
    pub next_seq: AtomicU64,
    /// Unix milliseconds of the last applied batch.
    pub last_batch_unix_ms: AtomicU64,
    /// Blocks stored minus removed (approximate index size for this worker).
    pub blocks: AtomicU64,
    /// Payload bytes of the batches applied (what the engine's events cost on the wire).
    pub bytes: AtomicU64,
}

/// Where and how to subscribe.
#[derive(Debug, Clone)]
pub struct SubscriberSpec {
    /// Index id of the worker.
    pub worker_id: WorkerId,
    /// PUB endpoint.
    pub endpoint: String,
    /// Replay endpoint.
    pub replay: Option<String>,
    /// Topic prefix.
    pub topic: String,
    /// Largest message (frames plus [`FRAME_OVERHEAD_BYTES`] each) accepted from the worker;
    /// a larger one drops the connection. Normally [`DEFAULT_MAX_MESSAGE_BYTES`].
    pub max_message_bytes: u64,
}

/// A message announced larger than the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("peer announced a {kind} of {announced} bytes; the cap is {cap} bytes")]
pub struct Oversized {
    /// `"message"` or `"command"`.
    pub kind: &'static str,
    /// Size so far including the announced frame (saturating).
    pub announced: u64,
    /// The cap.
    pub cap: u64,
}

/// Follows the ZMTP 3 framing of the byte stream a peer sends and checks each frame header
/// against the cap before the frame's body arrives.
///
/// It needs no buffering: a header is at most 9 bytes, kept in the state. It does not
/// validate anything else; the ZMQ library still parses the stream it is relayed.
#[derive(Debug, Clone)]
pub struct FrameScanner {
    cap: u64,
    state: Scan,
    /// Size of the multipart message whose frames are arriving.
    message: u64,
}

#[derive(Debug, Clone, Copy)]
enum Scan {
    Greeting { left: u8 },
    Flags,
    Length { flags: u8, have: u8, bytes: [u8; 8] },
    Body { left: u64 },
    Refused(Oversized),
}

const FLAG_MORE: u8 = 0b001;
const FLAG_LONG: u8 = 0b010;
const FLAG_COMMAND: u8 = 0b100;

impl FrameScanner {
    /// A scanner at the start of a connection (before the peer's greeting).
    pub fn new(cap: u64) -> FrameScanner {
        FrameScanner { cap, state: Scan::Greeting { left: ZMTP_GREETING_LEN }, message: 0 }
    }

    /// Consumes the next bytes of the stream. Once a header is refused, every later call
    /// fails too: the stream cannot be resynchronised.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), Oversized> {
        while !data.is_empty() {
            match &mut self.state {
                Scan::Refused(e) => return Err(*e),
                Scan::Greeting { left } => {
                    let n = usize::from(*left).min(data.len());
                    data = &data[n..];
                    *left -= n as u8;
                    if *left == 0 {
                        self.state = Scan::Flags;
                    }
                }
                Scan::Flags => {
                    self.state = Scan::Length { flags: data[0], have: 0, bytes: [0; 8] };
                    data = &data[1..];
                }
                Scan::Length { flags, have, bytes } => {
                    let need: u8 = if *flags & FLAG_LONG != 0 { 8 } else { 1 };
                    let n = usize::from(need - *have).min(data.len());
                    bytes[usize::from(*have)..usize::from(*have) + n].copy_from_slice(&data[..n]);
                    *have += n as u8;
                    data = &data[n..];
                    if *have == need {
                        let len = if need == 8 { u64::from_be_bytes(*bytes) } else { u64::from(bytes[0]) };
                        let flags = *flags;
                        if let Err(e) = self.check(flags, len) {
                            self.state = Scan::Refused(e);
                            return Err(e);
                        }
                        self.state = if len == 0 { Scan::Flags } else { Scan::Body { left: len } };
                    }
                }
                Scan::Body { left } => {
                    let n = (*left).min(data.len() as u64);
                    data = &data[n as usize..];
                    *left -= n;
                    if *left == 0 {
                        self.state = Scan::Flags;
                    }
                }
            }
        }
        match self.state {
            Scan::Refused(e) => Err(e),
            _ => Ok(()),
        }
    }

    fn check(&mut self, flags: u8, len: u64) -> Result<(), Oversized> {
        if flags & FLAG_COMMAND != 0 {
            // Commands (handshake, heartbeats) stand alone, outside any multipart message.
            let announced = len.saturating_add(FRAME_OVERHEAD_BYTES);
            return if announced > self.cap {
                Err(Oversized { kind: "command", announced, cap: self.cap })
            } else {
                Ok(())
            };
        }
        self.message = self.message.saturating_add(len).saturating_add(FRAME_OVERHEAD_BYTES);
        if self.message > self.cap {
            return Err(Oversized { kind: "message", announced: self.message, cap: self.cap });
        }
        if flags & FLAG_MORE == 0 {
            self.message = 0;
        }
        Ok(())
    }
}

/// Why a guard could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The endpoint is not a ZMQ endpoint this relay can dial.
    #[error("unsupported kv events endpoint `{endpoint}`")]
    Endpoint {
        /// The endpoint.
        endpoint: String,
    },
    /// The worker could not be reached.
    #[error("connecting to {endpoint}: {source}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// No loopback port could be bound for the relay.
    #[error("binding the loopback relay: {0}")]
    Bind(#[source] io::Error),
}

/// A relay in front of one worker connection; dropping it closes both sides.
#[derive(Debug)]
pub struct Guard {
    /// Loopback endpoint the ZMQ socket connects to instead of the worker's.
    pub endpoint: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

trait Duplex: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Duplex for T {}

async fn dial(endpoint: &str) -> Result<Box<dyn Duplex>, GuardError> {
    let connect = |source| GuardError::Connect { endpoint: endpoint.to_owned(), source };
    let timed_out = || connect(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"));
    match endpoint.parse::<Endpoint>() {
        Ok(Endpoint::Tcp(host, port)) => {
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host.to_string(), port)))
                .await
                .map_err(|_| timed_out())?
                .map_err(connect)?;
            // As the ZMQ library does: batches are small and latency matters.
            stream.set_nodelay(true).map_err(connect)?;
            Ok(Box::new(stream))
        }
        #[cfg(unix)]
        Ok(Endpoint::Ipc(Some(path))) => {
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::UnixStream::connect(path))
                .await
                .map_err(|_| timed_out())?
                .map_err(connect)?;
            Ok(Box::new(stream))
        }
        _ => Err(GuardError::Endpoint { endpoint: endpoint.to_owned() }),
    }
}

/// Dials `upstream` and returns a loopback endpoint relaying to it, whose worker-to-spoke
/// direction is checked by a [`FrameScanner`] with cap `max_message_bytes`. A refused stream
/// is counted in `stats.decode_errors`.
///
/// The loopback listener accepts one connection (within the connect timeout) and closes:
/// the ZMQ socket's own reconnects then fail fast, and the caller rebuilds socket and guard.
pub async fn guard(
    upstream: &str,
    max_message_bytes: u64,
    stats: Arc<KvStats>,
    worker_id: WorkerId,
) -> Result<Guard, GuardError> {
    let worker = dial(upstream).await?;
    let listener = match TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await {
        Ok(l) => l,
        // IPv6-only pods have no 127.0.0.1.
        Err(_) => TcpListener::bind(SocketAddr::from((Ipv6Addr::LOCALHOST, 0))).await.map_err(GuardError::Bind)?,
    };
    let local = listener.local_addr().map_err(GuardError::Bind)?;
    let task = tokio::spawn(async move {
        let accepted = tokio::time::timeout(CONNECT_TIMEOUT * 2, listener.accept()).await;
        drop(listener);
        let Ok(Ok((spoke, _))) = accepted else { return };
        let _ = spoke.set_nodelay(true);
        if let Err(refused) = relay(spoke, worker, FrameScanner::new(max_message_bytes)).await {
            stats.decode_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(worker = worker_id, error = %refused, "kv event stream refused; reconnecting");
        }
    });
    Ok(Guard { endpoint: format!("tcp://{local}"), task })
}

/// Copies bytes both ways until either side closes; the worker's bytes pass the scanner
/// before they are forwarded. Returns the refusal if the scanner refused the stream.
async fn relay(spoke: TcpStream, worker: Box<dyn Duplex>, mut scanner: FrameScanner) -> Result<(), Oversized> {
    let (mut spoke_rx, mut spoke_tx) = spoke.into_split();
    let (mut worker_rx, mut worker_tx) = tokio::io::split(worker);
    let outbound = tokio::io::copy(&mut spoke_rx, &mut worker_tx);
    let inbound = async {
        let mut buf = vec![0u8; RELAY_CHUNK];
        loop {
            let n = match worker_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return Ok(()),
                Ok(n) => n,
            };
            // Checked before forwarding: the refused header never reaches the ZMQ decoder.
            scanner.feed(&buf[..n])?;
            if spoke_tx.write_all(&buf[..n]).await.is_err() {
                return Ok(());
            }
        }
    };
    // Whichever direction ends first ends both: dropping the halves closes the sockets, which
    // the ZMQ socket's monitor reports as a disconnect.
    tokio::select! {
        _ = outbound => Ok(()),
        r = inbound => r,
    }
}

/// One batch payload, decoded and normalised into index events.
#[derive(Debug)]
pub struct DecodedBatch {
    /// Events for the index, in wire order (the normaliser drops some: non-GPU tiers,
    /// remote blocks, ignored kinds).
    pub events: Vec<RouterEvent>,
    /// Events on the wire, including dropped ones (each took an event id).
    pub raw_events: usize,
}

/// A batch payload that is not a vLLM KV-event batch.
#[derive(Debug, thiserror::Error)]
#[error("undecodable kv event batch: {reason}")]
pub struct BatchDecodeError {
    /// The msgpack decoder's explanation.
    pub reason: String,
}

/// Decodes one batch payload of `worker_id`. Each wire event takes the next id after
/// `*last_event_id`, which is advanced even for events the normaliser drops. Total on any
/// input: errors, never panics; memory is bounded by the payload (the msgpack decoder
/// borrows from it and caps pre-allocation).
pub fn decode_batch(
    normalizer: &mut ZmqEventNormalizer,
    worker_id: WorkerId,
    last_event_id: &mut u64,
    payload: &[u8],
) -> Result<DecodedBatch, BatchDecodeError> {
    let batch = match crate::kv_wire::decode(payload) {
        Some(batch) => batch,
        None => decode_event_batch(payload).map_err(|e| BatchDecodeError { reason: e.to_string() })?,
    };
    let worker = WorkerWithDpRank::new(worker_id, batch.data_parallel_rank.unwrap_or(0).max(0) as u32);
    let raw_events = batch.events.len();
    let mut events = Vec::with_capacity(raw_events);
    for raw in batch.events {
        *last_event_id += 1;
        if let Some(event) = normalizer.normalize(raw, *last_event_id, worker).and_then(|p| p.into_router_event()) {
            events.push(event);
        }
    }
    Ok(DecodedBatch { events, raw_events })
}

/// Applies one worker's batches to the index, in order: decode, normalise, count, apply.
/// The subscriber's own path; public so that the ingest benchmark times exactly it.
pub struct Applier {
    spec: SubscriberSpec,
    index: Arc<KvIndex>,
    normalizer: ZmqEventNormalizer,
    stats: Arc<KvStats>,
    tracker: SeqTracker,
    event_id: u64,
}

impl Applier {
    /// An applier for the worker `spec` describes, writing into `index` and `stats`.
    pub fn new(spec: SubscriberSpec, index: Arc<KvIndex>, stats: Arc<KvStats>) -> Applier {
        let block_size = index.block_size();
        Applier {
            spec,
            index,
            normalizer: ZmqEventNormalizer::new(block_size),
            stats,
            tracker: SeqTracker::default(),
            event_id: 0,
        }
    }

    fn clear(&mut self) {
        self.event_id += 1;
        self.index.clear_worker(self.spec.worker_id, self.event_id);
        self.stats.blocks.store(0, Ordering::Relaxed);
        self.stats.resyncs.fetch_add(1, Ordering::Relaxed);
    }

    /// Decodes and applies one batch; false if it could not be decoded.
    pub fn apply(&mut self, seq: u64, payload: &[u8]) -> bool {
        let batch = match decode_batch(&mut self.normalizer, self.spec.worker_id, &mut self.event_id, payload) {
            Ok(b) => b,
            Err(e) => {
                self.stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(worker = self.spec.worker_id, seq, error = %e, "undecodable kv event batch");
                return false;
            }
        };
        for event in batch.events {
            match &event.event.data {
                KvCacheEventData::Stored(s) => {
                    self.stats.blocks.fetch_add(s.blocks.len() as u64, Ordering::Relaxed);
                }
                KvCacheEventData::Removed(r) => {
                    let n = r.block_hashes.len() as u64;
                    let _ = self
                        .stats
                        .blocks
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some(b.saturating_sub(n)));
                }
                KvCacheEventData::Cleared => self.stats.blocks.store(0, Ordering::Relaxed),
            }
            self.index.apply(event);
        }
        self.tracker.applied(seq);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(payload.len() as u64, Ordering::Relaxed);
        self.stats.next_seq.store(seq.saturating_add(1), Ordering::Relaxed);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.stats.last_batch_unix_ms.store(now_ms, Ordering::Relaxed);
        true
    }

    async fn on_batch(&mut self, seq: u64, payload: Bytes) {
        match self.tracker.classify(seq) {
            SeqAction::Apply => {
                if !self.apply(seq, &payload) {
                    self.clear();
                }
            }
            SeqAction::Stale => {
                self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            SeqAction::Restart => {
                self.stats.restarts.fetch_add(1, Ordering::Relaxed);
                tracing::info!(worker = self.spec.worker_id, seq, "engine restart detected; resynchronising");
                self.clear();
                self.tracker = SeqTracker::default();
                if seq == 0 {
                    self.apply(seq, &payload);
                } else {
                    Box::pin(self.on_batch(seq, payload)).await;
                }
            }
            SeqAction::Replay { from, to } => {
                let fresh = self.tracker.last().is_none();
                if !fresh {
                    self.stats.gaps.fetch_add(1, Ordering::Relaxed);
                }
                let replayed = match &self.spec.replay {
                    Some(r) => replay(r, from, to, self.spec.max_message_bytes, &self.stats, self.spec.worker_id).await,
                    None => Vec::new(),
                };
                let complete =
                    replayed.len() as u64 == to - from && replayed.iter().zip(from..).all(|((s, _), want)| *s == want);
                if complete {
                    let counter = if fresh { &self.stats.catch_ups } else { &self.stats.replays };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let mut ok = true;
                    for (s, p) in replayed {
                        ok &= self.apply(s, &p);
                    }
                    if !ok {
                        self.clear();
                    }
                } else {
                    // Unrecoverable: start over from what the engine announces from now on,
                    // plus whatever of the replay buffer is contiguous with it.
                    tracing::info!(
                        worker = self.spec.worker_id,
                        from,
                        to,
                        got = replayed.len(),
                        "kv event gap not replayable; resynchronising"
                    );
                    self.clear();
                    let tail_start = to
                        - replayed.iter().rev().zip((from..to).rev()).take_while(|((s, _), want)| s == want).count()
                            as u64;
                    for (s, p) in replayed.into_iter().filter(|(s, _)| *s >= tail_start) {
                        self.apply(s, &p);
                    }
                }
                self.tracker.applied(to.saturating_sub(1));
                if !self.apply(to, &payload) {
                    self.clear();
                }
            }
        }
    }
}

/// Requests batches `[from, to)` from a replay ROUTER; returns what arrived, in strictly
/// increasing order, at most [`MAX_REPLAY_BYTES`] of payload (or one maximal message).
/// Messages over `max_message_bytes` drop the connection (counted in `stats`).
pub async fn replay(
    endpoint: &str,
    from: u64,
    to: u64,
    max_message_bytes: u64,
    stats: &Arc<KvStats>,
    worker_id: WorkerId,
) -> Vec<(u64, Bytes)> {
    let Ok(guard) = guard(endpoint, max_message_bytes, stats.clone(), worker_id).await else {
        return Vec::new();
    };
    let mut opts = SocketOptions::default();
    opts.connect_timeout(CONNECT_TIMEOUT);
    let mut dealer = DealerSocket::with_options(opts);
    if tokio::time::timeout(CONNECT_TIMEOUT * 2, dealer.connect(&guard.endpoint)).await.map(|r| r.is_ok()) != Ok(true) {
        return Vec::new();
    }
    let budget = MAX_REPLAY_BYTES.max(max_message_bytes);
    let mut kept: u64 = 0;
    let Ok(req) = ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())]) else {
        return Vec::new();
    };
    if dealer.send(req).await.is_err() {
        return Vec::new();
    }
    let mut out = Vec::new();
    loop {
        let Ok(Ok(msg)) = tokio::time::timeout(REPLAY_TIMEOUT, dealer.recv()).await else { break };
        let frames = msg.into_vec();
        // [""], (topic,)? seq, payload
        if frames.len() < 3 || frames.len() > 4 || !frames[0].is_empty() {
            break;
        }
        let seq_frame = &frames[frames.len() - 2];
        let Ok(seq_bytes) = <[u8; 8]>::try_from(seq_frame.as_ref()) else { break };
        let seq = u64::from_be_bytes(seq_bytes);
        let payload = frames[frames.len() - 1].clone();
        if seq == END_SEQ || payload.is_empty() {
            break;
        }
        if seq >= to {
            // Newer than the gap: the live stream delivers it.
            continue;
        }
        // Only what fills the gap, each seq once and in order: a peer repeating or reordering
        // batches cannot grow the list past `to - from` entries.
        if seq < from || out.last().is_some_and(|(last, _)| seq <= *last) {
            continue;
        }
        kept = kept.saturating_add(payload.len() as u64);
        if kept > budget {
            break;
        }
        out.push((seq, payload));
    }
    out
}

/// Runs the subscriber until `shutdown`.
pub async fn run(spec: SubscriberSpec, index: Arc<KvIndex>, stats: Arc<KvStats>, shutdown: CancellationToken) {
    let mut applier = Applier::new(spec.clone(), index, stats);
    let mut backoff = Duration::from_millis(50);
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let mut opts = SocketOptions::default();
        opts.connect_timeout(CONNECT_TIMEOUT);
        let mut sub = SubSocket::with_options(opts);
        let mut monitor = sub.monitor();
        // The relay lives as long as this connection of `sub`.
        let mut _guard = None;
        let connected = async {
            let g = guard(&spec.endpoint, spec.max_message_bytes, applier.stats.clone(), spec.worker_id).await.ok()?;
            sub.subscribe(&spec.topic).await.ok()?;
            let endpoint = g.endpoint.clone();
            _guard = Some(g);
            tokio::time::timeout(CONNECT_TIMEOUT * 2, sub.connect(&endpoint)).await.ok()?.ok()
        };
        let ok = tokio::select! {
            r = connected => r.is_some(),
            () = shutdown.cancelled() => return,
        };
        if !ok {
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            continue;
        }
        backoff = Duration::from_millis(50);
        applier.tracker.reconnect();
        let connected_at = Instant::now();
        loop {
            tokio::select! {
                msg = sub.recv() => {
                    let Ok(msg) = msg else { break };
                    let frames = msg.into_vec();
                    if frames.len() != 3 {
                        continue;
                    }
                    let Ok(seq) = <[u8; 8]>::try_from(frames[1].as_ref()).map(u64::from_be_bytes) else { continue };
                    applier.on_batch(seq, frames[2].clone()).await;
                }
                ev = monitor.next() => match ev {
                    Some(SocketEvent::Disconnected(_)) | None => break,
                    _ => {}
                },
                () = shutdown.cancelled() => return,
            }
        }
        tracing::debug!(
            worker = spec.worker_id,
            after_ms = connected_at.elapsed().as_millis() as u64,
            "kv event stream disconnected; reconnecting"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zeromq::{PubSocket, RouterSocket};

    #[test]
    fn classifies_order_gaps_duplicates_and_restarts() {
        let mut t = SeqTracker::default();
        assert_eq!(t.classify(0), SeqAction::Apply);
        assert_eq!(t.classify(5), SeqAction::Replay { from: 0, to: 5 }, "first seen mid-stream: replay from 0");
        t.applied(0);
        assert_eq!(t.classify(1), SeqAction::Apply);
        t.applied(1);
        assert_eq!(t.classify(4), SeqAction::Replay { from: 2, to: 4 });
        assert_eq!(t.classify(1), SeqAction::Stale);
        assert_eq!(t.classify(0), SeqAction::Restart);
        t.reconnect();
        assert_eq!(t.classify(1), SeqAction::Restart, "after a reconnect a lower seq means a new engine");
        assert_eq!(t.classify(2), SeqAction::Apply);
        t.applied(2);
        assert_eq!(t.classify(2), SeqAction::Stale);
    }

    /// A ZMTP 3.0 greeting with the NULL mechanism, as a peer sends it.
    fn greeting() -> Vec<u8> {
        let mut g = vec![0u8; 64];
        g[0] = 0xff;
        g[9] = 0x7f;
        g[10] = 3;
        g[12..16].copy_from_slice(b"NULL");
        g
    }

    /// A READY command announcing `socket_type`.
    fn ready(socket_type: &str) -> Vec<u8> {
        let mut body = vec![5u8];
        body.extend_from_slice(b"READY");
        body.push(11);
        body.extend_from_slice(b"Socket-Type");
        body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
        body.extend_from_slice(socket_type.as_bytes());
        let mut frame = vec![FLAG_COMMAND, body.len() as u8];
        frame.extend_from_slice(&body);
        frame
    }

    /// One frame with the short or long header as its length requires.
    fn frame(payload: &[u8], more: bool) -> Vec<u8> {
        let more = if more { FLAG_MORE } else { 0 };
        let mut f = if payload.len() > 255 {
            let mut h = vec![FLAG_LONG | more];
            h.extend_from_slice(&(payload.len() as u64).to_be_bytes());
            h
        } else {
            vec![more, payload.len() as u8]
        };
        f.extend_from_slice(payload);
        f
    }

    /// Header of a 1 TiB message frame.
    const HUGE_HEADER: [u8; 9] = [FLAG_LONG, 0, 0, 1, 0, 0, 0, 0, 0];

    #[test]
    fn scanner_passes_a_normal_stream_fed_in_any_split() {
        let mut stream = greeting();
        stream.extend(ready("PUB"));
        stream.extend(frame(b"topic", true));
        stream.extend(frame(&7u64.to_be_bytes(), true));
        stream.extend(frame(&[0xab; 3000], false));
        stream.extend(frame(&[], false));
        for cut in 0..stream.len() {
            let mut s = FrameScanner::new(4096);
            assert_eq!(s.feed(&stream[..cut]), Ok(()), "cut at {cut}");
            assert_eq!(s.feed(&stream[cut..]), Ok(()), "cut at {cut}");
            assert!(matches!(s.state, Scan::Flags), "ends between frames: {:?}", s.state);
        }
        // Byte by byte, too.
        let mut s = FrameScanner::new(4096);
        for b in &stream {
            assert_eq!(s.feed(std::slice::from_ref(b)), Ok(()));
        }
    }

    #[test]
    fn scanner_refuses_a_huge_header_before_its_body_and_stays_refused() {
        let mut stream = greeting();
        stream.extend(ready("PUB"));
        let header_end = stream.len() + HUGE_HEADER.len();
        stream.extend(HUGE_HEADER);
        let mut s = FrameScanner::new(DEFAULT_MAX_MESSAGE_BYTES);
        // Everything up to the last length byte passes: the length is not known yet.
        assert_eq!(s.feed(&stream[..header_end - 1]), Ok(()));
        let err = s.feed(&stream[header_end - 1..header_end]).expect_err("the header completes");
        assert_eq!(err, Oversized { kind: "message", announced: (1 << 40) + 64, cap: DEFAULT_MAX_MESSAGE_BYTES });
        assert!(s.feed(b"").is_err() && s.feed(&[0]).is_err(), "a refused stream cannot resume");
    }

    #[test]
    fn scanner_caps_whole_multipart_messages_and_commands() {
        let cap = 1000;
        // Frames of 400 bytes each fit alone, but not three in one message.
        let mut s = FrameScanner::new(cap);
        let mut ok = greeting();
        ok.extend(frame(&[1; 400], true));
        ok.extend(frame(&[1; 400], false));
        ok.extend(frame(&[1; 400], true));
        ok.extend(frame(&[1; 400], true));
        assert_eq!(s.feed(&ok), Ok(()), "a message of two frames, then two frames of the next");
        let err = s.feed(&frame(&[1; 400], false)).expect_err("third frame");
        assert_eq!((err.kind, err.announced), ("message", 3 * (400 + FRAME_OVERHEAD_BYTES)));
        let mut s = FrameScanner::new(cap);
        let mut empties = greeting();
        for _ in 0..=(cap / FRAME_OVERHEAD_BYTES) {
            empties.extend(frame(&[], true));
        }
        assert!(s.feed(&empties).is_err(), "a flood of empty frames is bounded by their overhead");
        let mut s = FrameScanner::new(cap);
        let mut cmd = greeting();
        cmd.extend([FLAG_COMMAND | FLAG_LONG, 0, 0, 0, 0, 0, 0, 0x10, 0]);
        assert_eq!(s.feed(&cmd).map_err(|e| e.kind), Err("command"));
    }

    fn stored_batch(seq: u64) -> Vec<u8> {
        let tokens: Vec<u32> = (0..16).map(|t| t + seq as u32 * 16).collect();
        let event = switchyard_sim::engine::KvEvent::BlockStored {
            block_hashes: vec![1000 + seq],
            parent_block_hash: None,
            token_ids: tokens,
            block_size: 16,
        };
        switchyard_sim::wire::encode_batch(0.0, &[event], 0, switchyard_sim::wire::WireFormat::Current)
    }

    fn tcp_addr(ep: &Endpoint) -> SocketAddr {
        match ep {
            Endpoint::Tcp(host, port) => {
                let ip = host.to_string().parse().expect("bound to an ip");
                SocketAddr::new(ip, *port)
            }
            other => panic!("not tcp: {other}"),
        }
    }

    fn rss_bytes() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }

    async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_peer_announcing_a_huge_frame_is_dropped_and_the_subscriber_recovers() {
        let mut publisher = PubSocket::new();
        let pub_addr = tcp_addr(&publisher.bind("tcp://127.0.0.1:0").await.expect("bind pub"));
        // The worker's address: the first connection is a hostile peer that completes the
        // handshake and then announces a 1 TiB frame; later ones reach the real publisher.
        let front = TcpListener::bind("127.0.0.1:0").await.expect("bind front");
        let front_addr = front.local_addr().expect("addr");
        let hostile_done = Arc::new(AtomicU64::new(0));
        let done = hostile_done.clone();
        tokio::spawn(async move {
            let Ok((mut s, _)) = front.accept().await else { return };
            let mut hello = greeting();
            hello.extend(ready("PUB"));
            hello.extend(HUGE_HEADER);
            hello.extend([0u8; 4096]);
            let _ = s.write_all(&hello).await;
            // Hold the connection until the spoke closes it.
            let mut sink = [0u8; 1024];
            while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
            done.store(1, Ordering::SeqCst);
            while let Ok((mut s, _)) = front.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut p) = TcpStream::connect(pub_addr).await {
                        let _ = tokio::io::copy_bidirectional(&mut s, &mut p).await;
                    }
                });
            }
        });

        let rss_before = rss_bytes();
        let index = Arc::new(KvIndex::new(16));
        let stats = Arc::new(KvStats::default());
        let spec = SubscriberSpec {
            worker_id: 7,
            endpoint: format!("tcp://{front_addr}"),
            replay: None,
            topic: String::new(),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(spec, index.clone(), stats.clone(), shutdown.clone()));

        wait_until("the refusal to be counted", || stats.decode_errors.load(Ordering::Relaxed) > 0).await;
        wait_until("the hostile connection to be dropped", || hostile_done.load(Ordering::SeqCst) == 1).await;
        if let (Some(before), Some(after)) = (rss_before, rss_bytes()) {
            assert!(after < before + (64 << 20), "rss grew from {before} to {after}");
        }

        // A well-behaved publisher on the same address is decoded after the reconnect. PUB
        // drops messages until the subscription arrives, so keep publishing.
        let mut seq = 0u64;
        while stats.batches.load(Ordering::Relaxed) == 0 {
            assert!(seq < 500, "no batch applied after the reconnect");
            let msg = ZmqMessage::try_from(vec![
                Bytes::from_static(b"kv"),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                Bytes::from(stored_batch(seq)),
            ])
            .expect("message");
            publisher.send(msg).await.expect("publish");
            seq += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(stats.decode_errors.load(Ordering::Relaxed), 1, "the refusal is counted once");
        assert!(stats.blocks.load(Ordering::Relaxed) >= 1);
        shutdown.cancel();
        task.await.expect("subscriber stops");
    }

    #[tokio::test]
    async fn a_replay_peer_announcing_a_huge_frame_yields_nothing() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("tcp://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let mut hello = greeting();
            hello.extend(ready("ROUTER"));
            let _ = s.write_all(&hello).await;
            // Answer the request (whatever it is) with a 1 TiB frame.
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(&HUGE_HEADER).await;
            while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
        });
        let stats = Arc::new(KvStats::default());
        let got = replay(&endpoint, 0, 5, DEFAULT_MAX_MESSAGE_BYTES, &stats, 1).await;
        assert!(got.is_empty());
        wait_until("the refusal to be counted", || stats.decode_errors.load(Ordering::Relaxed) == 1).await;
    }

    #[tokio::test]
    async fn replay_keeps_each_sequence_once_and_in_order() {
        let mut router = RouterSocket::new();
        let ep = router.bind("tcp://127.0.0.1:0").await.expect("bind router");
        let endpoint = format!("tcp://{}", tcp_addr(&ep));
        tokio::spawn(async move {
            let Ok(req) = router.recv().await else { return };
            let identity = req.get(0).cloned().unwrap_or_default();
            // A broken buffer: seq 3 a thousand times, then 2 (out of order), 4, 9 (past the
            // gap), and the end marker.
            let seqs = std::iter::repeat_n(3u64, 1000).chain([2, 4, 9, END_SEQ]);
            for s in seqs {
                let payload = if s == END_SEQ { Bytes::new() } else { Bytes::from_static(b"x") };
                let frames = vec![identity.clone(), Bytes::new(), Bytes::copy_from_slice(&s.to_be_bytes()), payload];
                let Ok(msg) = ZmqMessage::try_from(frames) else { return };
                if router.send(msg).await.is_err() {
                    return;
                }
            }
        });
        let stats = Arc::new(KvStats::default());
        let got = replay(&endpoint, 2, 6, DEFAULT_MAX_MESSAGE_BYTES, &stats, 1).await;
        let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![3, 4]);
    }
}
