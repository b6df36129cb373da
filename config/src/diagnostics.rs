//! Diagnostics: every problem found in configuration, with its source position.
//!
//! Rendered as `file:line:col: error[CODE]: message`, the format editors and CI annotators
//! understand. Codes are stable; `docs/validation.md` lists them.

use std::fmt;

use serde::Serialize;

/// Severity of a diagnostic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Makes the configuration invalid.
    Error,
    /// Suspicious but valid.
    Warning,
}

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Pos {
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub col: u32,
}

/// One problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// Stable code, e.g. `E021`.
    pub code: &'static str,
    /// File the problem is in.
    pub file: String,
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub column: u32,
    /// What is wrong, and how to fix it where that is not obvious.
    pub message: String,
}

/// Diagnostic codes.
pub mod code {
    /// YAML syntax error.
    pub const YAML_SYNTAX: &str = "E001";
    /// A document is not a Kubernetes object.
    pub const NOT_AN_OBJECT: &str = "E002";
    /// Unknown kind or version in the Switchyard API group.
    pub const UNKNOWN_KIND: &str = "E003";
    /// A field the schema does not define.
    pub const UNKNOWN_FIELD: &str = "E010";
    /// A value of the wrong type.
    pub const WRONG_TYPE: &str = "E011";
    /// A required field is missing.
    pub const MISSING_FIELD: &str = "E012";
    /// A value outside its allowed range, length or set.
    pub const OUT_OF_RANGE: &str = "E013";
    /// A CEL validation rule of the CRD failed.
    pub const CEL_RULE: &str = "E014";
    /// Invalid metadata (name, namespace).
    pub const METADATA: &str = "E015";
    /// Two resources of one kind share a name.
    pub const DUPLICATE_NAME: &str = "E020";
    /// A reference names nothing.
    pub const DANGLING_REFERENCE: &str = "E021";
    /// Aliases refer to each other in a loop.
    pub const ALIAS_CYCLE: &str = "E022";
    /// Two public names collide.
    pub const NAME_CONFLICT: &str = "E023";
    /// A price is not a decimal dollar amount.
    pub const BAD_AMOUNT: &str = "E024";
    /// A duplicate inside one resource (worker names, model names).
    pub const DUPLICATE_ENTRY: &str = "E025";
    /// A policy can send `pii` requests to an external provider.
    pub const PII_UNSAFE: &str = "E030";
    /// A policy that no request can ever reach.
    pub const UNREACHABLE_POLICY: &str = "W001";
    /// A `PreferModel` step names a model the policy's requests never resolve to.
    pub const PREFERENCE_NEVER_APPLIES: &str = "W002";
    /// A resource nothing refers to.
    pub const UNUSED: &str = "W003";
    /// A document from another API group, skipped.
    pub const FOREIGN_RESOURCE: &str = "W004";
}

impl Diagnostic {
    /// Whether this is an error.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}:{}:{}: {sev}[{}]: {}", self.file, self.line, self.column, self.code, self.message)
    }
}

/// Sorts diagnostics by file, position, then severity, and removes exact duplicates.
pub fn sort(diags: &mut Vec<Diagnostic>) {
    diags.sort_by(|a, b| {
        (&a.file, a.line, a.column, a.severity, a.code, &a.message)
            .cmp(&(&b.file, b.line, b.column, b.severity, b.code, &b.message))
    });
    diags.dedup();
}
