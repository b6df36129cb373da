//! The `Federation` service: one `Link` stream per spoke.
//!
//! A stream's life: identity from the verified client certificate → the first message must be
//! a hello naming that same cluster (else `PERMISSION_DENIED`, or `INVALID_ARGUMENT` for a
//! malformed one) → a welcome and the hub's configuration snapshot (its fleet-wide
//! resources, [`switchyard_config::federated`]) → load reports (and coarse cache reports, into
//! the [`PrefixIndex`], the spoke's answer to the snapshot, and usage records into the
//! [`UsageTally`], each acknowledged) until either side ends. Its task belongs to the
//! hub's task tracker and ends on shutdown, on the spoke closing, or when a newer stream of
//! the same cluster supersedes it; the fleet view's session ends with it.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use switchyard_proto::tls::{cluster_of, is_dns_label};
use switchyard_proto::v1::federation_server::Federation;
use switchyard_proto::v1::{
    ConfigSnapshot, Hello, HubMessage, SpokeMessage, UsageAck, Welcome, hub_message, spoke_message,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use crate::fleet::{FleetView, Report};
use crate::metric_names as m;
use crate::prefix::PrefixIndex;
use crate::usage::UsageTally;
use switchyard_gateway::metrics::Metrics;

/// Longest the hub waits for a hello after the handshake.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The service's shared state.
pub struct FederationService {
    /// The hub replica's name (in welcomes and status).
    pub hub: String,
    /// How often spokes report.
    pub load_interval: Duration,
    /// The fleet view sessions write.
    pub fleet: Arc<FleetView>,
    /// The prefix index the coarse reports feed.
    pub prefix: Arc<PrefixIndex>,
    /// Usage records applied from the spokes.
    pub usage: Arc<UsageTally>,
    /// The fleet-wide configuration every spoke is sent (none without a configuration).
    pub config: Option<Arc<ConfigSnapshot>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Owner of the session tasks.
    pub tasks: TaskTracker,
    /// Hub shutdown.
    pub stop: CancellationToken,
}

impl FederationService {
    fn refuse(&self, reason: &'static str, status: Status) -> Status {
        self.metrics.inc(m::REFUSED_TOTAL, &[("reason", reason)], 1.0);
        tracing::warn!(reason, message = status.message(), "spoke stream refused");
        status
    }
}

/// Checks a hello's own consistency (the cluster is checked against the certificate apart).
fn check_hello(hello: &Hello) -> Result<(), String> {
    if !hello.region.is_empty() && !is_dns_label(&hello.region) {
        return Err(format!("region {:?} is not a DNS label", hello.region));
    }
    if !(hello.front_door_url.starts_with("http://") || hello.front_door_url.starts_with("https://")) {
        return Err(format!("front_door_url {:?} is not an http(s) URL", hello.front_door_url));
    }
    let mut names = std::collections::BTreeSet::new();
    for ws in &hello.worker_sets {
        if ws.name.is_empty() || ws.served_model.is_empty() {
            return Err("a worker set without a name or a served model".into());
        }
        if ws.kv_block_size == 0 {
            return Err(format!("worker set {:?}: kv_block_size 0", ws.name));
        }
        if !names.insert(&ws.name) {
            return Err(format!("worker set {:?} listed twice", ws.name));
        }
    }
    Ok(())
}

type HubStream = Pin<Box<dyn Stream<Item = Result<HubMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Federation for FederationService {
    type LinkStream = HubStream;

    async fn link(&self, request: Request<Streaming<SpokeMessage>>) -> Result<Response<HubStream>, Status> {
        let certs = request.peer_certs();
        let Some(cert) = certs.as_ref().and_then(|c| c.first()) else {
            return Err(self.refuse("identity", Status::unauthenticated("a client certificate is required")));
        };
        let cluster = cluster_of(cert).map_err(|e| self.refuse("identity", Status::unauthenticated(e.to_string())))?;
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await;
        let hello = match first {
            Ok(Ok(Some(SpokeMessage { kind: Some(spoke_message::Kind::Hello(h)) }))) => h,
            Ok(Err(status)) => return Err(status),
            Err(_) => return Err(self.refuse("protocol", Status::deadline_exceeded("no hello within 10 s"))),
            Ok(Ok(_)) => {
                return Err(self.refuse("protocol", Status::invalid_argument("the first message must be a hello")));
            }
        };
        if hello.cluster != cluster {
            return Err(self.refuse(
                "cluster_mismatch",
                Status::permission_denied(format!(
                    "the client certificate is cluster {cluster:?}'s; the hello claims {:?}",
                    hello.cluster
                )),
            ));
        }
        check_hello(&hello).map_err(|e| self.refuse("protocol", Status::invalid_argument(e)))?;

        let session = self.fleet.connect(hello, Instant::now());
        self.metrics.inc(m::SESSIONS_TOTAL, &[("cluster", &cluster)], 1.0);
        tracing::info!(%cluster, session, "spoke connected");
        let (tx, rx) = mpsc::channel(4);
        let welcome = Welcome {
            hub: self.hub.clone(),
            load_interval_ms: self.load_interval.as_millis() as u32,
            lost_after_ms: self.fleet.lost_after().as_millis() as u32,
        };
        let _ = tx.send(Ok(HubMessage { kind: Some(hub_message::Kind::Welcome(welcome)) })).await;
        if let Some(config) = &self.config {
            let _ = tx.send(Ok(HubMessage { kind: Some(hub_message::Kind::Config(config.as_ref().clone())) })).await;
        }

        let (fleet, metrics, stop) = (self.fleet.clone(), self.metrics.clone(), self.stop.clone());
        let prefix = self.prefix.clone();
        let usage = self.usage.clone();
        self.tasks.spawn(async move {
            let ended = loop {
                let msg = tokio::select! {
                    m = inbound.message() => m,
                    () = stop.cancelled() => break "hub shutting down",
                    () = tx.closed() => break "response stream dropped",
                };
                match msg {
                    Ok(Some(SpokeMessage { kind: Some(spoke_message::Kind::Load(report)) })) => {
                        match fleet.report(&cluster, session, report, Instant::now()) {
                            Report::Applied => metrics.inc(m::LOAD_REPORTS_TOTAL, &[("cluster", &cluster)], 1.0),
                            Report::Superseded => break "superseded by a newer stream",
                        }
                    }
                    Ok(Some(SpokeMessage { kind: Some(spoke_message::Kind::Coarse(report)) })) => {
                        // A superseded stream's copy would overwrite the newer stream's.
                        if !fleet.is_current(&cluster, session) {
                            break "superseded by a newer stream";
                        }
                        let bytes = prost::Message::encoded_len(&report) as f64;
                        prefix.apply(&cluster, &report).await;
                        metrics.inc(m::COARSE_REPORTS_TOTAL, &[("cluster", &cluster)], 1.0);
                        metrics.inc(m::COARSE_BYTES_TOTAL, &[("cluster", &cluster)], bytes);
                    }
                    Ok(Some(SpokeMessage { kind: Some(spoke_message::Kind::Usage(report)) })) => {
                        if !fleet.is_current(&cluster, session) {
                            break "superseded by a newer stream";
                        }
                        let through = usage.apply(&cluster, &report, &metrics, Instant::now());
                        let ack = UsageAck { instance: report.instance, through_sequence: through };
                        if tx.send(Ok(HubMessage { kind: Some(hub_message::Kind::UsageAck(ack)) })).await.is_err() {
                            break "response stream dropped";
                        }
                    }
                    Ok(Some(SpokeMessage { kind: Some(spoke_message::Kind::ConfigAck(ack)) })) => {
                        let outcome = if ack.applied { "applied" } else { "refused" };
                        if ack.applied {
                            tracing::info!(%cluster, version = %ack.version, "spoke serves the hub's configuration");
                        } else {
                            tracing::warn!(%cluster, version = %ack.version, error = %ack.error, "spoke refused the hub's configuration");
                        }
                        if fleet.config_ack(&cluster, session, ack) == Report::Superseded {
                            break "superseded by a newer stream";
                        }
                        metrics.inc(m::CONFIG_ACKS_TOTAL, &[("cluster", &cluster), ("outcome", outcome)], 1.0);
                    }
                    Ok(Some(_)) => {
                        let _ = tx.send(Err(Status::invalid_argument("hello may be sent only once"))).await;
                        break "protocol error";
                    }
                    Ok(None) => break "closed by the spoke",
                    Err(_) => break "stream error",
                }
            };
            fleet.disconnect(&cluster, session);
            tracing::info!(%cluster, session, ended, "spoke stream ended");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
