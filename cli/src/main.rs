//! `switchyard`: the command-line entry point.
//!
//! Subcommands: `validate` (offline policy checks for Git hooks and CI), `explain` (what the
//! engine decides for one request on a given fleet state, with the full trace), `crds` (the
//! CustomResourceDefinition manifests), `spoke`, `hub` and `certs` (the federation), `up` (a
//! local fleet), `sim`, `calibrate` and `lb`. Exit codes: 0 success, 1 invalid input
//! (configuration errors), 2 usage errors (bad arguments, unreadable files).

mod calibrate;
mod crds;
mod explain;
mod hub;
mod lb;
mod local_federation;
mod loopback_fleet;
mod ready;
mod signals;
mod sim;
mod tokenizer;
mod up;
mod validate;
mod vllm_fleet;

use std::process::ExitCode;

/// mimalloc: the request path allocates many small, short-lived objects, which the system
/// allocator serves slowly (see `spoke-agent/README.md`, measured).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand, ValueEnum};

/// Switchyard: a multi-cluster inference control plane for vLLM.
#[derive(Parser, Debug)]
#[command(name = "switchyard", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check Switchyard resources (files or directories of multi-document YAML).
    Validate(validate::Args),
    /// Show the decision for one request on a given fleet state, with its trace.
    Explain(explain::Args),
    /// Print the CustomResourceDefinition manifests (or write them to a directory).
    Crds(crds::Args),
    /// Start a local fleet (simulated or real vLLM workers + a spoke) on loopback.
    Up(up::UpArgs),
    /// Run a spoke: KV-cache-aware routing over configured vLLM workers.
    Spoke(up::SpokeArgs),
    /// Run the hub: the federation of spokes over mutual TLS.
    Hub(hub::HubArgs),
    /// Create a development CA and the hub's and clusters' certificates.
    Certs(hub::CertsArgs),
    /// Run simulated vLLM workers (flags mirror `vllm serve`).
    Sim(sim::Args),
    /// Run simulated engines in virtual time to calibrate a profile.
    Calibrate(calibrate::Args),
    /// Baseline routers for the benchmark (random, round-robin, oracle).
    Lb(lb::Args),
    /// Manage the project's test tokenizer.
    Tokenizer(tokenizer::Args),
}

/// Output format shared by the subcommands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Default)]
pub enum Format {
    /// For people.
    #[default]
    Text,
    /// For machines.
    Json,
}

/// How a subcommand ended.
pub enum Exit {
    /// Success.
    Ok,
    /// The input was checked and is invalid.
    Invalid,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let telemetry = switchyard_spoke::telemetry::init("warn");
    let result = match cli.command {
        Command::Validate(args) => validate::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Crds(args) => crds::run(&args),
        Command::Tokenizer(args) => tokenizer::run(&args),
        Command::Sim(args) => sim::run(&args),
        Command::Up(args) => up::run_up(&args),
        Command::Lb(args) => lb::run(&args),
        Command::Spoke(args) => up::run_spoke(&args),
        Command::Hub(args) => hub::run_hub(&args),
        Command::Certs(args) => hub::run_certs(&args),
        Command::Calibrate(args) => calibrate::run_all(&args),
    };
    telemetry.shutdown();
    match result {
        Ok(Exit::Ok) => ExitCode::SUCCESS,
        Ok(Exit::Invalid) => ExitCode::from(1),
        Err(err) => {
            eprintln!("switchyard: {err:#}");
            ExitCode::from(2)
        }
    }
}
