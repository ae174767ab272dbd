//! Upstream's `BoundedFrequencyRunner` on tokio: runs a sync function when
//! asked, at most once per `min_interval` (requests in between coalesce into
//! one run), at least once per `max_interval`, and again after
//! `retry_interval` when a run fails.

use std::{fmt::Display, future::Future, time::Duration};

use tokio::{
    sync::mpsc,
    time::{Instant, sleep, sleep_until},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunnerIntervals {
    /// upstream `--iptables-min-sync-period` / `minSyncPeriod`.
    pub min: Duration,
    pub retry: Duration,
    /// upstream `--iptables-sync-period` / `syncPeriod`.
    pub max: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("runner {name}: max interval {max:?} is shorter than min interval {min:?}")]
    MaxBelowMin {
        name: &'static str,
        min: Duration,
        max: Duration,
    },
}

/// Cheap to clone; [`RunnerHandle::run`] never blocks.
#[derive(Clone, Debug)]
pub struct RunnerHandle {
    tx: mpsc::Sender<()>,
}

impl RunnerHandle {
    /// Requests a run as soon as the min interval allows. A request made while
    /// one is already queued is merged into it.
    pub fn run(&self) {
        let _ = self.tx.try_send(());
    }
}

pub struct BoundedFrequencyRunner {
    name: &'static str,
    intervals: RunnerIntervals,
    rx: mpsc::Receiver<()>,
    // Held so `recv` never sees a closed channel once every handle is dropped.
    _keep: mpsc::Sender<()>,
}

impl BoundedFrequencyRunner {
    pub fn new(
        name: &'static str,
        intervals: RunnerIntervals,
    ) -> Result<(Self, RunnerHandle), RunnerError> {
        if intervals.max < intervals.min {
            return Err(RunnerError::MaxBelowMin {
                name,
                min: intervals.min,
                max: intervals.max,
            });
        }
        let (tx, rx) = mpsc::channel(1);
        Ok((
            BoundedFrequencyRunner {
                name,
                intervals,
                rx,
                _keep: tx.clone(),
            },
            RunnerHandle { tx },
        ))
    }

    /// Runs until `shutdown` completes. The first run happens on the first
    /// request or after `max`, whichever is earlier.
    pub async fn run_loop<F, Fut, E>(mut self, mut f: F, shutdown: impl Future<Output = ()>)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Display,
    {
        let RunnerIntervals { min, retry, max } = self.intervals;
        tokio::pin!(shutdown);
        let mut max_deadline = Instant::now() + max;
        let mut retry_at: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = sleep_until(max_deadline) => {}
                _ = sleep_until(retry_at.unwrap_or(max_deadline)), if retry_at.is_some() => {}
                _ = self.rx.recv() => {}
            }
            match f().await {
                Ok(()) => retry_at = None,
                Err(error) => {
                    tracing::warn!(runner = self.name, %error, retry_in = ?retry, "sync failed");
                    retry_at = Some(Instant::now() + retry);
                }
            }
            // Both timers count from the end of the run, as upstream resets them after fn.
            max_deadline = Instant::now() + max;
            tokio::select! {
                _ = &mut shutdown => return,
                _ = sleep(min) => {}
            }
        }
    }
}
