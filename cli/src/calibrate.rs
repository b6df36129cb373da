//! `switchyard calibrate`: virtual-time runs of simulated engines, for tuning profiles.

use anyhow::Context;
use switchyard_sim::calibrate::{Routing, RunSpec, Workload, run};
use switchyard_sim::profile;

use crate::{Exit, Format};

/// Arguments of `switchyard calibrate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Engine profile.
    #[arg(long, default_value = "l40s-27b-fp8")]
    profile: String,
    /// Engines in the fleet.
    #[arg(long, default_value_t = 3)]
    engines: u32,
    /// KV-cache blocks per engine instead of the profile's (how the figures depend on capacity).
    #[arg(long)]
    kv_blocks: Option<u32>,
    /// Workloads (control, shared-prefix).
    #[arg(long, value_delimiter = ',', default_value = "control,shared-prefix")]
    workload: Vec<String>,
    /// Routing rules (random, prefix-affinity, oracle).
    #[arg(long, value_delimiter = ',', default_value = "random,prefix-affinity")]
    routing: Vec<String>,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,24,32")]
    concurrency: Vec<u32>,
    /// Measured requests per run.
    #[arg(long, default_value_t = 240)]
    requests: u32,
    /// Requests completed before measuring.
    #[arg(long, default_value_t = 48)]
    warmup: u32,
    /// Output tokens per request.
    #[arg(long, default_value_t = 300)]
    output_tokens: u32,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// Runs every combination and prints the figures (time scale 1).
pub fn run_all(args: &Args) -> anyhow::Result<Exit> {
    let mut p = profile::by_name(&args.profile).with_context(|| format!("unknown profile `{}`", args.profile))?.clone();
    if let Some(blocks) = args.kv_blocks {
        anyhow::ensure!(blocks > 0, "--kv-blocks must be positive");
        p.num_gpu_blocks = blocks;
    }
    let mut rows = Vec::new();
    for w in &args.workload {
        let workload = match w.as_str() {
            "control" => Workload::Control,
            "shared-prefix" => Workload::SharedPrefix,
            other => anyhow::bail!("unknown workload `{other}`"),
        };
        for r in &args.routing {
            let routing = match r.as_str() {
                "random" => Routing::Random,
                "prefix-affinity" => Routing::PrefixAffinity,
                "oracle" => Routing::Oracle,
                other => anyhow::bail!("unknown routing `{other}`"),
            };
            for &c in &args.concurrency {
                let spec = RunSpec {
                    engines: args.engines,
                    workload,
                    routing,
                    concurrency: c,
                    requests: args.requests,
                    warmup: args.warmup,
                    output_tokens: args.output_tokens,
                    seed: args.seed,
                };
                let result = run(&p, &spec);
                if args.format == Format::Text {
                    println!(
                        "{:<14} {:<16} c={:<3} ttft p50 {:>8.0} ms  p95 {:>8.0} ms  itl p50 {:>5.1} ms  e2e p50 {:>6.1} s  {:>6.1} req/min  goodput {:>6.1}/min  hit {:>5.1}%",
                        w,
                        r,
                        c,
                        result.ttft_ms_p50,
                        result.ttft_ms_p95,
                        result.itl_ms_p50,
                        result.e2e_s_p50,
                        result.requests_per_min,
                        result.goodput_per_min,
                        100.0 * result.cache_hit_rate
                    );
                }
                rows.push(serde_json::json!({"spec": spec, "result": result}));
            }
        }
    }
    if args.format == Format::Json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"profile": p, "runs": rows}))?);
    }
    Ok(Exit::Ok)
}
