//! Whether the API server answers at all: a request on a fresh connection, from a
//! thread and runtime of its own, with a short timeout and at a bounded rate.
//!
//! An API outage hangs every reconcile at once, and a restart cannot cure it: the new
//! pod waits on the same server, and every operator of the cluster restarting at once
//! re-lists into a server just coming back. So while this check finds the server
//! silent, overdue reconciles that await hold liveness instead of failing it, and the
//! `api-server` readiness check fails. The request uses a new client each time, not the
//! operator's pooled connection (which may be the stuck one), and runs off the watched
//! runtime (which may be wedged). Any HTTP answer counts, even 401, 403 or 404: the
//! server answers.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use reconcile_watchdog::{Watchdog, kube::ApiServerCheck};
//!
//! let api_server = ApiServerCheck::every(Duration::from_secs(5));
//! let watchdog = Watchdog::builder().api_server(api_server.clone()).start()?;
//! let config = kube::Config::infer().await?;
//! api_server.watch(config.clone())?;
//! let client = kube::Client::try_from(config)?;
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::monitor::ApiServerStatus;
use crate::monitor::verdict::fmt_duration;

/// The path asked: answered by every API server, cheap, and not a watch.
const PATH: &str = "/version";

/// The longest a check waits for an answer.
const MAX_TIMEOUT: Duration = Duration::from_secs(2);

/// Errors of the API server check.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The OS refused to start its thread.
    #[error("failed to start the API server check's thread")]
    Spawn(#[source] std::io::Error),
}

/// The API server check, plugged into a [`Watchdog`](crate::Watchdog) with
/// [`Builder::api_server`](crate::Builder::api_server): idle until
/// [`watch`](Self::watch) gives it the operator's `kube::Config`.
#[derive(Debug)]
pub struct ApiServerCheck {
    status: Arc<ApiServerStatus>,
    interval: Duration,
    running: Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Running {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl ApiServerCheck {
    /// A check that, once watching, asks every `interval` (5 seconds is a good value),
    /// and when the monitor asks sooner, at most every `interval / 5`. A zero interval
    /// is taken as one millisecond.
    #[must_use]
    pub fn every(interval: Duration) -> Arc<Self> {
        Arc::new(Self {
            status: Arc::default(),
            interval: interval.max(Duration::from_millis(1)),
            running: Mutex::new(None),
        })
    }

    /// Starts checking the API server of `config` (the operator's own). Does nothing
    /// when already watching.
    pub fn watch(&self, config: kube_rs::Config) -> Result<(), Error> {
        let interval = self.interval;
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if running.is_some() {
            return Ok(());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (status, stop) = (Arc::clone(&self.status), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("api-server-check".into())
                .spawn(move || check_until_stopped(&config, &status, &stop, interval))
                .map_err(Error::Spawn)?
        };
        *running = Some(Running { stop, thread });
        Ok(())
    }
}

impl crate::plug::ApiServerReachability for ApiServerCheck {
    fn status(&self) -> Arc<ApiServerStatus> {
        Arc::clone(&self.status)
    }

    fn answer_within(&self) -> Duration {
        answer_within(self.interval)
    }
}

impl Drop for ApiServerCheck {
    fn drop(&mut self) {
        let running = self.running.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(Running { stop, thread }) = running.take() {
            stop.store(true, Ordering::Release);
            self.status.ask();
            // A check in progress ends within its timeout.
            let _ = thread.join();
        }
    }
}

/// The thread: a check, then a wait for the next (or for the monitor to ask), until
/// stopped.
fn check_until_stopped(
    config: &kube_rs::Config,
    status: &ApiServerStatus,
    stop: &AtomicBool,
    interval: Duration,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "the API server check cannot start its runtime; it stays off");
            return;
        }
    };
    let timeout = MAX_TIMEOUT.min(interval);
    let min_gap = min_gap(interval);
    let mut last_silent = false;
    while !stop.load(Ordering::Acquire) {
        let began = Instant::now();
        let answer = runtime.block_on(ask(config, timeout));
        if stop.load(Ordering::Acquire) {
            return;
        }
        match &answer {
            Err(error) if !last_silent => {
                tracing::warn!(error = %error, "the API server does not answer");
            }
            Ok(()) if last_silent => tracing::info!("the API server answers again"),
            _ => {}
        }
        last_silent = answer.is_err();
        status.record(answer, began);
        // A bounded rate, whoever asks.
        let next = began + min_gap;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        status.wait_asked(interval.saturating_sub(began.elapsed()));
    }
}

/// The shortest time between two checks, whoever asks.
fn min_gap(interval: Duration) -> Duration {
    interval / 5
}

/// How soon after the monitor asks, at the latest, a check of every `interval` has an
/// answer (or has given up): its rate limit, then its timeout.
fn answer_within(interval: Duration) -> Duration {
    min_gap(interval) + MAX_TIMEOUT.min(interval)
}

/// One check: `GET /version` on a client of its own (so a fresh connection), within
/// `timeout`. Any HTTP answer is `Ok`.
async fn ask(config: &kube_rs::Config, timeout: Duration) -> Result<(), String> {
    let mut config = config.clone();
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    let client = kube_rs::Client::try_from(config).map_err(|e| super::error_chain(&e))?;
    let request = warp::http::Request::get(PATH)
        .body(kube_rs::client::Body::empty())
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(timeout, client.send(request)).await {
        Ok(Ok(_response)) => Ok(()),
        Ok(Err(error)) => Err(super::error_chain(&error)),
        Err(_) => Err(format!(
            "no answer to GET {PATH} within {}",
            fmt_duration(timeout)
        )),
    }
}
