//! Loading Switchyard resources from files and directories.
//!
//! `parse → validate → build`: this module parses YAML (with positions), checks each document
//! against its CRD schema and CEL rules exactly as the API server would, and decodes it into
//! the typed resource. Cross-resource checks happen in [`crate::validate`]. Only reading files
//! does I/O; [`load_text`] is pure so tests and the Kubernetes watcher can feed it directly.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kube::core::cel::Validator;
use serde::de::DeserializeOwned;
use serde_json::Value;
use switchyard_crds::{
    API_VERSION, GROUP, GatewayBackend, InferencePolicy, InferencePool, InferenceProvider, InferenceWorkerSet, KINDS,
};

use crate::diagnostics::{Diagnostic, Pos, Severity, code};
use crate::schema::{self, ViolationKind};
use crate::yaml::{self, Document};

/// A resource with where it came from.
#[derive(Debug, Clone)]
pub struct Located<T> {
    /// The decoded resource.
    pub object: T,
    /// File it was read from.
    pub file: Arc<str>,
    /// The document, for positions.
    pub doc: Arc<Document>,
}

/// Every Switchyard resource found, by kind, in file order.
#[derive(Debug, Clone, Default)]
pub struct Resources {
    /// `InferenceWorkerSet`s.
    pub worker_sets: Vec<Located<InferenceWorkerSet>>,
    /// `InferenceProvider`s.
    pub providers: Vec<Located<InferenceProvider>>,
    /// `InferencePool`s.
    pub pools: Vec<Located<InferencePool>>,
    /// `InferencePolicy`s.
    pub policies: Vec<Located<InferencePolicy>>,
    /// `GatewayBackend`s.
    pub backends: Vec<Located<GatewayBackend>>,
    /// Files read.
    pub files: usize,
    /// (kind, name) of documents that were refused by schema or CEL checks. References to
    /// them are not reported again as dangling: the root cause is already reported.
    pub rejected: BTreeSet<(String, String)>,
}

/// A path could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The path does not exist or cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// Offending path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

impl<T> Located<T> {
    /// Position of the field at `path` (see [`Document::pos_of`]).
    pub fn pos(&self, path: &str) -> Pos {
        self.doc.pos_of(path)
    }

    /// Position of the value at `path`.
    pub fn value_pos(&self, path: &str) -> Pos {
        self.doc.value_pos_of(path)
    }

    /// A diagnostic pointing at the value at `path`.
    pub fn diag(&self, severity: Severity, code: &'static str, path: &str, message: String) -> Diagnostic {
        let pos = self.value_pos(path);
        Diagnostic { severity, code, file: self.file.to_string(), line: pos.line, column: pos.col, message }
    }
}

/// Reads every `.yaml`/`.yml` file under `paths` (directories recursively, in name order).
pub fn load_paths(paths: &[PathBuf], out: &mut Resources, diags: &mut Vec<Diagnostic>) -> Result<(), LoadError> {
    let mut files = Vec::new();
    for path in paths {
        collect_files(path, &mut files)?;
    }
    for file in files {
        let text = fs::read_to_string(&file).map_err(|source| LoadError::Io { path: file.clone(), source })?;
        load_text(&file.display().to_string(), &text, out, diags);
    }
    Ok(())
}

fn collect_files(path: &Path, files: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let io = |source| LoadError::Io { path: path.to_owned(), source };
    let meta = fs::metadata(path).map_err(io)?;
    if meta.is_file() {
        files.push(path.to_owned());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = fs::read_dir(path).map_err(io)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for entry in entries {
        let name = entry.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with('.') {
            continue;
        }
        if entry.is_dir() {
            collect_files(&entry, files)?;
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            files.push(entry);
        }
    }
    Ok(())
}

/// Parses and checks every document in `text`, adding resources and diagnostics.
pub fn load_text(file: &str, text: &str, out: &mut Resources, diags: &mut Vec<Diagnostic>) {
    out.files += 1;
    let file: Arc<str> = Arc::from(file);
    let (docs, errors) = yaml::parse(text);
    for err in errors {
        diags.push(Diagnostic {
            severity: Severity::Error,
            code: code::YAML_SYNTAX,
            file: file.to_string(),
            line: err.pos.line,
            column: err.pos.col,
            message: err.message,
        });
    }
    for doc in docs {
        load_document(&file, doc, out, diags);
    }
}

fn load_document(file: &Arc<str>, mut doc: Document, out: &mut Resources, diags: &mut Vec<Diagnostic>) {
    let at = |doc: &Document, path: &str, severity, code, message: String| {
        let pos = doc.pos_of(path);
        Diagnostic { severity, code, file: file.to_string(), line: pos.line, column: pos.col, message }
    };
    let (Some(api_version), Some(kind)) = (
        doc.value.get("apiVersion").and_then(Value::as_str).map(str::to_owned),
        doc.value.get("kind").and_then(Value::as_str).map(str::to_owned),
    ) else {
        diags.push(at(
            &doc,
            "",
            Severity::Error,
            code::NOT_AN_OBJECT,
            "document is not a Kubernetes object (needs apiVersion and kind)".to_owned(),
        ));
        return;
    };
    if api_version.split('/').next() != Some(GROUP) {
        diags.push(at(
            &doc,
            "kind",
            Severity::Warning,
            code::FOREIGN_RESOURCE,
            format!("{api_version} {kind} is not a Switchyard resource; skipped"),
        ));
        return;
    }
    if api_version != API_VERSION {
        diags.push(at(
            &doc,
            "apiVersion",
            Severity::Error,
            code::UNKNOWN_KIND,
            format!("unsupported apiVersion `{api_version}`; use `{API_VERSION}`"),
        ));
        return;
    }
    if !KINDS.contains(&kind.as_str()) {
        let hint = schema::closest(&kind, &KINDS).map(|k| format!("; did you mean `{k}`?")).unwrap_or_default();
        diags.push(at(
            &doc,
            "kind",
            Severity::Error,
            code::UNKNOWN_KIND,
            format!("unknown kind `{kind}` in {GROUP}{hint}"),
        ));
        return;
    }
    let Some(crd_schema) = switchyard_crds::crd_schema(&kind) else { return };

    let before = diags.len();
    check_metadata(&doc, &at, diags);
    for v in schema::check_and_default(&crd_schema, &mut doc.value) {
        let code = match v.kind {
            ViolationKind::UnknownField => code::UNKNOWN_FIELD,
            ViolationKind::WrongType => code::WRONG_TYPE,
            ViolationKind::Missing => code::MISSING_FIELD,
            ViolationKind::OutOfRange => code::OUT_OF_RANGE,
        };
        diags.push(at(&doc, &v.path, Severity::Error, code, format!("{kind}: {}", v.message)));
    }
    let name = doc.value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
    if diags.len() > before {
        // CEL rules assume a structurally valid object; the API server would not run them either.
        out.rejected.insert((kind, name));
        return;
    }
    if let Err(errors) = Validator::new().validate(&crd_schema, &doc.value, None) {
        for e in errors.iter() {
            diags.push(at(
                &doc,
                &e.field_path,
                Severity::Error,
                code::CEL_RULE,
                format!("{kind}: {}: {}", e.field_path, e.message),
            ));
        }
        out.rejected.insert((kind, name));
        return;
    }

    let doc = Arc::new(doc);
    match kind.as_str() {
        "InferenceWorkerSet" => push(file, &doc, &kind, &mut out.worker_sets, diags),
        "InferenceProvider" => push(file, &doc, &kind, &mut out.providers, diags),
        "InferencePool" => push(file, &doc, &kind, &mut out.pools, diags),
        "InferencePolicy" => push(file, &doc, &kind, &mut out.policies, diags),
        "GatewayBackend" => push(file, &doc, &kind, &mut out.backends, diags),
        _ => {}
    }
}

fn push<T: DeserializeOwned>(
    file: &Arc<str>,
    doc: &Arc<Document>,
    kind: &str,
    into: &mut Vec<Located<T>>,
    diags: &mut Vec<Diagnostic>,
) {
    match serde_json::from_value::<T>(doc.value.clone()) {
        Ok(object) => into.push(Located { object, file: file.clone(), doc: doc.clone() }),
        Err(err) => {
            let pos = doc.start;
            diags.push(Diagnostic {
                severity: Severity::Error,
                code: code::WRONG_TYPE,
                file: file.to_string(),
                line: pos.line,
                column: pos.col,
                message: format!("{kind}: {err}"),
            });
        }
    }
}

fn check_metadata(
    doc: &Document,
    at: &impl Fn(&Document, &str, Severity, &'static str, String) -> Diagnostic,
    diags: &mut Vec<Diagnostic>,
) {
    let meta = doc.value.get("metadata");
    let Some(meta) = meta.and_then(Value::as_object) else {
        diags.push(at(doc, "metadata", Severity::Error, code::METADATA, "metadata.name is required".to_owned()));
        return;
    };
    match meta.get("name").and_then(Value::as_str) {
        None => diags.push(at(doc, "metadata", Severity::Error, code::METADATA, "metadata.name is required".to_owned())),
        Some(name) if !is_dns_subdomain(name) => diags.push(at(
            doc,
            "metadata.name",
            Severity::Error,
            code::METADATA,
            format!("metadata.name `{name}` must be a lowercase RFC 1123 subdomain (a-z, 0-9, '-', '.'; at most 253 characters)"),
        )),
        Some(_) => {}
    }
    if let Some(ns) = meta.get("namespace") {
        let ok = ns.as_str().is_some_and(|n| n.len() <= 63 && !n.contains('.') && is_dns_subdomain(n));
        if !ok {
            diags.push(at(
                doc,
                "metadata.namespace",
                Severity::Error,
                code::METADATA,
                format!("metadata.namespace {ns} must be an RFC 1123 label"),
            ));
        }
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 253
        && s.chars().all(|c| alnum(c) || c == '-' || c == '.')
        && s.starts_with(alnum)
        && s.ends_with(alnum)
}
