//! Admission control and the CPU pool.
//!
//! Invariants:
//! - the concurrency bound is checked first, before the body is read or anything is
//!   tokenized: beyond it a request costs one semaphore probe and gets an overload answer
//!   with `Retry-After`;
//! - a [`Permit`] lives as long as the request, streams included;
//! - CPU work that grows with the request (JSON parsing of large bodies, tokenization) runs
//!   on blocking threads, at most `threads` at a time, so the async threads keep serving
//!   health checks, scrapes and streams whatever the prompts contain.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ErrorKind, GatewayError};

/// The concurrency bound of a front door.
#[derive(Debug, Clone)]
pub struct Admission {
    permits: Arc<Semaphore>,
    retry_after: Duration,
}

/// One admitted request.
#[derive(Debug)]
pub struct Permit(#[allow(dead_code)] OwnedSemaphorePermit);

impl Admission {
    /// At most `max_concurrent` requests at once.
    pub fn new(max_concurrent: usize, retry_after: Duration) -> Admission {
        Admission { permits: Arc::new(Semaphore::new(max_concurrent.max(1))), retry_after }
    }

    /// Admits a request or refuses it at once.
    pub fn try_admit(&self) -> Result<Permit, GatewayError> {
        self.permits.clone().try_acquire_owned().map(Permit).map_err(|_| GatewayError::overloaded(self.retry_after))
    }

    /// Requests admitted right now.
    pub fn in_flight(&self, max_concurrent: usize) -> usize {
        max_concurrent.saturating_sub(self.permits.available_permits())
    }
}

/// A bounded pool for CPU work.
#[derive(Debug, Clone)]
pub struct CpuPool {
    slots: Arc<Semaphore>,
}

impl CpuPool {
    /// At most `threads` jobs at once (0: one per core).
    pub fn new(threads: usize) -> CpuPool {
        let n = if threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2) } else { threads };
        CpuPool { slots: Arc::new(Semaphore::new(n)) }
    }

    /// Runs `job` on a blocking thread once a slot is free.
    pub async fn run<T, F>(&self, job: F) -> Result<T, GatewayError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| GatewayError::new(ErrorKind::Internal, "pool_closed", "the CPU pool is closed"))?;
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            job()
        })
        .await
        .map_err(|_| GatewayError::new(ErrorKind::Internal, "cpu_job_failed", "a CPU job failed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_the_bound_requests_are_refused_until_a_permit_returns() {
        let a = Admission::new(2, Duration::from_secs(1));
        let p1 = a.try_admit().expect("first");
        let _p2 = a.try_admit().expect("second");
        let e = a.try_admit().expect_err("third is over the bound");
        assert_eq!(e.kind, ErrorKind::Overloaded);
        assert_eq!(a.in_flight(2), 2);
        drop(p1);
        assert!(a.try_admit().is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_pool_runs_at_most_its_size_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let pool = CpuPool::new(2);
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let jobs: Vec<_> = (0..8)
            .map(|_| {
                let (pool, running, peak) = (pool.clone(), running.clone(), peak.clone());
                tokio::spawn(async move {
                    pool.run(move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                })
            })
            .collect();
        for j in jobs {
            j.await.expect("join").expect("job");
        }
        assert!(peak.load(Ordering::SeqCst) <= 2);
    }
}
