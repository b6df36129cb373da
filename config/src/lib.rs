//! Switchyard configuration: from YAML (files, directories, or objects read from the
//! Kubernetes API) to a validated, compiled [`FleetConfig`].
//!
//! The pipeline is parse → validate → build:
//!
//! 1. [`yaml`] reads documents and remembers where every field is;
//! 2. [`load`] checks each document against its CRD schema and CEL rules, as the API server
//!    would, and decodes the typed resource;
//! 3. [`validate`] checks references, names, aliases, money and residency across resources
//!    and compiles the core model.
//!
//! Every problem is a [`Diagnostic`] with a file, line and column. Nothing here panics on bad
//! input, and one bad document never hides the diagnostics of the others.

pub mod diagnostics;
pub mod federated;
pub mod load;
pub mod schema;
pub mod validate;
pub mod yaml;

use std::path::PathBuf;

pub use diagnostics::{Diagnostic, Severity};
pub use load::{LoadError, Resources};
use switchyard_core::FleetConfig;

/// The result of checking a configuration.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    /// The compiled configuration (complete only when there are no errors).
    pub config: FleetConfig,
    /// Every diagnostic, sorted by file and position.
    pub diagnostics: Vec<Diagnostic>,
    /// The typed resources that passed schema checks.
    pub resources: Resources,
}

impl Checked {
    /// Number of error diagnostics.
    pub fn error_count(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.is_error()).count()
    }

    /// Number of warning diagnostics.
    pub fn warning_count(&self) -> usize {
        self.diagnostics.len() - self.error_count()
    }
}

/// Loads and validates every YAML file under `paths`.
pub fn check_paths(paths: &[PathBuf]) -> Result<Checked, LoadError> {
    let mut resources = Resources::default();
    let mut diagnostics = Vec::new();
    load::load_paths(paths, &mut resources, &mut diagnostics)?;
    Ok(finish(resources, diagnostics))
}

/// Loads and validates in-memory documents, given as (file label, text) pairs.
pub fn check_texts<'a>(texts: impl IntoIterator<Item = (&'a str, &'a str)>) -> Checked {
    let mut resources = Resources::default();
    let mut diagnostics = Vec::new();
    for (file, text) in texts {
        load::load_text(file, text, &mut resources, &mut diagnostics);
    }
    finish(resources, diagnostics)
}

pub(crate) fn finish(resources: Resources, mut diagnostics: Vec<Diagnostic>) -> Checked {
    let (config, more) = validate::validate(&resources);
    diagnostics.extend(more);
    diagnostics::sort(&mut diagnostics);
    Checked { config, diagnostics, resources }
}
