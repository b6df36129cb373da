//! `switchyard crds`: the CRD manifests, generated from the Rust types.

use std::fs;
use std::path::PathBuf;

use anyhow::Context;

use crate::Exit;

/// Arguments of `switchyard crds`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write one file per CRD into this directory instead of printing them.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// Prints or writes the manifests.
pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let manifests = switchyard_crds::render_all();
    match &args.out {
        None => {
            for m in manifests {
                print!("{}", m.yaml);
            }
        }
        Some(dir) => {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            for m in manifests {
                let path = dir.join(&m.file_name);
                fs::write(&path, &m.yaml).with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(Exit::Ok)
}
