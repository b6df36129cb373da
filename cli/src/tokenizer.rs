//! `switchyard tokenizer`: the project's own test tokenizer.

use std::path::PathBuf;

use crate::Exit;

/// Arguments of `switchyard tokenizer`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Train the byte-level BPE test tokenizer from generated text and write a Hugging Face
    /// directory (tokenizer.json, tokenizer_config.json).
    Train {
        /// Output directory.
        #[arg(long, default_value = switchyard_tokenizer::DEFAULT_TOKENIZER_DIR)]
        out: PathBuf,
    },
}

/// Runs the subcommand.
pub fn run(args: &Args) -> anyhow::Result<Exit> {
    match &args.command {
        Command::Train { out } => {
            switchyard_tokenizer::train::train(out)?;
            eprintln!("wrote {}", out.display());
        }
    }
    Ok(Exit::Ok)
}
