//! The bounded frequency runner under tokio's paused clock.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use proxy_agent::sync::runner::{
    BoundedFrequencyRunner, RunnerError, RunnerHandle, RunnerIntervals,
};
use tokio::{
    sync::oneshot,
    task::JoinHandle,
    time::{Instant, sleep},
};

const MS: Duration = Duration::from_millis(1);

struct Harness {
    start: Instant,
    runs: Arc<Mutex<Vec<u128>>>,
    handle: RunnerHandle,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Harness {
    /// `fail_first`: how many leading runs return an error.
    fn start(min: u64, retry: u64, max: u64, fail_first: usize) -> Self {
        let start = Instant::now();
        let runs = Arc::new(Mutex::new(Vec::new()));
        let intervals = RunnerIntervals {
            min: MS * min as u32,
            retry: MS * retry as u32,
            max: MS * max as u32,
        };
        let (runner, handle) = BoundedFrequencyRunner::new("test", intervals).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let log = runs.clone();
        let task = tokio::spawn(runner.run_loop(
            move || {
                let mut log = log.lock().unwrap();
                log.push(start.elapsed().as_millis());
                let fail = log.len() <= fail_first;
                async move { if fail { Err("boom") } else { Ok(()) } }
            },
            async move {
                let _ = stopped.await;
            },
        ));
        Harness {
            start,
            runs,
            handle,
            stop: Some(stop),
            task,
        }
    }

    fn runs(&self) -> Vec<u128> {
        self.runs.lock().unwrap().clone()
    }

    async fn until(&self, ms: u64) {
        tokio::time::sleep_until(self.start + MS * ms as u32).await;
    }

    async fn stop(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        self.task.await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn burst_of_requests_coalesces_into_one_run_then_min_interval_spaces_the_next() {
    let h = Harness::start(1000, 5000, 60_000, 0);
    for _ in 0..10 {
        h.handle.run();
    }
    h.until(10).await;
    assert_eq!(h.runs(), [0]);

    // Requests during the min interval: all merged, run once the interval is over.
    h.until(100).await;
    for _ in 0..5 {
        h.handle.run();
    }
    h.until(900).await;
    h.handle.run();
    h.until(999).await;
    assert_eq!(h.runs(), [0]);
    h.until(1500).await;
    assert_eq!(h.runs(), [0, 1000]);

    // Idle: nothing until asked again.
    h.until(5000).await;
    h.handle.run();
    h.until(5001).await;
    assert_eq!(h.runs(), [0, 1000, 5000]);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn max_interval_forces_periodic_runs_counted_from_the_last_run() {
    let h = Harness::start(1000, 5000, 30_000, 0);
    h.until(29_999).await;
    assert!(
        h.runs().is_empty(),
        "no run before the first request or max interval"
    );
    h.until(30_000).await;
    sleep(MS).await;
    assert_eq!(h.runs(), [30_000]);
    // A requested run in between pushes the next periodic run back.
    h.until(40_000).await;
    h.handle.run();
    h.until(69_999).await;
    assert_eq!(h.runs(), [30_000, 40_000]);
    h.until(70_001).await;
    assert_eq!(h.runs(), [30_000, 40_000, 70_000]);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failed_run_is_retried_after_retry_interval_and_success_cancels_retry() {
    let h = Harness::start(1000, 5000, 60_000, 2);
    h.handle.run();
    h.until(4999).await;
    assert_eq!(h.runs(), [0]);
    h.until(5001).await;
    assert_eq!(h.runs(), [0, 5000], "first retry");
    h.until(10_001).await;
    assert_eq!(h.runs(), [0, 5000, 10_000], "second failure retried too");
    h.until(60_000).await;
    assert_eq!(
        h.runs(),
        [0, 5000, 10_000],
        "success stops retrying until max interval"
    );
    h.until(70_001).await;
    assert_eq!(h.runs(), [0, 5000, 10_000, 70_000]);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn request_beats_a_pending_retry() {
    let h = Harness::start(1000, 5000, 60_000, 1);
    h.handle.run();
    h.until(2000).await;
    h.handle.run();
    h.until(2001).await;
    assert_eq!(h.runs(), [0, 2000]);
    h.until(20_000).await;
    assert_eq!(
        h.runs(),
        [0, 2000],
        "the successful run cancelled the retry"
    );
    h.stop().await;
}

#[test]
fn max_below_min_is_rejected() {
    let err = BoundedFrequencyRunner::new(
        "bad",
        RunnerIntervals {
            min: Duration::from_secs(2),
            retry: Duration::from_secs(1),
            max: Duration::from_secs(1),
        },
    )
    .err()
    .expect("must be rejected");
    assert!(matches!(err, RunnerError::MaxBelowMin { name: "bad", .. }));
}
