//! Live state of every worker set and worker, reconciled against each new [`Topology`].
//!
//! Each worker owns two tasks — its KV-event subscriber and its metrics scraper — under a
//! child cancellation token; a worker that leaves the configuration (or changes address) has
//! its tasks cancelled and awaited and its entries removed from the index. Worker sets keep
//! their index across reloads unless their block size changes; a changed tokenizer
//! configuration rebuilds the tokenizer and restarts the fidelity window.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use dynamo_kv_router::protocols::WorkerId;
use switchyard_core::replica::EngineModel;
use switchyard_core::request::WorkerKey;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::calibration::Calibrator;
use crate::fidelity::Guard;
use crate::index::KvIndex;
use crate::kv_subscriber::{self, KvStats, SubscriberSpec};
use crate::load::{self, WorkerLoad};
use crate::tokenize::Tokenizer;
use crate::topology::{Topology, WorkerEndpoint, WorkerSetRuntime};

/// One worker's live state.
#[derive(Debug)]
pub struct WorkerRuntime {
    /// Index id.
    pub id: WorkerId,
    /// Identity.
    pub key: WorkerKey,
    /// Addresses.
    pub endpoint: WorkerEndpoint,
    /// Load.
    pub load: Arc<WorkerLoad>,
    /// KV stream counters.
    pub kv: Arc<KvStats>,
    /// The spoke's replica of the engine, when the worker set's KV capacity is known: written
    /// by this worker's dispatches and their observers, read (as an outlook) by decisions.
    pub model: Mutex<Option<EngineModel>>,
    cancel: CancellationToken,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// One worker set's live state.
#[derive(Debug)]
pub struct SetRuntime {
    /// Settings it was built from.
    pub config: WorkerSetRuntime,
    /// Its KV index.
    pub index: Arc<KvIndex>,
    /// Its tokenizer (or the reason there is none).
    pub tokenizer: Result<Tokenizer, String>,
    /// Its fidelity guard.
    pub guard: Arc<Mutex<Guard>>,
    /// Online TTFT calibration, shared by the set's workers: they run the same model on the
    /// same hardware, and a per-worker estimate could starve a worker it once misjudged
    /// (never routed to, never corrected). Per-worker differences show up as queue instead.
    pub calibration: Arc<Mutex<Calibrator>>,
}

#[derive(Default)]
struct State {
    /// Ordered by key: [`Registry::workers`] lists them in a stable order (status pages, the
    /// metrics endpoint, tests).
    workers: BTreeMap<WorkerKey, Arc<WorkerRuntime>>,
    sets: HashMap<String, Arc<SetRuntime>>,
    next_id: WorkerId,
}

/// All live state.
pub struct Registry {
    state: RwLock<State>,
    /// The origin of the replicas' clock.
    epoch: Instant,
    client: reqwest::Client,
    shutdown: CancellationToken,
    /// Largest KV-event message accepted from a worker.
    max_kv_message_bytes: u64,
}

impl Registry {
    /// An empty registry; tasks stop when `shutdown` fires; KV-event messages above
    /// `max_kv_message_bytes` drop the worker's event connection.
    pub fn new(client: reqwest::Client, shutdown: CancellationToken, max_kv_message_bytes: u64) -> Registry {
        Registry { state: RwLock::new(State::default()), epoch: Instant::now(), client, shutdown, max_kv_message_bytes }
    }

    /// Milliseconds since the registry started: the clock every replica runs on.
    pub fn now_ms(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1_000.0
    }

    /// A worker by key.
    pub fn worker(&self, key: &WorkerKey) -> Option<Arc<WorkerRuntime>> {
        self.state.read().ok()?.workers.get(key).cloned()
    }

    /// A worker set by name.
    pub fn set(&self, name: &str) -> Option<Arc<SetRuntime>> {
        self.state.read().ok()?.sets.get(name).cloned()
    }

    /// Every worker, in key order.
    pub fn workers(&self) -> Vec<Arc<WorkerRuntime>> {
        self.state.read().map(|s| s.workers.values().cloned().collect()).unwrap_or_default()
    }

    /// Every worker set.
    pub fn sets(&self) -> Vec<Arc<SetRuntime>> {
        self.state.read().map(|s| s.sets.values().cloned().collect()).unwrap_or_default()
    }

    /// Brings the live state in line with `topo`.
    pub async fn reconcile(&self, topo: &Topology) {
        let mut stopped: Vec<(Arc<WorkerRuntime>, Option<Arc<KvIndex>>)> = Vec::new();
        {
            let Ok(mut st) = self.state.write() else { return };
            // Worker sets.
            let mut sets = HashMap::new();
            for (name, ws) in &topo.worker_sets {
                let prev = st.sets.get(name).cloned();
                let set = match prev {
                    Some(p) if p.config == *ws => p,
                    Some(p) if p.config.block_size == ws.block_size => {
                        let tokenizer_changed = p.config.tokenizer != ws.tokenizer;
                        let guard = p.guard.clone();
                        if tokenizer_changed && let Ok(mut g) = guard.lock() {
                            g.reset_window();
                        }
                        let tokenizer = if tokenizer_changed {
                            Tokenizer::from_config(&ws.tokenizer).map_err(|e| e.to_string())
                        } else {
                            p.tokenizer.clone()
                        };
                        Arc::new(SetRuntime {
                            config: ws.clone(),
                            index: p.index.clone(),
                            tokenizer,
                            guard,
                            calibration: p.calibration.clone(),
                        })
                    }
                    _ => Arc::new(SetRuntime {
                        config: ws.clone(),
                        index: Arc::new(KvIndex::new(ws.block_size)),
                        tokenizer: Tokenizer::from_config(&ws.tokenizer).map_err(|e| e.to_string()),
                        guard: Arc::new(Mutex::new(Guard::new(ws.block_size))),
                        calibration: Arc::new(Mutex::new(Calibrator::new(
                            topo.fleet.worker_sets.get(name).map(|w| w.ttft).unwrap_or_default(),
                        ))),
                    }),
                };
                if let Err(e) = &set.tokenizer {
                    tracing::warn!(worker_set = %name, error = %e, "worker set has no usable tokenizer; routing by load");
                }
                sets.insert(name.clone(), set);
            }
            // Workers.
            let mut workers = BTreeMap::new();
            for (name, ws) in &topo.worker_sets {
                let Some(set) = sets.get(name).cloned() else { continue };
                for ep in &ws.workers {
                    let key = WorkerKey { worker_set: name.as_str().into(), worker: ep.worker.as_str().into() };
                    let reuse = st.workers.get(&key).filter(|w| {
                        w.endpoint == *ep && st.sets.get(name).is_some_and(|s| Arc::ptr_eq(&s.index, &set.index))
                    });
                    let w = match reuse {
                        Some(w) => w.clone(),
                        None => {
                            // A fresh id per start: the old runtime's entries are removed by id
                            // after the swap, which must not touch the new one's.
                            st.next_id += 1;
                            let id = st.next_id;
                            let model = topo.fleet.worker_sets.get(name).and_then(|ws| ws.engine_model(None));
                            self.start_worker(id, key.clone(), ep.clone(), set.index.clone(), model)
                        }
                    };
                    workers.insert(key, w);
                }
            }
            let old_workers = std::mem::take(&mut st.workers);
            for (key, w) in old_workers {
                let kept = workers.get(&key).is_some_and(|n| Arc::ptr_eq(n, &w));
                if !kept {
                    let index = st.sets.get(&*key.worker_set).map(|s| s.index.clone());
                    stopped.push((w, index));
                }
            }
            st.workers = workers;
            st.sets = sets;
        }
        for (w, index) in stopped {
            w.stop().await;
            if let Some(index) = index {
                index.remove_worker(w.id).await;
            }
            tracing::info!(worker_set = %w.key.worker_set, worker = %w.key.worker, "worker removed");
        }
    }

    fn start_worker(
        &self,
        id: WorkerId,
        key: WorkerKey,
        ep: WorkerEndpoint,
        index: Arc<KvIndex>,
        model: Option<EngineModel>,
    ) -> Arc<WorkerRuntime> {
        let cancel = self.shutdown.child_token();
        let load = Arc::new(WorkerLoad::default());
        let kv = Arc::new(KvStats::default());
        let mut tasks = vec![tokio::spawn(load::run_scraper(
            self.client.clone(),
            ep.http_url.clone(),
            load.clone(),
            cancel.clone(),
        ))];
        if let Some(endpoint) = &ep.kv_events {
            let spec = SubscriberSpec {
                worker_id: id,
                endpoint: endpoint.clone(),
                replay: ep.kv_replay.clone(),
                topic: ep.topic.clone(),
                max_message_bytes: self.max_kv_message_bytes,
            };
            tasks.push(tokio::spawn(kv_subscriber::run(spec, index, kv.clone(), cancel.clone())));
        }
        tracing::info!(worker_set = %key.worker_set, worker = %key.worker, url = %ep.http_url, "worker added");
        Arc::new(WorkerRuntime {
            id,
            key,
            endpoint: ep,
            load,
            kv,
            model: Mutex::new(model),
            cancel,
            tasks: Mutex::new(tasks),
        })
    }

    /// Stops every worker's tasks.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        for w in self.workers() {
            w.stop().await;
        }
    }
}

impl WorkerRuntime {
    async fn stop(&self) {
        self.cancel.cancel();
        let tasks: Vec<JoinHandle<()>> = self.tasks.lock().map(|mut t| t.drain(..).collect()).unwrap_or_default();
        for t in tasks {
            let _ = t.await;
        }
    }
}
