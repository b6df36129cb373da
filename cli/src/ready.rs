//! Ready files: where a started process says where it listens, for scripts and tests.
//!
//! Invariant: a reader that sees the file sees all of it — it is written beside its final
//! name and renamed into place, so a poller never reads a half-written document.

use std::path::Path;

use anyhow::Context;

/// Writes `ready` (a JSON document) to `path` atomically.
pub fn write(path: &Path, ready: &serde_json::Value) -> anyhow::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    std::fs::write(&partial, serde_json::to_string_pretty(ready)?)
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("renaming {} to {}", partial.display(), path.display()))
}
