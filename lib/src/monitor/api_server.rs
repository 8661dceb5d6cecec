//! Whether the API server answers at all, as the latest reachability check found it:
//! written by the checker (see `kube::apiserver`), read by the monitor, the `api-server`
//! readiness check and the metrics.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::verdict::{ApiServer, fmt_duration};

/// The name of the readiness check that fails while the API server does not answer.
pub(crate) const CHECK: &str = "api-server";

/// The latest answer of the reachability check, and the outage time it has counted.
#[derive(Debug, Default)]
pub struct ApiServerStatus {
    state: Mutex<State>,
    /// Set by [`ask`](ApiServerStatus::ask): the monitor wants a check now.
    asked: Mutex<bool>,
    ask: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// When the latest check that found the server answering was sent.
    answered_at: Option<Instant>,
    /// Since when it has not answered, and why, while it does not.
    silent: Option<(Instant, String)>,
    /// Outage time of outages that ended.
    silent_before: Duration,
}

impl ApiServerStatus {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a check sent at `asked_at`: `Ok` when the server gave any HTTP answer,
    /// the error otherwise.
    pub fn record(&self, answer: Result<(), String>, asked_at: Instant) {
        let mut state = self.lock();
        match answer {
            Ok(()) => {
                if let Some((since, _)) = state.silent.take() {
                    state.silent_before += asked_at.saturating_duration_since(since);
                }
                state.answered_at = Some(asked_at);
            }
            Err(error) => {
                let since = match state.silent.take() {
                    Some((since, _)) => since,
                    // The outage began after the last answer, at the latest when this
                    // unanswered check was sent.
                    None => asked_at,
                };
                state.silent = Some((since, error));
            }
        }
    }

    /// Asks the checker for a check now (it may keep to its own rate).
    pub(crate) fn ask(&self) {
        *self.asked.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.ask.notify_all();
    }

    /// Waits until asked, or for `timeout`; clears the request.
    #[cfg_attr(not(feature = "kube"), allow(dead_code))] // the kube check's alone
    pub(crate) fn wait_asked(&self, timeout: Duration) {
        let asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        let (mut asked, _) = self
            .ask
            .wait_timeout_while(asked, timeout, |asked| !*asked)
            .unwrap_or_else(|p| p.into_inner());
        *asked = false;
    }

    /// What the verdict decides by.
    #[must_use]
    pub(crate) fn state(&self) -> ApiServer {
        let state = self.lock();
        match &state.silent {
            Some((since, why)) => ApiServer::Silent {
                since: *since,
                why: why.clone(),
            },
            None => match state.answered_at {
                Some(asked_at) => ApiServer::Answers { asked_at },
                None => ApiServer::NotChecked,
            },
        }
    }

    /// Whether it answered at the latest check; `None` before the first.
    #[must_use]
    #[cfg(any(test, feature = "metrics"))]
    pub(crate) fn reachable(&self) -> Option<bool> {
        let state = self.lock();
        let checked = state.answered_at.is_some() || state.silent.is_some();
        checked.then_some(state.silent.is_none())
    }

    /// The total time it has not answered, up to `now`.
    #[must_use]
    #[cfg(any(test, feature = "metrics"))]
    pub(crate) fn unreachable_for(&self, now: Instant) -> Duration {
        let state = self.lock();
        state.silent_before
            + state.silent.as_ref().map_or(Duration::ZERO, |(since, _)| {
                now.saturating_duration_since(*since)
            })
    }

    /// The `api-server` readiness check at `now`.
    pub(crate) fn check(&self, now: Instant) -> Result<(), String> {
        match self.state() {
            ApiServer::Silent { since, why } => Err(format!(
                "the API server does not answer ({why}) for {}",
                fmt_duration(now.saturating_duration_since(since))
            )),
            ApiServer::Answers { .. } | ApiServer::NotChecked => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_outage_time_and_recovers() {
        let status = ApiServerStatus::default();
        let t0 = Instant::now();
        assert_eq!(status.reachable(), None);
        assert!(matches!(status.state(), ApiServer::NotChecked));
        status.record(Ok(()), t0);
        assert_eq!(status.reachable(), Some(true));
        status.record(
            Err("timed out after 2s".into()),
            t0 + Duration::from_secs(1),
        );
        status.record(
            Err("timed out after 2s".into()),
            t0 + Duration::from_secs(3),
        );
        assert!(
            matches!(status.state(), ApiServer::Silent { since, .. } if since == t0 + Duration::from_secs(1))
        );
        assert_eq!(
            status.check(t0 + Duration::from_secs(4)).unwrap_err(),
            "the API server does not answer (timed out after 2s) for 3s"
        );
        assert_eq!(
            status.unreachable_for(t0 + Duration::from_secs(4)),
            Duration::from_secs(3)
        );
        status.record(Ok(()), t0 + Duration::from_secs(5));
        assert!(status.check(t0 + Duration::from_secs(6)).is_ok());
        assert_eq!(
            status.unreachable_for(t0 + Duration::from_secs(9)),
            Duration::from_secs(4)
        );
    }
}
