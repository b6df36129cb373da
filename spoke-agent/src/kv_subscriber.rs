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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dynamo_kv_router::protocols::{WorkerId, WorkerWithDpRank};
use dynamo_kv_router::zmq_wire::{ZmqEventNormalizer, decode_event_batch};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::index::KvIndex;

/// Connect attempts give up after this long (and are retried).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Replay requests give up after this long without a reply.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Upper bound of the reconnect backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Replay end-marker sequence.
const END_SEQ: u64 = u64::MAX;

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
}

struct Applier {
    spec: SubscriberSpec,
    index: Arc<KvIndex>,
    normalizer: ZmqEventNormalizer,
    stats: Arc<KvStats>,
    tracker: SeqTracker,
    event_id: u64,
}

impl Applier {
    fn clear(&mut self) {
        self.event_id += 1;
        self.index.clear_worker(self.spec.worker_id, self.event_id);
        self.stats.blocks.store(0, Ordering::Relaxed);
        self.stats.resyncs.fetch_add(1, Ordering::Relaxed);
    }

    /// Decodes and applies one batch; false if it could not be decoded.
    fn apply(&mut self, seq: u64, payload: &[u8]) -> bool {
        let batch = match decode_event_batch(payload) {
            Ok(b) => b,
            Err(e) => {
                self.stats.decode_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(worker = self.spec.worker_id, seq, error = %e, "undecodable kv event batch");
                return false;
            }
        };
        let worker = WorkerWithDpRank::new(self.spec.worker_id, batch.data_parallel_rank.unwrap_or(0).max(0) as u32);
        for raw in batch.events {
            self.event_id += 1;
            if let Some(event) =
                self.normalizer.normalize(raw, self.event_id, worker).and_then(|p| p.into_router_event())
            {
                match &event.event.data {
                    dynamo_kv_router::protocols::KvCacheEventData::Stored(s) => {
                        self.stats.blocks.fetch_add(s.blocks.len() as u64, Ordering::Relaxed);
                    }
                    dynamo_kv_router::protocols::KvCacheEventData::Removed(r) => {
                        let n = r.block_hashes.len() as u64;
                        let _ = self
                            .stats
                            .blocks
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some(b.saturating_sub(n)));
                    }
                    dynamo_kv_router::protocols::KvCacheEventData::Cleared => {
                        self.stats.blocks.store(0, Ordering::Relaxed)
                    }
                }
                self.index.apply(event);
            }
        }
        self.tracker.applied(seq);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
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
                    Some(r) => replay(r, from, to).await,
                    None => Vec::new(),
                };
                let complete =
                    replayed.len() as u64 == to - from && replayed.iter().zip(from..).all(|((s, _), want)| *s == want);
                if complete {
                    if !fresh {
                        self.stats.replays.fetch_add(1, Ordering::Relaxed);
                    }
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

/// Requests batches `[from, to)` from a replay ROUTER; returns what arrived, in order.
pub async fn replay(endpoint: &str, from: u64, to: u64) -> Vec<(u64, Bytes)> {
    let mut opts = SocketOptions::default();
    opts.connect_timeout(CONNECT_TIMEOUT);
    let mut dealer = DealerSocket::with_options(opts);
    if tokio::time::timeout(CONNECT_TIMEOUT * 2, dealer.connect(endpoint)).await.map(|r| r.is_ok()) != Ok(true) {
        return Vec::new();
    }
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
        if seq >= from {
            out.push((seq, payload));
        }
    }
    out
}

/// Runs the subscriber until `shutdown`.
pub async fn run(spec: SubscriberSpec, index: Arc<KvIndex>, stats: Arc<KvStats>, shutdown: CancellationToken) {
    let block_size = index.block_size();
    let mut applier = Applier {
        spec: spec.clone(),
        index,
        normalizer: ZmqEventNormalizer::new(block_size),
        stats,
        tracker: SeqTracker::default(),
        event_id: 0,
    };
    let mut backoff = Duration::from_millis(50);
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let mut opts = SocketOptions::default();
        opts.connect_timeout(CONNECT_TIMEOUT);
        let mut sub = SubSocket::with_options(opts);
        let mut monitor = sub.monitor();
        let connected = async {
            sub.subscribe(&spec.topic).await.ok()?;
            tokio::time::timeout(CONNECT_TIMEOUT * 2, sub.connect(&spec.endpoint)).await.ok()?.ok()
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
}
