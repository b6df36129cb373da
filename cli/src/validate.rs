//! `switchyard validate`: offline checks of Switchyard resources.

use std::path::PathBuf;

use serde_json::json;

use crate::{Exit, Format};

/// Arguments of `switchyard validate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Files or directories (searched recursively for *.yaml / *.yml).
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
    /// Treat warnings as errors.
    #[arg(long)]
    deny_warnings: bool,
}

/// Runs the checks and prints the diagnostics.
pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let checked = switchyard_config::check_paths(&args.paths)?;
    let errors = checked.error_count();
    let warnings = checked.warning_count();
    let res = &checked.resources;
    let resources =
        res.worker_sets.len() + res.providers.len() + res.pools.len() + res.policies.len() + res.backends.len();
    let valid = errors == 0 && !(args.deny_warnings && warnings > 0);
    match args.format {
        Format::Text => {
            for d in &checked.diagnostics {
                println!("{d}");
            }
            let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
            println!(
                "{}: {}, {} in {} ({})",
                if valid { "valid" } else { "invalid" },
                plural(errors, "error"),
                plural(warnings, "warning"),
                plural(res.files, "file"),
                plural(resources, "resource"),
            );
        }
        Format::Json => {
            let out = json!({
                "valid": valid,
                "errors": errors,
                "warnings": warnings,
                "files": res.files,
                "resources": resources,
                "diagnostics": checked.diagnostics,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
    }
    Ok(if valid { Exit::Ok } else { Exit::Invalid })
}
