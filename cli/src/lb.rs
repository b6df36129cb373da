//! `switchyard lb`: the benchmark's baseline routers.
//!
//! * `random` — a uniformly random worker per request (what kube-proxy does for a ClusterIP
//!   Service, the published baseline);
//! * `round-robin`;
//! * `least-outstanding` — the worker with the fewest requests this router has sent and not
//!   seen finish (the response body ended or was dropped), ties in turn: what a load balancer
//!   does when no prefix matches;
//! * `oracle` — asks every simulated worker (`/sim/oracle`, simulator only) for the exact TTFT
//!   the request would see there right now, from the engine's true cache and queue, and picks
//!   the lowest: the upper bound a router can reach without predicting the future.
//!
//! Requests and responses pass through unchanged (SSE streamed chunk by chunk).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::Exit;

/// Routing rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    /// Uniformly random.
    Random,
    /// In turn.
    RoundRobin,
    /// Fewest requests in flight through this router.
    LeastOutstanding,
    /// Lowest true TTFT from the simulators' ground truth.
    Oracle,
}

/// Arguments of `switchyard lb`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Routing rule.
    #[arg(long, value_enum)]
    policy: Policy,
    /// Worker base URLs.
    #[arg(long = "worker", required = true, value_name = "URL")]
    workers: Vec<String>,
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// Seed of the random rule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

struct Lb {
    policy: Policy,
    workers: Vec<String>,
    counter: AtomicU64,
    /// Per worker, requests sent whose response body has not ended.
    outstanding: Vec<Arc<AtomicU64>>,
    seed: u64,
    client: reqwest::Client,
    /// Held by the oracle from its queries until the chosen worker has accepted the request,
    /// so every decision sees the ones before it in the engines' true state.
    oracle_turn: tokio::sync::Mutex<()>,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Lb {
    async fn choose(&self, body: &Bytes) -> usize {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let k = self.workers.len();
        match self.policy {
            Policy::Random => (mix(self.seed ^ n) % k as u64) as usize,
            Policy::RoundRobin => (n % k as u64) as usize,
            Policy::LeastOutstanding => (0..k)
                .min_by_key(|&i| (self.outstanding[i].load(Ordering::Relaxed), (i + k - (n % k as u64) as usize) % k))
                .unwrap_or(0),
            Policy::Oracle => {
                let asks = self.workers.iter().map(|w| {
                    let req = self
                        .client
                        .post(format!("{w}/sim/oracle"))
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(body.clone());
                    async move {
                        let v: Value = req.send().await.ok()?.json().await.ok()?;
                        Some((
                            v.get("predictedTtftMs")?.as_f64()?,
                            v.get("waiting").and_then(Value::as_u64).unwrap_or(0),
                        ))
                    }
                });
                let answers = futures::future::join_all(asks).await;
                answers
                    .iter()
                    .enumerate()
                    .filter_map(|(i, a)| a.map(|(t, w)| (i, t, w)))
                    .min_by(|a, b| {
                        a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)).then((mix(n ^ a.0 as u64)).cmp(&mix(n ^ b.0 as u64)))
                    })
                    .map_or((n % k as u64) as usize, |(i, _, _)| i)
            }
        }
    }
}

async fn forward(State(lb): State<Arc<Lb>>, uri: axum::http::Uri, body: Bytes) -> Response {
    let mut turn = if lb.policy == Policy::Oracle { Some(lb.oracle_turn.lock().await) } else { None };
    let i = lb.choose(&body).await;
    let in_flight = InFlight::new(lb.outstanding[i].clone());
    if turn.is_some()
        && serde_json::from_slice::<Value>(&body).ok().and_then(|v| v.get("stream")?.as_bool()) != Some(true)
    {
        // A non-streamed answer arrives only when generation ends; holding the turn that long
        // would serialise the fleet.
        turn = None;
    }
    let url = format!("{}{}", lb.workers[i], uri.path());
    // The simulator answers with headers once the engine has the request queued.
    let sent = lb.client.post(&url).header(header::CONTENT_TYPE, "application/json").body(body).send().await;
    drop(turn);
    match sent {
        Ok(r) => {
            let status = StatusCode::from_u16(r.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            let content_type = r.headers().get(header::CONTENT_TYPE).cloned();
            // The count drops when the body has been streamed out or the client went away.
            let stream = r.bytes_stream().map(move |c| {
                let _held = &in_flight;
                c.map_err(std::io::Error::other)
            });
            let mut resp = Response::new(Body::from_stream(stream));
            *resp.status_mut() = status;
            if let Some(ct) = content_type {
                resp.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            if let Ok(v) = HeaderValue::from_str(&i.to_string()) {
                resp.headers_mut().insert("x-lb-worker", v);
            }
            resp
        }
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            axum::Json(json!({"error": {"message": e.to_string(), "type": "api_error", "code": 502}})),
        )
            .into_response(),
    }
}

/// One request in flight to a worker, counted until dropped.
struct InFlight(Arc<AtomicU64>);

impl InFlight {
    fn new(count: Arc<AtomicU64>) -> InFlight {
        count.fetch_add(1, Ordering::Relaxed);
        InFlight(count)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn health() -> StatusCode {
    StatusCode::OK
}

/// Runs the router until Ctrl-C or SIGTERM.
pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    rt.block_on(async {
        let lb = Arc::new(Lb {
            policy: args.policy,
            workers: args.workers.iter().map(|w| w.trim_end_matches('/').to_owned()).collect(),
            counter: AtomicU64::new(0),
            outstanding: args.workers.iter().map(|_| Arc::new(AtomicU64::new(0))).collect(),
            seed: args.seed,
            client: reqwest::Client::builder().tcp_nodelay(true).build()?,
            oracle_turn: tokio::sync::Mutex::new(()),
        });
        let models_from = lb.workers[0].clone();
        let client = lb.client.clone();
        let app = Router::new()
            .route("/v1/chat/completions", post(forward))
            .route("/v1/completions", post(forward))
            .route("/health", get(health))
            .route(
                "/v1/models",
                get(move || {
                    let client = client.clone();
                    let url = format!("{models_from}/v1/models");
                    async move {
                        match client.get(url).send().await {
                            Ok(r) => (StatusCode::OK, r.bytes().await.unwrap_or_default()).into_response(),
                            Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
                        }
                    }
                }),
            )
            .with_state(lb);
        let listener =
            tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        println!("lb ({:?}) listening on http://{}", args.policy, args.listen);
        axum::serve(listener, app).with_graceful_shutdown(crate::signals::wait_for_shutdown()).await?;
        anyhow::Ok(())
    })?;
    Ok(Exit::Ok)
}
