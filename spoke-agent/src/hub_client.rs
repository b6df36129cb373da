//! The spoke's link to its hub: one `Link` stream over mutual TLS, dialled again with
//! backoff whenever it ends.
//!
//! A session: read the certificate files (so a rotated certificate is used from the next
//! dial on) → dial → hello (this cluster's worker sets from the current topology) → the
//! hub's welcome (report interval) → a load report every interval until the stream ends,
//! the certificate files change, or the topology changes what the hello says (the spoke
//! dials again and says hello anew). The hub's configuration snapshots are handed to the
//! configuration source ([`crate::source::Push`]), which applies them, and acknowledged with
//! its verdict; one already served is acknowledged without being applied again. Usage
//! records ([`crate::usage`]) follow each load report until the hub acknowledges them.
//!
//! Invariants: the hub being away never affects the front door (this task only reads the
//! registry and topology); the task is owned by [`crate::Spoke`] and ends on its shutdown;
//! every state change is visible in `/status` under `hub`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use switchyard_proto::tls::{TlsFiles, client_tls};
use switchyard_proto::v1::federation_client::FederationClient;
use switchyard_proto::v1::{
    CoarseBlocks, CoarseReport, ConfigAck, ConfigSnapshot, Hello, LoadReport, SpokeMessage, UsageReport, WorkerSetInfo,
    WorkerSetLoad, hub_message, spoke_message,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::http::App;
use crate::source::{HubConfig, Push};
use crate::topology::Topology;

/// First and longest pause between dials: a returning hub has its fleet view whole within
/// the longest pause plus one report interval.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(2));
/// A session that lasted this long resets the backoff.
const STABLE_SESSION: Duration = Duration::from_secs(10);
/// Longest wait for the TCP connection, the handshake and the welcome.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Report interval until the welcome says otherwise.
const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_millis(500);

/// Where the hub is and who this spoke is.
#[derive(Debug, Clone)]
pub struct HubLink {
    /// The hub's federation URL (`https://host:port`).
    pub url: String,
    /// The name the hub's certificate must carry (defaults to the URL's host).
    pub server_name: Option<String>,
    /// This spoke's cluster: must be the one its certificate names.
    pub cluster: String,
    /// This spoke's certificate, key and the CA that signs the hub's certificate.
    pub tls: TlsFiles,
    /// The front-door URL the hub forwards to (`--advertise-url`; the bound listen address
    /// when unset).
    pub front_door_url: Option<String>,
}

/// The link's state, for `/status`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HubStatus {
    /// The hub's URL.
    pub url: String,
    /// This spoke's cluster.
    pub cluster: String,
    /// `connecting`, `connected` or `disconnected`.
    pub state: &'static str,
    /// The hub replica of the current session.
    pub hub: Option<String>,
    /// Sessions established since start.
    pub sessions: u64,
    /// Load reports sent since start.
    pub reports: u64,
    /// Coarse reports sent since start, and their encoded bytes.
    pub coarse_reports: u64,
    /// Encoded bytes of the coarse reports.
    pub coarse_bytes: u64,
    /// Encoded bytes of every message sent to the hub (hellos, load and coarse reports).
    pub bytes: u64,
    /// Why the last session or dial ended.
    pub last_error: Option<String>,
    /// Version of the hub's configuration this spoke serves, once one was applied.
    pub config_version: Option<String>,
    /// Why the hub's last snapshot was refused, if it was.
    pub config_error: Option<String>,
    /// Seconds since the Unix epoch when the current session began.
    pub connected_since: Option<u64>,
}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
enum SessionEnd {
    #[error("certificate files: {0}")]
    Tls(String),
    #[error("dial: {0}")]
    Dial(String),
    #[error("refused by the hub: {0}")]
    Refused(String),
    #[error("stream ended: {0}")]
    Stream(String),
    #[error("certificate files changed")]
    Rotated,
    #[error("configuration changed")]
    Reconfigured,
    #[error("spoke shutting down")]
    Shutdown,
}

/// Keeps the link up until `stop`.
pub async fn run(
    app: Arc<App>,
    link: HubLink,
    status: Arc<Mutex<HubStatus>>,
    pushes: mpsc::Sender<Push>,
    stop: CancellationToken,
) {
    set(&status, |s| {
        s.url = link.url.clone();
        s.cluster = link.cluster.clone();
        s.state = "connecting";
    });
    let mut backoff = BACKOFF.0;
    loop {
        let began = Instant::now();
        let end = session(&app, &link, &status, &pushes, &stop).await;
        let error = end.to_string();
        set(&status, |s| {
            s.state = "disconnected";
            s.hub = None;
            s.connected_since = None;
            s.last_error = Some(error.clone());
        });
        match end {
            SessionEnd::Shutdown => return,
            SessionEnd::Rotated | SessionEnd::Reconfigured => backoff = BACKOFF.0,
            SessionEnd::Refused(_) => tracing::error!(hub = %link.url, %error, "hub refused this spoke"),
            _ => tracing::warn!(hub = %link.url, %error, "hub link down; dialling again"),
        }
        if began.elapsed() >= STABLE_SESSION {
            backoff = BACKOFF.0;
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => return,
        }
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

fn set(status: &Mutex<HubStatus>, f: impl FnOnce(&mut HubStatus)) {
    if let Ok(mut s) = status.lock() {
        f(&mut s);
    }
}

fn refused_or_stream(status: tonic::Status) -> SessionEnd {
    use tonic::Code;
    match status.code() {
        Code::PermissionDenied | Code::Unauthenticated | Code::InvalidArgument => {
            SessionEnd::Refused(format!("{:?}: {}", status.code(), status.message()))
        }
        _ => SessionEnd::Stream(format!("{:?}: {}", status.code(), status.message())),
    }
}

async fn session(
    app: &Arc<App>,
    link: &HubLink,
    status: &Mutex<HubStatus>,
    pushes: &mpsc::Sender<Push>,
    stop: &CancellationToken,
) -> SessionEnd {
    let stamp = link.tls.stamp();
    let pem = match link.tls.read_pem() {
        Ok(p) => p,
        Err(e) => return SessionEnd::Tls(e.to_string()),
    };
    let server_name = link.server_name.clone().unwrap_or_else(|| host_of(&link.url));
    let endpoint = match tonic::transport::Endpoint::from_shared(link.url.clone())
        .and_then(|e| e.tls_config(client_tls(&pem, &server_name)))
    {
        Ok(e) => e
            .connect_timeout(DIAL_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5)),
        Err(e) => return SessionEnd::Dial(e.to_string()),
    };
    let channel = tokio::select! {
        c = endpoint.connect() => match c {
            Ok(c) => c,
            Err(e) => return SessionEnd::Dial(error_chain(&e)),
        },
        () = stop.cancelled() => return SessionEnd::Shutdown,
    };

    let topo = app.topology.borrow().clone();
    let (tx, rx) = mpsc::channel(4);
    let front_door_url = link.front_door_url.as_deref().unwrap_or_default();
    let said = hello(&topo, &link.cluster, front_door_url);
    let hello_bytes = prost::Message::encoded_len(&said) as u64;
    if tx.send(SpokeMessage { kind: Some(spoke_message::Kind::Hello(said.clone())) }).await.is_err() {
        return SessionEnd::Stream("request stream closed".into());
    }
    set(status, |s| s.bytes += hello_bytes);
    let mut client = FederationClient::new(channel);
    let call = client.link(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut inbound = tokio::select! {
        r = tokio::time::timeout(DIAL_TIMEOUT, call) => match r {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => return refused_or_stream(status),
            Err(_) => return SessionEnd::Dial("no answer to the hello".into()),
        },
        () = stop.cancelled() => return SessionEnd::Shutdown,
    };
    // The welcome comes first; an error here is the hub's verdict on the hello.
    let welcome = tokio::select! {
        m = tokio::time::timeout(DIAL_TIMEOUT, inbound.message()) => match m {
            Ok(Ok(Some(msg))) => match msg.kind {
                Some(hub_message::Kind::Welcome(w)) => w,
                _ => return SessionEnd::Stream("the hub's first message is not a welcome".into()),
            },
            Ok(Ok(None)) => return SessionEnd::Stream("closed before the welcome".into()),
            Ok(Err(status)) => return refused_or_stream(status),
            Err(_) => return SessionEnd::Dial("no welcome".into()),
        },
        () = stop.cancelled() => return SessionEnd::Shutdown,
    };
    let interval = match welcome.load_interval_ms {
        0 => DEFAULT_REPORT_INTERVAL,
        ms => Duration::from_millis(u64::from(ms).clamp(50, 60_000)),
    };
    tracing::info!(hub = %welcome.hub, cluster = %link.cluster, "connected to the hub");
    set(status, |s| {
        s.state = "connected";
        s.hub = Some(welcome.hub.clone());
        s.sessions += 1;
        s.connected_since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).ok().map(|d| d.as_secs());
    });

    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sequence = 0u64;
    // Worker sets whose coarse copy this stream has not started yet.
    let mut reset: BTreeSet<String> = BTreeSet::new();
    reset.extend(topo.fleet.worker_sets.values().filter(|ws| ws.cluster == link.cluster).map(|ws| ws.name.to_string()));
    // Usage records this stream has sent: a new stream starts from the oldest the hub has
    // not acknowledged.
    let mut usage_sent_through = 0u64;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                if link.tls.stamp() != stamp {
                    return SessionEnd::Rotated;
                }
                if hello(&app.topology.borrow(), &link.cluster, front_door_url) != said {
                    return SessionEnd::Reconfigured;
                }
                sequence += 1;
                let report = load_report(app, &app.topology.borrow().clone(), &link.cluster, sequence);
                let bytes = prost::Message::encoded_len(&report) as u64;
                if tx.send(SpokeMessage { kind: Some(spoke_message::Kind::Load(report)) }).await.is_err() {
                    return SessionEnd::Stream("request stream closed".into());
                }
                set(status, |s| {
                    s.reports += 1;
                    s.bytes += bytes;
                });
                let now = app.topology.borrow().clone();
                if let Some(coarse) = coarse_report(app, &now, &link.cluster, &mut reset) {
                    let bytes = prost::Message::encoded_len(&coarse) as u64;
                    if tx.send(SpokeMessage { kind: Some(spoke_message::Kind::Coarse(coarse)) }).await.is_err() {
                        return SessionEnd::Stream("request stream closed".into());
                    }
                    set(status, |s| {
                        s.coarse_reports += 1;
                        s.coarse_bytes += bytes;
                        s.bytes += bytes;
                    });
                }
                if let Some(outbox) = &app.usage {
                    let records = outbox.after(usage_sent_through, crate::usage::MAX_PER_REPORT);
                    if let Some(last) = records.last() {
                        usage_sent_through = last.sequence;
                        let report = UsageReport { instance: outbox.instance(), records };
                        let bytes = prost::Message::encoded_len(&report) as u64;
                        if tx.send(SpokeMessage { kind: Some(spoke_message::Kind::Usage(report)) }).await.is_err() {
                            return SessionEnd::Stream("request stream closed".into());
                        }
                        set(status, |s| s.bytes += bytes);
                    }
                }
            }
            m = inbound.message() => match m {
                Ok(Some(msg)) => {
                    if let (Some(hub_message::Kind::UsageAck(ack)), Some(outbox)) = (&msg.kind, &app.usage)
                        && ack.instance == outbox.instance()
                    {
                        outbox.acknowledge(ack.through_sequence);
                    }
                    if let Some(hub_message::Kind::Config(snapshot)) = msg.kind {
                        let Some(ack) = apply(snapshot, pushes, status, stop).await else {
                            return SessionEnd::Shutdown;
                        };
                        let bytes = prost::Message::encoded_len(&ack) as u64;
                        if tx.send(SpokeMessage { kind: Some(spoke_message::Kind::ConfigAck(ack)) }).await.is_err() {
                            return SessionEnd::Stream("request stream closed".into());
                        }
                        set(status, |s| s.bytes += bytes);
                    }
                    // Other messages are a newer hub's; fields only ever get added.
                }
                Ok(None) => return SessionEnd::Stream("closed by the hub".into()),
                Err(status) => return refused_or_stream(status),
            },
            () = stop.cancelled() => return SessionEnd::Shutdown,
        }
    }
}

/// Has the configuration source apply `snapshot` and answers with its verdict; `None` when
/// the spoke is shutting down.
async fn apply(
    snapshot: ConfigSnapshot,
    pushes: &mpsc::Sender<Push>,
    status: &Mutex<HubStatus>,
    stop: &CancellationToken,
) -> Option<ConfigAck> {
    let version = snapshot.version.clone();
    let config = HubConfig {
        version: snapshot.version,
        documents: snapshot.documents.into_iter().map(|d| (d.label, d.text)).collect(),
    };
    let (done, verdict) = oneshot::channel();
    let result = tokio::select! {
        r = async {
            pushes.send(Push { config, done }).await.map_err(|_| "the configuration source has stopped".to_owned())?;
            verdict.await.map_err(|_| "the configuration source has stopped".to_owned())?
        } => r,
        () = stop.cancelled() => return None,
    };
    match &result {
        Ok(()) => tracing::info!(version = %version, "serving the hub's configuration"),
        Err(error) => tracing::warn!(version = %version, %error, "the hub's configuration was refused"),
    }
    set(status, |s| match &result {
        Ok(()) => {
            s.config_version = Some(version.clone());
            s.config_error = None;
        }
        Err(e) => s.config_error = Some(e.clone()),
    });
    Some(ConfigAck { version, applied: result.is_ok(), error: result.err().unwrap_or_default() })
}

/// The host part of `https://host:port/...`.
fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6).to_string(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h).to_string(),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn fidelity(app: &App, set: &str) -> String {
    app.registry
        .set(set)
        .and_then(|s| s.guard.lock().ok().map(|g| format!("{:?}", g.mode()).to_lowercase()))
        .unwrap_or_default()
}

/// This cluster's worker sets, as the hello describes them.
pub fn hello(topo: &Topology, cluster: &str, front_door_url: &str) -> Hello {
    let sets: Vec<&switchyard_core::fleet::WorkerSet> =
        topo.fleet.worker_sets.values().filter(|ws| ws.cluster == cluster).collect();
    let region = sets.iter().find_map(|ws| ws.region.as_ref().map(|r| r.to_string())).unwrap_or_default();
    let worker_sets = sets
        .iter()
        .map(|ws| WorkerSetInfo {
            name: ws.name.to_string(),
            served_model: ws.served_model.to_string(),
            kv_block_size: ws.kv_block_size,
            workers: ws.workers.len() as u32,
            coarse_block_factor: switchyard_proto::coarse::DEFAULT_FACTOR,
        })
        .collect();
    Hello {
        cluster: cluster.to_string(),
        region,
        worker_sets,
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        front_door_url: front_door_url.to_string(),
    }
}

/// The load of this cluster's worker sets now.
pub fn load_report(app: &App, topo: &Topology, cluster: &str, sequence: u64) -> LoadReport {
    let now_ms = app.registry.now_ms();
    let held: std::collections::HashMap<String, usize> =
        app.holds.held().into_iter().map(|(s, n)| (s.to_string(), n)).collect();
    let workers = app.registry.workers();
    let worker_sets = topo
        .fleet
        .worker_sets
        .values()
        .filter(|ws| ws.cluster == cluster)
        .map(|ws| {
            let ttft = app.registry.set(&ws.name).and_then(|s| s.calibration.lock().ok().map(|c| c.model()));
            let mut load = WorkerSetLoad {
                worker_set: ws.name.to_string(),
                decode_tokens_per_second: ws.decode_tokens_per_sec,
                prefill_tokens_per_second: ttft.map_or(0.0, |m| m.prefill_tokens_per_sec),
                fidelity: fidelity(app, &ws.name),
                waiting_requests: held.get(&*ws.name).copied().unwrap_or(0) as u32,
                ..Default::default()
            };
            let mut kv_sum = 0.0;
            let mut queue_wait = f64::INFINITY;
            for w in workers.iter().filter(|w| w.key.worker_set == ws.name) {
                let (engine, _) = w.load.engine();
                load.kv_capacity_blocks += engine.num_gpu_blocks.map_or(0, u64::from);
                load.running_requests += engine.running;
                load.waiting_requests += engine.waiting;
                if !w.load.healthy() {
                    continue;
                }
                load.healthy_workers += 1;
                let kv = engine.kv_usage * 100.0;
                kv_sum += kv;
                load.kv_usage_percent_max = load.kv_usage_percent_max.max(kv);
                let replica = w.model.lock().ok().and_then(|m| m.as_ref().map(|m| m.outlook(now_ms)));
                let wait = match replica {
                    Some(outlook) => outlook.predict(1, 0, 0).queue_ms,
                    None => {
                        ttft.unwrap_or_default()
                            .predict(&switchyard_core::predictor::TtftInputs {
                                prompt_tokens: 1,
                                waiting_requests: engine.waiting
                                    + w.load.inflight_unstarted.load(Ordering::Relaxed) as u32,
                                waiting_prefill_tokens: Some(w.load.inflight_prefill_tokens.load(Ordering::Relaxed)),
                                running_requests: engine.running,
                                ..Default::default()
                            })
                            .queue_ms
                    }
                };
                queue_wait = queue_wait.min(wait);
            }
            if load.healthy_workers > 0 {
                load.kv_usage_percent_mean = kv_sum / f64::from(load.healthy_workers);
                load.predicted_queue_wait_ms = queue_wait;
            }
            load
        })
        .collect();
    LoadReport { sequence, worker_sets }
}

/// Coarse blocks per report and worker set at most (keeps a first report of a large cache
/// well under gRPC's 4 MiB message limit; the rest follows with the next reports).
const MAX_COARSE_PER_REPORT: usize = 20_000;

/// What changed in this cluster's coarse caches since the last report, `None` if nothing.
/// Sets named in `reset` start their stream with a reset (and are taken out of it).
pub fn coarse_report(app: &App, topo: &Topology, cluster: &str, reset: &mut BTreeSet<String>) -> Option<CoarseReport> {
    let worker_sets: Vec<CoarseBlocks> = topo
        .fleet
        .worker_sets
        .values()
        .filter(|ws| ws.cluster == cluster)
        .filter_map(|ws| {
            let set = app.registry.set(&ws.name)?;
            let first = reset.remove(&*ws.name);
            set.index.coarse().drain(&ws.name, first, MAX_COARSE_PER_REPORT)
        })
        .collect();
    (!worker_sets.is_empty()).then_some(CoarseReport { worker_sets })
}

/// The flags that link a spoke to a hub (`spoke-agent` and `switchyard spoke`).
#[derive(clap::Args, Debug, Clone)]
pub struct HubArgs {
    /// The hub's federation URL, e.g. `https://hub.example:8443`; without it the spoke runs
    /// alone. With it, the hub's fleet-wide resources (policies, providers, pools, backends)
    /// replace those of `--config` once the hub sends them; worker sets stay the files'.
    #[arg(long, requires_all = ["cluster", "tls_dir"])]
    pub hub: Option<String>,
    /// This spoke's cluster name (the one its certificate names).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Directory with this spoke's `tls.crt`, `tls.key` and the hub's `ca.crt` (a mounted
    /// cert-manager Secret).
    #[arg(long)]
    pub tls_dir: Option<PathBuf>,
    /// The name the hub's certificate carries, when it is not the URL's host.
    #[arg(long)]
    pub hub_server_name: Option<String>,
    /// The front-door URL the hub should send this cluster's requests to, when it is not
    /// `http://` + the listen address (behind a Service or a load balancer).
    #[arg(long)]
    pub advertise_url: Option<String>,
}

impl HubArgs {
    /// The link these flags describe, if any.
    pub fn link(&self) -> Option<HubLink> {
        Some(HubLink {
            url: self.hub.clone()?,
            server_name: self.hub_server_name.clone(),
            cluster: self.cluster.clone()?,
            tls: TlsFiles::in_dir(self.tls_dir.as_ref()?),
            front_door_url: self.advertise_url.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn the_tls_name_defaults_to_the_urls_host() {
        assert_eq!(host_of("https://127.0.0.1:8443"), "127.0.0.1");
        assert_eq!(host_of("https://hub.example:8443/x"), "hub.example");
        assert_eq!(host_of("https://[::1]:8443"), "::1");
        assert_eq!(host_of("https://hub"), "hub");
    }
}
