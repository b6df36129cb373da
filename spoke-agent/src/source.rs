//! Configuration as a stream of snapshots.
//!
//! The directory source re-reads the YAML (the same files `switchyard validate` checks) when
//! any file's size or modification time changes, validates it, and publishes a new
//! [`Topology`] on a `watch` channel. An invalid change is reported and ignored: the last good
//! configuration keeps serving. A Kubernetes watcher will publish on the same channel.
//!
//! With a hub, the hub's fleet-wide resources (policies, providers, pools, backends) arrive
//! as [`Push`]es from [`crate::hub_client`] and are composed with the files' worker sets
//! ([`switchyard_config::federated`]). This task stays the only writer of the channel: a
//! push is applied here, in order with file changes, and answered on its `done` channel.
//! The last applied push stays in force when the hub goes away, and file changes are
//! composed with it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::topology::Topology;

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Files unreadable.
    #[error(transparent)]
    Load(#[from] switchyard_config::LoadError),
    /// Validation failed.
    #[error("configuration has {count} error(s):\n{rendered}")]
    Invalid {
        /// Number of errors.
        count: usize,
        /// Rendered diagnostics.
        rendered: String,
    },
}

/// The hub's fleet-wide documents, as its snapshot carried them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubConfig {
    /// Content version.
    pub version: String,
    /// (label, YAML text) pairs.
    pub documents: Vec<(String, String)>,
}

/// A snapshot to apply, and where to say whether it was.
#[derive(Debug)]
pub struct Push {
    /// The snapshot.
    pub config: HubConfig,
    /// `Ok` once served (now or already), else why it was refused.
    pub done: oneshot::Sender<Result<(), String>>,
}

/// Loads and validates the configuration at `paths` into generation `generation`.
pub fn load(paths: &[PathBuf], generation: u64) -> Result<Topology, SourceError> {
    load_with(paths, None, generation)
}

/// Loads and validates the configuration at `paths`, composed with the hub's documents if
/// any, into generation `generation`.
pub fn load_with(paths: &[PathBuf], hub: Option<&HubConfig>, generation: u64) -> Result<Topology, SourceError> {
    let checked = match hub {
        None => switchyard_config::check_paths(paths)?,
        Some(hub) => switchyard_config::federated::check_composed(paths, &hub.documents)?,
    };
    if checked.error_count() > 0 {
        let rendered: Vec<String> =
            checked.diagnostics.iter().filter(|d| d.is_error()).map(ToString::to_string).collect();
        return Err(SourceError::Invalid { count: checked.error_count(), rendered: rendered.join("\n") });
    }
    Ok(Topology::build(generation, checked.config, &checked.resources))
}

fn fingerprint(paths: &[PathBuf]) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    fn walk(p: &Path, out: &mut Vec<(PathBuf, u64, Option<SystemTime>)>) {
        let Ok(meta) = std::fs::metadata(p) else { return };
        if meta.is_file() {
            out.push((p.to_owned(), meta.len(), meta.modified().ok()));
        } else if let Ok(entries) = std::fs::read_dir(p) {
            for e in entries.flatten() {
                walk(&e.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    for p in paths {
        walk(p, &mut out);
    }
    out.sort();
    out
}

/// The last reload problem, for `/status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SourceStatus {
    /// Generation serving now.
    pub generation: u64,
    /// Why the last change was refused, if it was.
    pub last_error: Option<String>,
    /// Version of the hub's configuration composed into it, if any.
    pub hub_config_version: Option<String>,
}

/// Polls `paths` every `interval`, applies the hub's `pushes`, and publishes valid changes on
/// `tx` until `shutdown`.
pub async fn watch_dir(
    paths: Vec<PathBuf>,
    interval: Duration,
    tx: watch::Sender<Arc<Topology>>,
    status: Arc<Mutex<SourceStatus>>,
    mut pushes: mpsc::Receiver<Push>,
    shutdown: CancellationToken,
) {
    let mut seen = fingerprint(&paths);
    let mut generation = tx.borrow().generation;
    let mut hub: Option<HubConfig> = None;
    let mut pushes_open = true;
    loop {
        let mut push = tokio::select! {
            () = tokio::time::sleep(interval) => None,
            p = pushes.recv(), if pushes_open => match p {
                Some(p) => Some(p),
                None => { pushes_open = false; continue }
            },
            () = shutdown.cancelled() => return,
        };
        if let Some(p) = push.take_if(|p| hub.as_ref().is_some_and(|h| h.version == p.config.version)) {
            let _ = p.done.send(Ok(()));
            continue;
        }
        let candidate = match &push {
            Some(p) => {
                seen = fingerprint(&paths);
                Some(p.config.clone())
            }
            None => {
                let now = fingerprint(&paths);
                if now == seen {
                    continue;
                }
                seen = now;
                hub.clone()
            }
        };
        let outcome = load_with(&paths, candidate.as_ref(), generation + 1);
        let result = match outcome {
            Ok(topo) => {
                generation += 1;
                let version = candidate.as_ref().map(|c| c.version.clone());
                tracing::info!(generation, hub_config = version.as_deref().unwrap_or("none"), "configuration reloaded");
                if let Ok(mut s) = status.lock() {
                    *s = SourceStatus { generation, last_error: None, hub_config_version: version };
                }
                hub = candidate;
                let _ = tx.send(Arc::new(topo));
                Ok(())
            }
            Err(e) => {
                let what = if push.is_some() { "the hub's configuration" } else { "configuration change" };
                tracing::warn!(error = %e, "{what} refused; keeping the last good one");
                if let Ok(mut s) = status.lock() {
                    s.last_error = Some(e.to_string());
                }
                Err(e.to_string())
            }
        };
        if let Some(p) = push {
            let _ = p.done.send(result);
        }
    }
}
