//! The hub's federation listener: TCP accept, then the TLS handshake with client
//! certificates required, each handshake in its own task under a deadline.
//!
//! Invariants: a slow or silent client never delays another's handshake (each runs apart,
//! at most [`HANDSHAKE_TIMEOUT`]); a refused handshake is counted and logged without the
//! peer's certificate contents; the accept loop stops on shutdown, and its handshake tasks
//! belong to the hub's task tracker.

use std::sync::Arc;
use std::time::Duration;

use switchyard_proto::tls::ReloadingServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metric_names as m;
use switchyard_gateway::metrics::Metrics;

/// Longest a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections until `stop`; sends each completed handshake on `tx`.
pub async fn accept_loop(
    listener: TcpListener,
    tls: Arc<ReloadingServerConfig>,
    tx: mpsc::Sender<Result<TlsStream<TcpStream>, std::io::Error>>,
    metrics: Arc<Metrics>,
    tasks: TaskTracker,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stop.cancelled() => return,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(error) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
        let (tx, metrics, stop) = (tx.clone(), metrics.clone(), stop.clone());
        tasks.spawn(async move {
            let handshake = tokio::select! {
                r = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)) => r,
                () = stop.cancelled() => return,
            };
            match handshake {
                Ok(Ok(stream)) => {
                    let _ = tx.send(Ok(stream)).await;
                }
                Ok(Err(error)) => {
                    metrics.inc(m::REFUSED_TOTAL, &[("reason", "tls")], 1.0);
                    tracing::warn!(%peer, %error, "spoke refused at the TLS handshake");
                }
                Err(_) => {
                    metrics.inc(m::REFUSED_TOTAL, &[("reason", "tls")], 1.0);
                    tracing::warn!(%peer, "spoke refused: TLS handshake timed out");
                }
            }
        });
    }
}
