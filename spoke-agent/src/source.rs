//! Configuration as a stream of snapshots.
//!
//! The directory source re-reads the YAML (the same files `switchyard validate` checks) when
//! any file's size or modification time changes, validates it, and publishes a new
//! [`Topology`] on a `watch` channel. An invalid change is reported and ignored: the last good
//! configuration keeps serving. A Kubernetes watcher will publish on the same channel.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
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

/// Loads and validates the configuration at `paths` into generation `generation`.
pub fn load(paths: &[PathBuf], generation: u64) -> Result<Topology, SourceError> {
    let checked = switchyard_config::check_paths(paths)?;
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
}

/// Polls `paths` every `interval` and publishes valid changes on `tx` until `shutdown`.
pub async fn watch_dir(
    paths: Vec<PathBuf>,
    interval: Duration,
    tx: watch::Sender<Arc<Topology>>,
    status: Arc<Mutex<SourceStatus>>,
    shutdown: CancellationToken,
) {
    let mut seen = fingerprint(&paths);
    let mut generation = tx.borrow().generation;
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = shutdown.cancelled() => return,
        }
        let now = fingerprint(&paths);
        if now == seen {
            continue;
        }
        seen = now;
        match load(&paths, generation + 1) {
            Ok(topo) => {
                generation += 1;
                tracing::info!(generation, "configuration reloaded");
                if let Ok(mut s) = status.lock() {
                    *s = SourceStatus { generation, last_error: None };
                }
                let _ = tx.send(Arc::new(topo));
            }
            Err(e) => {
                tracing::warn!(error = %e, "configuration change refused; keeping the last good one");
                if let Ok(mut s) = status.lock() {
                    s.last_error = Some(e.to_string());
                }
            }
        }
    }
}
