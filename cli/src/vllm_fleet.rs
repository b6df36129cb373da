//! Real vLLM workers for `switchyard up --engine vllm`: `vllm serve` child processes on
//! loopback, configured like the simulated fleet (prefix caching, ZMQ KV events with replay,
//! `/render`, cached-token usage), so the same spoke routes over them.
//!
//! Invariants: every worker runs in its own process group, and [`VllmFleet::shutdown`] (also
//! called when startup fails half-way) ends each group — SIGTERM, then SIGKILL after a grace
//! period — so no engine core or worker process outlives `up`. Ports are picked free on
//! 127.0.0.1 just before the start; a start that loses that race fails with the engine's log.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// Tokens per KV block on the workers (vLLM's CPU backend needs a multiple of 32).
pub const BLOCK_SIZE: u32 = 32;
/// How long a worker may take to answer `/v1/models` (a cold start on a busy 2-core machine
/// imports torch three times: about a minute per process).
const START_TIMEOUT: Duration = Duration::from_secs(600);
/// Grace period between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// Where the engine and the model are.
#[derive(Debug, Clone)]
pub struct VllmSpec {
    /// The `vllm` executable (e2e/vllm/setup installs one).
    pub vllm: PathBuf,
    /// The model directory it serves.
    pub model: PathBuf,
    /// Name the workers serve the model under.
    pub served_model_name: String,
    /// KV-cache size per worker, GiB (`VLLM_CPU_KVCACHE_SPACE`).
    pub kv_cache_gib: u32,
}

/// One running worker.
#[derive(Debug)]
pub struct VllmWorker {
    /// 0-based index.
    pub index: u32,
    /// OpenAI API address.
    pub http: SocketAddr,
    /// ZMQ KV-event publisher port.
    pub kv_events: u16,
    /// ZMQ replay port.
    pub kv_replay: u16,
    /// The worker's combined stdout and stderr.
    pub log: PathBuf,
    child: Child,
    /// The leader's pid, which is also the group id: kept because `Child::id` forgets it once
    /// the leader is reaped, while the group's other processes may still run.
    group: Pid,
}

/// The running workers.
#[derive(Debug, Default)]
pub struct VllmFleet {
    /// Workers in index order.
    pub workers: Vec<VllmWorker>,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

impl VllmFleet {
    /// Starts `count` workers at once and waits until every one serves `/v1/models`. Logs go
    /// to `dir`. On any failure the workers already started are stopped.
    pub async fn start(spec: &VllmSpec, count: u32, dir: &Path) -> anyhow::Result<VllmFleet> {
        if !spec.vllm.is_file() {
            bail!("no vLLM at {} (run e2e/vllm/setup, or pass --vllm)", spec.vllm.display());
        }
        if !spec.model.join("config.json").is_file() {
            bail!("no model at {} (run e2e/vllm/setup, or pass --vllm-model)", spec.model.display());
        }
        let cores = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
        let mut fleet = VllmFleet::default();
        for index in 0..count {
            match spawn(spec, index, index % cores, dir) {
                Ok(w) => fleet.workers.push(w),
                Err(e) => {
                    fleet.shutdown().await;
                    return Err(e);
                }
            }
        }
        if let Err(e) = fleet.wait_ready().await {
            fleet.shutdown().await;
            return Err(e);
        }
        Ok(fleet)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let deadline = Instant::now() + START_TIMEOUT;
        for w in &mut self.workers {
            let url = format!("http://{}/v1/models", w.http);
            loop {
                if let Some(status) = w.child.try_wait()? {
                    bail!("vLLM worker-{} exited ({status}) while starting; see {}", w.index, w.log.display());
                }
                if client.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("vLLM worker-{} did not start in {:?}; see {}", w.index, START_TIMEOUT, w.log.display());
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        Ok(())
    }

    /// Stops every worker's process group: SIGTERM, then SIGKILL after [`STOP_GRACE`].
    pub async fn shutdown(&mut self) {
        for w in &self.workers {
            let _ = killpg(w.group, Signal::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        for w in &mut self.workers {
            if tokio::time::timeout_at(deadline, w.child.wait()).await.is_err() {
                tracing::warn!(worker = w.index, "vLLM did not stop in time; killing it");
            }
            // The engine core and worker processes share the group; end any that remain.
            let _ = killpg(w.group, Signal::SIGKILL);
            let _ = w.child.wait().await;
        }
        self.workers.clear();
    }
}

fn spawn(spec: &VllmSpec, index: u32, core: u32, dir: &Path) -> anyhow::Result<VllmWorker> {
    let (http, kv_events, kv_replay) = (free_port()?, free_port()?, free_port()?);
    let log = dir.join(format!("vllm-worker-{index}.log"));
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let kv_config = serde_json::json!({
        "enable_kv_cache_events": true, "publisher": "zmq",
        "endpoint": format!("tcp://127.0.0.1:{kv_events}"), "replay_endpoint": format!("tcp://127.0.0.1:{kv_replay}"),
    });
    let scratch = dir.join(format!("vllm-worker-{index}"));
    let child = Command::new(&spec.vllm)
        .arg("serve")
        .arg(&spec.model)
        .args(["--served-model-name", &spec.served_model_name, "--host", "127.0.0.1", "--port", &http.to_string()])
        .args(["--dtype", "float32", "--max-model-len", "4096", "--block-size", &BLOCK_SIZE.to_string()])
        .args(["--enable-prefix-caching", "--enable-scale-out", "--enable-prompt-tokens-details", "-O0"])
        .args(["--kv-events-config", &kv_config.to_string()])
        .env("VLLM_TARGET_DEVICE", "cpu")
        .env("VLLM_CPU_KVCACHE_SPACE", spec.kv_cache_gib.to_string())
        .env("VLLM_CPU_OMP_THREADS_BIND", core.to_string())
        .env("VLLM_CACHE_ROOT", scratch.join("cache"))
        .env("TORCHINDUCTOR_CACHE_DIR", scratch.join("inductor"))
        // Local files only, no telemetry.
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("DO_NOT_TRACK", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", spec.vllm.display()))?;
    // process_group(0): the group id is the leader's pid.
    let group = Pid::from_raw(child.id().context("vLLM exited at once")? as i32);
    Ok(VllmWorker {
        index,
        http: SocketAddr::from((Ipv4Addr::LOCALHOST, http)),
        kv_events,
        kv_replay,
        log,
        child,
        group,
    })
}
