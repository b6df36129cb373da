//! The hub's admin endpoints, on their own listener: `/status` (the fleet view as JSON),
//! `/metrics` (Prometheus text), `/healthz` and `/readyz` (200 once a cluster is live).

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use switchyard_gateway::metrics::{self, Metrics, labels};

use crate::fleet::FleetView;
use crate::metric_names as m;

/// What the admin handlers read.
#[derive(Clone)]
pub struct AdminState {
    /// The replica's name.
    pub name: String,
    /// The fleet view.
    pub fleet: Arc<FleetView>,
    /// Recorded metrics.
    pub metrics: Arc<Metrics>,
    /// The batch queue.
    pub batch: Arc<crate::batch::BatchQueue>,
    /// External providers (breakers, caps).
    pub providers: Arc<switchyard_providers::Providers>,
    /// The spillover ledger.
    pub spill: Arc<switchyard_providers::spill::Spillover>,
    /// The cross-cluster prefix index.
    pub prefix: Arc<crate::prefix::PrefixIndex>,
    /// Usage records applied from the spokes.
    pub usage: Arc<crate::usage::UsageTally>,
}

/// The admin routes.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn status(State(s): State<AdminState>) -> Response {
    let now = Instant::now();
    axum::Json(json!({
        "hub": s.name,
        "lostAfterMs": s.fleet.lost_after().as_millis() as u64,
        "liveClusters": s.fleet.live(now).iter().map(|c| c.cluster.clone()).collect::<Vec<_>>(),
        "batchQueue": {"waiting": s.batch.depth(), "maxWaitSeconds": s.batch.max_wait().as_secs()},
        "providers": s.providers.status(),
        "spillover": s.spill.status(),
        "clusters": s.fleet.status(now),
        "usage": s.usage.status(),
        "prefixIndex": s.prefix.held().into_iter()
            .map(|((cluster, set), blocks)| json!({"cluster": cluster, "workerSet": set, "coarseBlocks": blocks}))
            .collect::<Vec<_>>(),
    }))
    .into_response()
}

async fn readyz(State(s): State<AdminState>) -> StatusCode {
    if s.fleet.live(Instant::now()).is_empty() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK }
}

async fn render_metrics(State(s): State<AdminState>) -> Response {
    let live = s.fleet.live(Instant::now()).len() as f64;
    let connected = s.fleet.connected() as f64;
    let mut gauges = vec![
        (m::CLUSTERS, labels(&[("state", "live")]), live),
        (m::CLUSTERS, labels(&[("state", "connected")]), connected),
        (m::BATCH_QUEUE_DEPTH, labels(&[]), s.batch.depth() as f64),
    ];
    for ((cluster, set), blocks) in s.prefix.held() {
        gauges.push((m::PREFIX_BLOCKS, labels(&[("cluster", &cluster), ("worker_set", &set)]), blocks as f64));
    }
    ([(CONTENT_TYPE, metrics::CONTENT_TYPE)], s.metrics.render(&[], &gauges)).into_response()
}
