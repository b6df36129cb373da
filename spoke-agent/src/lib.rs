//! The spoke agent: precise KV-cache-aware routing over one cluster's vLLM workers.
//!
//! Wiring (each part documents its own invariants):
//! [`source`] publishes configuration snapshots ([`topology::Topology`]) → [`registry`]
//! reconciles live workers (per worker: [`kv_subscriber`] feeding the set's [`index`], and a
//! [`load`] scraper) → [`http`] serves the OpenAI API: [`tokenize`], index lookup, the pure
//! policy engine from `switchyard-core`, booking, forwarding, [`fidelity`] and
//! [`calibration`] from each response. Every task has an owner and stops on [`Spoke::shutdown`].

pub mod calibration;
pub mod fidelity;
pub mod http;
pub mod index;
pub mod kv_subscriber;
pub mod load;
pub mod metric_names;
pub mod metrics;
pub mod registry;
pub mod source;
pub mod tokenize;
pub mod topology;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::http::{App, Limits};
use crate::registry::Registry;
use crate::source::SourceStatus;

/// Default listen address: loopback only unless configured.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default configuration poll interval.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// Spoke settings.
#[derive(Debug, Clone)]
pub struct SpokeConfig {
    /// Front door address.
    pub listen: SocketAddr,
    /// Configuration files or directories.
    pub config_paths: Vec<PathBuf>,
    /// How often to look for configuration changes.
    pub reload_interval: Duration,
    /// Front-door limits.
    pub limits: Limits,
}

/// Why the spoke could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The initial configuration is unusable.
    #[error(transparent)]
    Config(#[from] source::SourceError),
    /// The listener could not bind.
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
    /// Shared state (tests inspect it).
    pub app: Arc<App>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    registry: Arc<Registry>,
}

impl Spoke {
    /// Loads the configuration, starts every worker's tasks and the front door.
    pub async fn start(cfg: SpokeConfig) -> Result<Spoke, StartError> {
        let topo = Arc::new(source::load(&cfg.config_paths, 1)?);
        let shutdown = CancellationToken::new();
        let client = reqwest::Client::builder()
            .connect_timeout(cfg.limits.connect_timeout)
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| StartError::Client(e.to_string()))?;
        let registry = Arc::new(Registry::new(client.clone(), shutdown.child_token()));
        registry.reconcile(&topo).await;
        let (tx, rx) = watch::channel(topo);
        let status = Arc::new(Mutex::new(SourceStatus { generation: 1, last_error: None }));
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(source::watch_dir(
            cfg.config_paths.clone(),
            cfg.reload_interval,
            tx,
            status.clone(),
            shutdown.clone(),
        )));
        // Reconcile on every published snapshot.
        {
            let registry = registry.clone();
            let mut rx = rx.clone();
            let stop = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        changed = rx.changed() => if changed.is_err() { return },
                        () = stop.cancelled() => return,
                    }
                    let topo = rx.borrow_and_update().clone();
                    registry.reconcile(&topo).await;
                }
            }));
        }
        let app = Arc::new(App {
            registry: registry.clone(),
            topology: rx,
            client,
            metrics: metrics::Metrics::default(),
            decisions: Mutex::new(VecDeque::new()),
            next_request: AtomicU64::new(0),
            limits: cfg.limits.clone(),
            source_status: status,
        });
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| StartError::Listen { addr: cfg.listen, source })?;
        let addr = listener.local_addr().map_err(|source| StartError::Listen { addr: cfg.listen, source })?;
        let router = http::router(app.clone());
        // Token-by-token streaming writes small frames; without TCP_NODELAY, Nagle's algorithm
        // holds them back until the peer's delayed ACK (~40 ms on Linux).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let stop = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(async move { stop.cancelled().await }).await;
        }));
        Ok(Spoke { addr, app, shutdown, tasks, registry })
    }

    /// Stops the front door, the configuration watcher and every worker task.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.registry.shutdown().await;
        for t in self.tasks {
            let _ = t.await;
        }
    }
}
