//! The spoke agent: precise KV-cache-aware routing over one cluster's vLLM workers.
//!
//! Wiring (each part documents its own invariants):
//! [`source`] publishes configuration snapshots ([`topology::Topology`]) → [`registry`]
//! reconciles live workers (per worker: [`kv_subscriber`] feeding the set's [`index`], and a
//! [`load`] scraper) → the gateway's front door (OpenAI and Anthropic) with [`http`]'s
//! backend: [`tokenize`], index lookup, the shared planning step, booking, and observers for
//! [`fidelity`], [`calibration`] and the load ledger. With a hub, [`hub_client`] keeps one
//! mutual-TLS stream to it and reports this cluster's load; the front door never waits on it.
//! Every task has an owner and stops on [`Spoke::shutdown`].

pub mod calibration;
pub mod cli_args;
pub mod coarse;
pub mod fidelity;
pub mod hold;
pub mod http;
pub mod hub_client;
pub mod index;
pub mod kv_subscriber;
pub mod kv_wire;
pub mod load;
pub mod metric_names;
pub mod metrics;
pub mod registry;
pub mod source;
pub mod telemetry;
pub mod tokenize;
pub mod topology;
pub mod usage;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use switchyard_gateway::admission::CpuPool;
use switchyard_gateway::server::{FrontDoor, api_router, serve};

use crate::http::{App, Limits, SpokeBackend};
use crate::registry::Registry;
use crate::source::SourceStatus;
use switchyard_providers::spill::{SpillMetricNames, Spillover};
use switchyard_providers::{Providers, SecretFiles};

/// Default listen address: loopback only unless configured.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default admin address (status, metrics, decision traces): loopback, apart from the API.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
/// Default configuration poll interval.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// Spoke settings.
#[derive(Debug, Clone)]
pub struct SpokeConfig {
    /// Front door address.
    pub listen: SocketAddr,
    /// Admin endpoints' address.
    pub admin_listen: SocketAddr,
    /// Configuration files or directories.
    pub config_paths: Vec<PathBuf>,
    /// How often to look for configuration changes.
    pub reload_interval: Duration,
    /// Request-path limits.
    pub limits: Limits,
    /// Where Kubernetes Secrets referenced by providers are mounted (`DIR/NAME/KEY`).
    pub secrets_dir: Option<PathBuf>,
    /// The hub to report to, if any.
    pub hub: Option<hub_client::HubLink>,
}

impl SpokeConfig {
    /// Settings with default limits and loopback listeners on ephemeral ports (tests, benches).
    pub fn loopback(config_paths: Vec<PathBuf>) -> SpokeConfig {
        SpokeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            config_paths,
            reload_interval: DEFAULT_RELOAD_INTERVAL,
            limits: Limits::default(),
            secrets_dir: None,
            hub: None,
        }
    }
}

/// Why the spoke could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The initial configuration is unusable.
    #[error(transparent)]
    Config(#[from] source::SourceError),
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client could not be built.
    #[error("http client: {0}")]
    Client(String),
}

/// A running spoke.
pub struct Spoke {
    /// Where the front door listens.
    pub addr: SocketAddr,
    /// Where the admin endpoints listen.
    pub admin_addr: SocketAddr,
    /// Shared state (tests inspect it).
    pub app: Arc<App>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    registry: Arc<Registry>,
}

async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| StartError::Listen { addr, source })?;
    let bound = listener.local_addr().map_err(|source| StartError::Listen { addr, source })?;
    Ok((listener, bound))
}

/// The providers' configuration, for change detection.
fn providers_key(topo: &topology::Topology) -> String {
    serde_json::to_string(&topo.fleet.providers).unwrap_or_default()
}

/// Clients for the configuration's providers; one that cannot be built is logged and stays
/// unavailable.
async fn build_providers(
    topo: &topology::Topology,
    secrets: &SecretFiles,
    client: &reqwest::Client,
    bounds: switchyard_gateway::upstream::ResponseBounds,
) -> Providers {
    let (providers, failures) = Providers::build(&topo.fleet, secrets, client.clone(), bounds).await;
    for (name, error) in failures {
        tracing::error!(provider = %name, %error, "provider unavailable: its client could not be built");
    }
    providers
}

impl Spoke {
    /// Loads the configuration, starts every worker's tasks, the front door and the admin
    /// listener.
    pub async fn start(cfg: SpokeConfig) -> Result<Spoke, StartError> {
        let topo = Arc::new(source::load(&cfg.config_paths, 1)?);
        let shutdown = CancellationToken::new();
        let client = reqwest::Client::builder()
            .connect_timeout(cfg.limits.connect_timeout)
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| StartError::Client(e.to_string()))?;
        let registry = Arc::new(Registry::new(client.clone(), shutdown.child_token(), cfg.limits.max_kv_message_bytes));
        registry.reconcile(&topo).await;
        let secrets = SecretFiles { dir: cfg.secrets_dir.clone() };
        let providers = build_providers(&topo, &secrets, &client, cfg.limits.bounds).await;
        let (tx, rx) = watch::channel(topo);
        let status = Arc::new(Mutex::new(SourceStatus { generation: 1, ..SourceStatus::default() }));
        // The hub link's snapshots go through the source task, the channel's only writer.
        let (pushes, pushed) = tokio::sync::mpsc::channel(1);
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(source::watch_dir(
            cfg.config_paths.clone(),
            cfg.reload_interval,
            tx,
            status.clone(),
            pushed,
            shutdown.clone(),
        )));
        let cpu = CpuPool::new(cfg.limits.cpu_threads);
        let metrics = Arc::new(metrics::spoke_metrics());
        let app = Arc::new(App {
            registry: registry.clone(),
            topology: rx.clone(),
            client,
            metrics: metrics.clone(),
            decisions: Mutex::new(VecDeque::new()),
            next_request: AtomicU64::new(0),
            limits: cfg.limits.clone(),
            source_status: status,
            cpu: cpu.clone(),
            holds: hold::HoldLines::default(),
            providers: std::sync::RwLock::new(Arc::new(providers)),
            spill: Arc::new(Spillover::new(
                metrics.clone(),
                SpillMetricNames {
                    requests_total: metric_names::PROVIDER_REQUESTS_TOTAL,
                    cost_usd_total: metric_names::PROVIDER_COST_USD_TOTAL,
                },
            )),
            hub: cfg.hub.as_ref().map(|_| Arc::new(Mutex::new(hub_client::HubStatus::default()))),
            usage: cfg.hub.as_ref().map(|_| Arc::new(usage::UsageOutbox::fresh())),
        });

        // Reconcile on every published snapshot; rebuild the providers' clients when their
        // resources change (the old clients finish the requests they carry).
        {
            let registry = registry.clone();
            let app = app.clone();
            let mut rx = rx.clone();
            let stop = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                let mut providers_seen = providers_key(&rx.borrow());
                loop {
                    tokio::select! {
                        changed = rx.changed() => if changed.is_err() { return },
                        () = stop.cancelled() => return,
                    }
                    let topo = rx.borrow_and_update().clone();
                    registry.reconcile(&topo).await;
                    let key = providers_key(&topo);
                    if key != providers_seen {
                        providers_seen = key;
                        let built = build_providers(&topo, &secrets, &app.client, app.limits.bounds).await;
                        if let Ok(mut slot) = app.providers.write() {
                            *slot = Arc::new(built);
                        }
                    }
                }
            }));
        }
        let (listener, addr) = bind(cfg.listen).await?;
        let (admin_listener, admin_addr) = bind(cfg.admin_listen).await?;
        if let (Some(mut link), Some(status)) = (cfg.hub.clone(), app.hub.clone()) {
            link.front_door_url.get_or_insert_with(|| format!("http://{addr}"));
            tasks.push(tokio::spawn(hub_client::run(app.clone(), link, status, pushes, shutdown.clone())));
        }
        let front = Arc::new(FrontDoor::new(SpokeBackend(app.clone()), cpu, cfg.limits.front.clone()));
        let expired = front.expired.clone();
        tasks.push(tokio::spawn(serve(
            listener,
            api_router(front),
            cfg.limits.serve,
            shutdown.clone(),
            expired.clone(),
        )));
        tasks.push(tokio::spawn(serve(
            admin_listener,
            http::admin_router(app.clone()),
            cfg.limits.serve,
            shutdown.clone(),
            expired,
        )));
        Ok(Spoke { addr, admin_addr, app, shutdown, tasks, registry })
    }

    /// Stops accepting, drains in-flight requests up to the drain deadline (then ends the
    /// remaining streams with an error event), and stops the configuration watcher and every
    /// worker task.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        // Servers first: in-flight streams still need their workers while draining.
        for t in self.tasks {
            let _ = t.await;
        }
        self.registry.shutdown().await;
    }
}
