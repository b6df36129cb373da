//! The hub: the global side of the federation.
//!
//! Wiring: [`listener`] accepts TCP and completes mutual TLS (the CA's client certificates
//! only, files reloaded on change) → tonic serves [`federation`]'s `Link` on those streams
//! → each stream's session writes its cluster's hello and load reports into the
//! [`fleet::FleetView`] → the front door (the gateway's OpenAI and Anthropic dialects) plans
//! each request over that view with [`route`] and forwards it to the chosen cluster's spoke →
//! the admin listener ([`admin`]) shows the view and the metrics.
//!
//! Every task (the accept loop, handshakes, sessions, the certificate watcher, the servers)
//! belongs to the hub's task tracker and ends on [`Hub::shutdown`]. Nothing here holds state
//! a second replica could not rebuild from the spokes' own streams: a spoke that loses its
//! hub dials again, and says hello to whichever replica answers.

pub mod admin;
pub mod batch;
pub mod federation;
pub mod fleet;
pub mod listener;
pub mod metric_names;
pub mod prefix;
pub mod prompt;
pub mod route;
pub mod sent;
pub mod usage;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use switchyard_gateway::admission::CpuPool;
use switchyard_gateway::metrics::Metrics;
use switchyard_gateway::server::{FrontDoor, ServeConfig, api_router, serve};
use switchyard_proto::tls::{ReloadingServerConfig, TlsError, TlsFiles};
use switchyard_proto::v1::federation_server::FederationServer;
use switchyard_proto::v1::{ConfigDocument, ConfigSnapshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::federation::FederationService;
use crate::fleet::FleetView;

/// Default front-door (OpenAI and Anthropic API) address: loopback unless configured.
pub const DEFAULT_API_LISTEN: &str = "127.0.0.1:8000";
/// Default federation (gRPC) address: loopback unless configured.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8443";
/// Default admin address (status, metrics): loopback, apart from the federation port.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9443";
/// How often spokes report their load by default.
pub const DEFAULT_LOAD_INTERVAL: Duration = Duration::from_millis(500);
/// After this long without a report a cluster is not chosen (the bound is 3 s:
/// four missed reports at the default interval).
pub const DEFAULT_LOST_AFTER: Duration = Duration::from_secs(2);
/// Longest a queued batch request waits for capacity by default.
pub const DEFAULT_BATCH_MAX_WAIT: Duration = Duration::from_secs(600);
/// How often the certificate files are checked for a rotation.
pub const CERT_RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// Hub settings.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// This replica's name (welcomes, status).
    pub name: String,
    /// Front-door address.
    pub api_listen: SocketAddr,
    /// The fleet configuration (files or directories): worker sets of every cluster, pools,
    /// public models, aliases, policies. Without it the front door serves no model.
    pub config_paths: Vec<PathBuf>,
    /// Front-door limits (body, concurrency, upstream timeouts).
    pub front: switchyard_gateway::server::Limits,
    /// Federation (gRPC over mutual TLS) address.
    pub listen: SocketAddr,
    /// Admin address.
    pub admin_listen: SocketAddr,
    /// The hub's certificate, key and the CA that signs the spokes' certificates.
    pub tls: TlsFiles,
    /// Spokes' report interval.
    pub load_interval: Duration,
    /// Silence after which a cluster is not chosen.
    pub lost_after: Duration,
    /// Certificate rotation check interval.
    pub cert_reload_interval: Duration,
    /// Longest a queued batch request waits for capacity.
    pub batch_max_wait: Duration,
    /// Where Kubernetes Secrets referenced by providers are mounted (`DIR/NAME/KEY`).
    pub secrets_dir: Option<PathBuf>,
    /// How clusters are chosen (cache-aware unless benchmarking a baseline).
    pub cluster_choice: route::ClusterChoice,
}

impl HubConfig {
    /// Defaults with loopback listeners on ephemeral ports (tests).
    pub fn loopback(tls: TlsFiles) -> HubConfig {
        HubConfig {
            name: "hub".into(),
            api_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            config_paths: Vec::new(),
            front: switchyard_gateway::server::Limits::default(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls,
            load_interval: DEFAULT_LOAD_INTERVAL,
            lost_after: DEFAULT_LOST_AFTER,
            cert_reload_interval: CERT_RELOAD_INTERVAL,
            batch_max_wait: DEFAULT_BATCH_MAX_WAIT,
            secrets_dir: None,
            cluster_choice: route::ClusterChoice::CacheAware,
        }
    }
}

/// Why the hub could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The certificate files are unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The fleet configuration is unreadable or invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// The HTTP client could not be built.
    #[error("http client: {0}")]
    Client(String),
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A running hub.
pub struct Hub {
    /// Where clients send requests.
    pub api_addr: SocketAddr,
    /// Where spokes dial.
    pub addr: SocketAddr,
    /// Where the admin endpoints listen.
    pub admin_addr: SocketAddr,
    /// The fleet view (tests inspect it).
    pub fleet: Arc<FleetView>,
    stop: CancellationToken,
    tasks: TaskTracker,
    servers: Vec<JoinHandle<()>>,
}

async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| StartError::Listen { addr, source })?;
    let bound = listener.local_addr().map_err(|source| StartError::Listen { addr, source })?;
    Ok((listener, bound))
}

/// Loads and validates the fleet configuration (empty without paths).
fn load_fleet(paths: &[PathBuf]) -> Result<switchyard_config::Checked, StartError> {
    if paths.is_empty() {
        return Ok(switchyard_config::Checked::default());
    }
    let checked = switchyard_config::check_paths(paths).map_err(|e| StartError::Config(e.to_string()))?;
    if checked.error_count() > 0 {
        let rendered: Vec<String> =
            checked.diagnostics.iter().filter(|d| d.is_error()).map(ToString::to_string).collect();
        return Err(StartError::Config(rendered.join("\n")));
    }
    Ok(checked)
}

impl Hub {
    /// Loads the certificates and the configuration, and starts the front door, the
    /// federation and the admin listeners.
    pub async fn start(cfg: HubConfig) -> Result<Hub, StartError> {
        let tls = Arc::new(ReloadingServerConfig::load(cfg.tls.clone())?);
        let checked = load_fleet(&cfg.config_paths)?;
        // What every spoke is sent; a hub without configuration sends nothing.
        let pushed = (!cfg.config_paths.is_empty()).then(|| {
            let docs = switchyard_config::federated::fleet_documents(&checked.resources);
            tracing::info!(version = %docs.version, documents = docs.documents.len(), "fleet-wide configuration for the spokes");
            Arc::new(ConfigSnapshot {
                version: docs.version,
                documents: docs.documents.into_iter().map(|(label, text)| ConfigDocument { label, text }).collect(),
            })
        });
        let fleet_config = checked.config;
        let (tokenizers, failures) = prompt::PromptTokenizers::load(&checked.resources);
        for (set, error) in failures {
            tracing::error!(worker_set = %set, %error, "tokenizer unavailable at the hub: the set is chosen by load");
        }
        let (api_listener, api_addr) = bind(cfg.api_listen).await?;
        let (listener, addr) = bind(cfg.listen).await?;
        let (admin_listener, admin_addr) = bind(cfg.admin_listen).await?;
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        let metrics = Arc::new(Metrics::new(metric_names::CATALOGUE));
        let fleet = Arc::new(FleetView::new(cfg.lost_after));
        let prefix = Arc::new(prefix::PrefixIndex::new());
        let usage = Arc::new(usage::UsageTally::new());

        tasks.spawn(tls.clone().watch(cfg.cert_reload_interval, stop.clone()));
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tasks.spawn(listener::accept_loop(listener, tls, tx, metrics.clone(), tasks.clone(), stop.clone()));

        let service = FederationService {
            hub: cfg.name.clone(),
            load_interval: cfg.load_interval,
            fleet: fleet.clone(),
            prefix: prefix.clone(),
            config: pushed,
            usage: usage.clone(),
            metrics: metrics.clone(),
            tasks: tasks.clone(),
            stop: stop.clone(),
        };
        let grpc = tonic::transport::Server::builder()
            // Dead peers are found by the transport too, not only by missing reports.
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(5)))
            .add_service(FederationServer::new(service))
            .serve_with_incoming_shutdown(ReceiverStream::new(rx), stop.clone().cancelled_owned());
        let mut servers = Vec::new();
        servers.push(tokio::spawn(async move {
            if let Err(error) = grpc.await {
                tracing::error!(%error, "federation server failed");
            }
        }));
        let batch = Arc::new(batch::BatchQueue::new(cfg.batch_max_wait));
        let cpu = CpuPool::new(0);
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| StartError::Client(e.to_string()))?;
        let bounds = switchyard_gateway::upstream::ResponseBounds::default();
        let secrets = switchyard_providers::SecretFiles { dir: cfg.secrets_dir.clone() };
        let (providers, failures) =
            switchyard_providers::Providers::build(&fleet_config, &secrets, client.clone(), bounds).await;
        for (name, error) in failures {
            tracing::error!(provider = %name, %error, "provider unavailable: its client could not be built");
        }
        let providers = Arc::new(providers);
        let spill = Arc::new(switchyard_providers::spill::Spillover::new(
            metrics.clone(),
            switchyard_providers::spill::SpillMetricNames {
                requests_total: metric_names::PROVIDER_REQUESTS_TOTAL,
                cost_usd_total: metric_names::PROVIDER_COST_USD_TOTAL,
            },
        ));
        let backend = route::HubBackend {
            fleet: Arc::new(route::cluster_fleet(&fleet_config)),
            view: fleet.clone(),
            client,
            bounds,
            requests: Default::default(),
            batch: batch.clone(),
            sent: Default::default(),
            metrics: metrics.clone(),
            providers: providers.clone(),
            spill: spill.clone(),
            prefix: prefix.clone(),
            tokenizers: Arc::new(tokenizers),
            cpu: cpu.clone(),
            choice: cfg.cluster_choice,
        };
        let front = Arc::new(FrontDoor::new(backend, cpu, cfg.front.clone()));
        let expired = front.expired.clone();
        servers.push(tokio::spawn(serve(
            api_listener,
            api_router(front),
            ServeConfig::default(),
            stop.clone(),
            expired,
        )));
        let admin = admin::router(admin::AdminState {
            name: cfg.name,
            fleet: fleet.clone(),
            metrics,
            batch,
            providers,
            spill,
            prefix,
            usage,
        });
        let admin_stop = stop.clone();
        servers.push(tokio::spawn(async move {
            let served = axum::serve(admin_listener, admin).with_graceful_shutdown(admin_stop.cancelled_owned()).await;
            if let Err(error) = served {
                tracing::error!(%error, "admin server failed");
            }
        }));
        Ok(Hub { api_addr, addr, admin_addr, fleet, stop, tasks, servers })
    }

    /// Stops accepting, ends every spoke stream and waits for every task.
    pub async fn shutdown(self) {
        self.stop.cancel();
        self.tasks.close();
        for server in self.servers {
            let _ = server.await;
        }
        self.tasks.wait().await;
    }
}
