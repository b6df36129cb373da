//! The hub's view of its clusters: what each said in its hello and its latest load report.
//!
//! Invariants:
//! - one live session per cluster: a new stream for a cluster supersedes the old one, whose
//!   reports are then ignored (the old stream's task sees [`Report::Superseded`] and ends);
//! - a cluster is **choosable** only while its session is open *and* its last report is
//!   younger than `lost_after`: a spoke that stops reporting but keeps its connection (a hung
//!   process, a half-open TCP connection) is dropped from choice as surely as one that
//!   disconnects; a report brings it back;
//! - every method takes the time as an argument, so the rules are tested without waiting.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use switchyard_proto::v1::{ConfigAck, Hello, LoadReport, WorkerSetInfo, WorkerSetLoad};

/// Identifies one stream of one cluster.
pub type SessionId = u64;

/// What happened to a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// Recorded.
    Applied,
    /// The stream it came on is no longer the cluster's session.
    Superseded,
}

#[derive(Debug)]
struct Cluster {
    hello: Hello,
    session: SessionId,
    /// `None` once the session's stream has ended.
    connected_at: Option<Instant>,
    connected_wall: SystemTime,
    last_report: Option<(Instant, LoadReport)>,
    reports: u64,
    sessions: u64,
    /// The spoke's latest answer to the hub's configuration (kept across its sessions).
    config: Option<ConfigAck>,
}

/// A cluster the hub may choose now, with what it last reported.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveCluster {
    /// Cluster name (from its certificate).
    pub cluster: String,
    /// Region, empty if undeclared.
    pub region: String,
    /// Worker sets from its hello.
    pub worker_sets: Vec<WorkerSetInfo>,
    /// Its spoke's front door.
    pub front_door_url: String,
    /// Their latest load.
    pub load: Vec<WorkerSetLoad>,
    /// Reports received from the cluster since the hub started (all sessions): a newer
    /// report has a higher count.
    pub reports: u64,
}

#[cfg(test)]
impl LiveCluster {
    /// A live cluster with no worker sets that has sent `reports` reports (tests).
    pub(crate) fn reported(name: &str, reports: u64) -> LiveCluster {
        LiveCluster {
            cluster: name.into(),
            region: String::new(),
            worker_sets: Vec::new(),
            front_door_url: String::new(),
            load: Vec::new(),
            reports,
        }
    }
}

/// Every cluster that has ever connected, live or not.
#[derive(Debug)]
pub struct FleetView {
    lost_after: Duration,
    state: Mutex<(SessionId, BTreeMap<String, Cluster>)>,
    /// Bumped on every connect, report and disconnect: what waiting requests wake on.
    changes: tokio::sync::watch::Sender<u64>,
}

impl FleetView {
    /// An empty view; clusters silent for `lost_after` are not choosable.
    pub fn new(lost_after: Duration) -> FleetView {
        FleetView { lost_after, state: Mutex::new((0, BTreeMap::new())), changes: tokio::sync::watch::Sender::new(0) }
    }

    /// A receiver that sees a new value after every change of the view.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|v| *v += 1);
    }

    /// After this long without a report a cluster is not choosable.
    pub fn lost_after(&self) -> Duration {
        self.lost_after
    }

    fn with<R>(&self, f: impl FnOnce(&mut (SessionId, BTreeMap<String, Cluster>)) -> R) -> R {
        match self.state.lock() {
            Ok(mut s) => f(&mut s),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// Opens a session for `hello.cluster` (already checked against its certificate),
    /// superseding any earlier one.
    pub fn connect(&self, hello: Hello, now: Instant) -> SessionId {
        let session = self.with(|(next, clusters)| {
            *next += 1;
            let session = *next;
            let (sessions, reports, config) =
                clusters.get(&hello.cluster).map_or((0, 0, None), |c| (c.sessions, c.reports, c.config.clone()));
            clusters.insert(
                hello.cluster.clone(),
                Cluster {
                    hello,
                    session,
                    connected_at: Some(now),
                    connected_wall: SystemTime::now(),
                    // Not choosable until its first report: a hello says what the cluster
                    // is, not how loaded it is.
                    last_report: None,
                    reports,
                    sessions: sessions + 1,
                    config,
                },
            );
            session
        });
        self.changed();
        session
    }

    /// Records a load report from `session` of `cluster`.
    pub fn report(&self, cluster: &str, session: SessionId, report: LoadReport, now: Instant) -> Report {
        let outcome = self.with(|(_, clusters)| match clusters.get_mut(cluster) {
            Some(c) if c.session == session && c.connected_at.is_some() => {
                c.last_report = Some((now, report));
                c.reports += 1;
                Report::Applied
            }
            _ => Report::Superseded,
        });
        if outcome == Report::Applied {
            self.changed();
        }
        outcome
    }

    /// Records `cluster`'s answer to the hub's configuration, from `session`.
    pub fn config_ack(&self, cluster: &str, session: SessionId, ack: ConfigAck) -> Report {
        self.with(|(_, clusters)| match clusters.get_mut(cluster) {
            Some(c) if c.session == session && c.connected_at.is_some() => {
                c.config = Some(ack);
                Report::Applied
            }
            _ => Report::Superseded,
        })
    }

    /// Whether `session` is still `cluster`'s open session.
    pub fn is_current(&self, cluster: &str, session: SessionId) -> bool {
        self.with(|(_, clusters)| {
            clusters.get(cluster).is_some_and(|c| c.session == session && c.connected_at.is_some())
        })
    }

    /// Ends `session` of `cluster` (its stream closed); a later session is left alone.
    pub fn disconnect(&self, cluster: &str, session: SessionId) {
        self.with(|(_, clusters)| {
            if let Some(c) = clusters.get_mut(cluster).filter(|c| c.session == session) {
                c.connected_at = None;
            }
        });
        self.changed();
    }

    fn choosable(&self, c: &Cluster, now: Instant) -> bool {
        c.connected_at.is_some()
            && c.last_report.as_ref().is_some_and(|(at, _)| now.saturating_duration_since(*at) < self.lost_after)
    }

    /// The clusters the hub may choose at `now`, by name.
    pub fn live(&self, now: Instant) -> Vec<LiveCluster> {
        self.with(|(_, clusters)| {
            clusters
                .iter()
                .filter(|(_, c)| self.choosable(c, now))
                .map(|(name, c)| LiveCluster {
                    cluster: name.clone(),
                    region: c.hello.region.clone(),
                    worker_sets: c.hello.worker_sets.clone(),
                    front_door_url: c.hello.front_door_url.clone(),
                    load: c.last_report.as_ref().map(|(_, r)| r.worker_sets.clone()).unwrap_or_default(),
                    reports: c.reports,
                })
                .collect()
        })
    }

    /// Clusters with an open stream (choosable or not).
    pub fn connected(&self) -> usize {
        self.with(|(_, clusters)| clusters.values().filter(|c| c.connected_at.is_some()).count())
    }

    /// The status page's view of every cluster.
    pub fn status(&self, now: Instant) -> Value {
        self.with(|(_, clusters)| {
            let list: Vec<Value> = clusters
                .iter()
                .map(|(name, c)| {
                    let state = if self.choosable(c, now) {
                        "live"
                    } else if c.connected_at.is_some() {
                        "silent"
                    } else {
                        "disconnected"
                    };
                    let since = c.last_report.as_ref().map(|(at, _)| now.saturating_duration_since(*at).as_millis() as u64);
                    let sets: Vec<Value> = c
                        .hello
                        .worker_sets
                        .iter()
                        .map(|ws| {
                            let load = c
                                .last_report
                                .as_ref()
                                .and_then(|(_, r)| r.worker_sets.iter().find(|l| l.worker_set == ws.name));
                            json!({
                                "name": ws.name, "servedModel": ws.served_model, "kvBlockSize": ws.kv_block_size,
                                "workers": ws.workers,
                                "load": load.map(load_json),
                            })
                        })
                        .collect();
                    json!({
                        "cluster": name, "region": c.hello.region, "state": state,
                        "agentVersion": c.hello.agent_version, "frontDoor": c.hello.front_door_url,
                        "connectedAt": c.connected_wall.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
                        "sessions": c.sessions, "reports": c.reports, "msSinceReport": since,
                        "workerSets": sets,
                        "config": c.config.as_ref().map(|a| json!({
                            "version": a.version, "applied": a.applied,
                            "error": (!a.error.is_empty()).then_some(&a.error),
                        })),
                    })
                })
                .collect();
            Value::Array(list)
        })
    }
}

fn load_json(l: &WorkerSetLoad) -> Value {
    json!({
        "healthyWorkers": l.healthy_workers, "waitingRequests": l.waiting_requests,
        "runningRequests": l.running_requests, "kvUsagePercentMean": l.kv_usage_percent_mean,
        "kvUsagePercentMax": l.kv_usage_percent_max, "predictedQueueWaitMs": l.predicted_queue_wait_ms,
        "prefillTokensPerSecond": l.prefill_tokens_per_second, "decodeTokensPerSecond": l.decode_tokens_per_second,
        "fidelity": l.fidelity, "kvCapacityBlocks": l.kv_capacity_blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(cluster: &str) -> Hello {
        Hello {
            cluster: cluster.into(),
            region: "eu".into(),
            worker_sets: vec![WorkerSetInfo { name: "a".into(), ..Default::default() }],
            agent_version: String::new(),
            front_door_url: String::new(),
        }
    }

    fn report(seq: u64) -> LoadReport {
        LoadReport { sequence: seq, worker_sets: vec![WorkerSetLoad { worker_set: "a".into(), ..Default::default() }] }
    }

    #[test]
    fn a_cluster_is_choosable_from_its_first_report_until_it_falls_silent() {
        let view = FleetView::new(Duration::from_secs(2));
        let t0 = Instant::now();
        let s = view.connect(hello("east"), t0);
        assert!(view.live(t0).is_empty(), "a hello alone says nothing of load");
        assert_eq!(view.report("east", s, report(1), t0), Report::Applied);
        assert_eq!(view.live(t0 + Duration::from_millis(1999)).len(), 1);
        assert!(view.live(t0 + Duration::from_secs(2)).is_empty(), "silent for lost_after");
        assert_eq!(view.connected(), 1, "silent, not disconnected");
        view.report("east", s, report(2), t0 + Duration::from_secs(3));
        assert_eq!(view.live(t0 + Duration::from_secs(3)).len(), 1, "a report brings it back");
    }

    #[test]
    fn a_new_session_supersedes_the_old_and_the_old_ones_end_changes_nothing() {
        let view = FleetView::new(Duration::from_secs(2));
        let t0 = Instant::now();
        let old = view.connect(hello("east"), t0);
        let new = view.connect(hello("east"), t0);
        assert_eq!(view.report("east", old, report(1), t0), Report::Superseded);
        assert_eq!(view.report("east", new, report(1), t0), Report::Applied);
        view.disconnect("east", old);
        assert_eq!(view.live(t0).len(), 1);
        view.disconnect("east", new);
        assert!(view.live(t0).is_empty());
        assert_eq!(view.connected(), 0);
        assert_eq!(view.report("east", new, report(2), t0), Report::Superseded, "a closed session records nothing");
    }
}
