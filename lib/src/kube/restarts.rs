//! What the previous run of the operator's container left on its Pod: read once at
//! start, a restart that followed a liveness failure shows in the metrics
//! (`reconcile_watchdog_last_hang_restart_timestamp_seconds`, which the
//! `ReconcileHangRestart` alert reads) and in one WARN.
//!
//! The process that failed liveness wrote why to its termination message as it exited
//! ([`crate::restart`]); the kubelet keeps it in the container's
//! `lastState.terminated.message`. The new process reads its own Pod (`POD_NAMESPACE`,
//! `POD_NAME`; the RBAC `get` on pods of its namespace) and looks for it there.
//!
//! ```no_run
//! # async fn example(watchdog: &reconcile_watchdog::Watchdog, client: kube::Client) {
//! use reconcile_watchdog::kube::restarts::PreviousRun;
//! // Spawned: a slow API server must not hold up the start.
//! tokio::spawn(PreviousRun::new(watchdog).read(client));
//! # }
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s::api::core::v1::Pod;
use kube_rs::{Api, Client};

use crate::Watchdog;
use crate::metrics::Metrics;
use crate::restart::MESSAGE_START;

/// How long reading the Pod may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes of the previous message the WARN repeats.
const LOGGED_BYTES: usize = 1024;

/// Reads the previous run of the operator's container; see the [module](self).
#[derive(Debug)]
pub struct PreviousRun {
    metrics: Option<Arc<Metrics>>,
}

impl PreviousRun {
    /// For `watchdog`, whose metrics (when collected) get the gauge.
    #[must_use]
    pub fn new(watchdog: &Watchdog) -> Self {
        Self {
            metrics: watchdog.shared_metrics().cloned(),
        }
    }

    /// Reads, with `client`, the Pod named by `POD_NAMESPACE` and `POD_NAME`: when the
    /// previous run of one of its containers ended with a termination message of the
    /// watchdog (it exited while liveness failed), sets
    /// `reconcile_watchdog_last_hang_restart_timestamp_seconds` to when that run ended
    /// and logs one WARN with the message. Outside a Pod, or when the Pod cannot be
    /// read (within 10 seconds), it says why at DEBUG and does nothing else.
    pub async fn read(self, client: Client) {
        let var = |name| {
            std::env::var(name)
                .ok()
                .filter(|v: &String| !v.trim().is_empty())
        };
        let Some((namespace, name)) = var("POD_NAMESPACE").zip(var("POD_NAME")) else {
            tracing::debug!("no POD_NAMESPACE and POD_NAME: the previous run is not read");
            return;
        };
        let pods: Api<Pod> = Api::namespaced(client, namespace.trim());
        match tokio::time::timeout(READ_TIMEOUT, pods.get(name.trim())).await {
            Ok(Ok(pod)) => record(&pod, self.metrics.as_deref()),
            Ok(Err(error)) => tracing::debug!(
                error = %super::error_chain(&error),
                "the operator's own Pod could not be read: its previous run is not known"
            ),
            Err(_) => tracing::debug!("the operator's own Pod was not read in time"),
        }
    }
}

fn record(pod: &Pod, metrics: Option<&Metrics>) {
    let Some((ended, message)) = previous_hang_restart(pod) else {
        return;
    };
    if let Some(metrics) = metrics {
        metrics.hang_restart(ended);
    }
    tracing::warn!(
        previous = %crate::monitor::summary::clip(message, LOGGED_BYTES),
        ended_at = %humantime::format_rfc3339_seconds(ended),
        "this container was restarted after liveness failed; the previous run's termination message follows"
    );
}

/// When the previous run of a container of `pod` ended with a termination message of
/// the watchdog, and that message; the latest when several did.
fn previous_hang_restart(pod: &Pod) -> Option<(SystemTime, String)> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses
        .iter()
        .filter_map(|status| {
            let terminated = status.last_state.as_ref()?.terminated.as_ref()?;
            let message = terminated.message.as_deref()?;
            if !message.starts_with(MESSAGE_START) {
                return None;
            }
            // A run that ended has an end; without one, now is the latest it can be.
            let ended = terminated
                .finished_at
                .as_ref()
                .map_or_else(SystemTime::now, |t| SystemTime::from(t.0));
            Some((ended, message.to_owned()))
        })
        .max_by_key(|(ended, _)| *ended)
}

#[cfg(test)]
mod tests {
    use k8s::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };
    use k8s::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn pod(last: &[(Option<&str>, i64)]) -> Pod {
        let statuses = last
            .iter()
            .enumerate()
            .map(|(i, (message, ended))| ContainerStatus {
                name: format!("c{i}"),
                last_state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 1,
                        message: message.map(str::to_owned),
                        finished_at: Some(Time(k8s::jiff::Timestamp::from_second(*ended).unwrap())),
                        ..ContainerStateTerminated::default()
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            })
            .collect();
        Pod {
            status: Some(PodStatus {
                container_statuses: Some(statuses),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn only_a_message_of_the_watchdog_is_a_hang_restart() {
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let hang = "reconcile-watchdog: liveness failed (reconcilers); 1 reconcile stuck";
        assert_eq!(
            previous_hang_restart(&pod(&[(Some(hang), 1_000)])),
            Some((at(1_000), hang.to_owned()))
        );
        // An OOM kill, a panic's last log lines, a clean run: not the watchdog's.
        assert_eq!(
            previous_hang_restart(&pod(&[
                (None, 1_000),
                (Some("thread 'main' panicked"), 2_000)
            ])),
            None
        );
        assert_eq!(previous_hang_restart(&Pod::default()), None);
        // The latest of several.
        let both = pod(&[(Some(hang), 1_000), (Some(hang), 3_000)]);
        assert_eq!(
            previous_hang_restart(&both).map(|(t, _)| t),
            Some(at(3_000))
        );
    }

    #[test]
    fn a_hang_restart_sets_the_gauge_to_when_the_run_ended() {
        let metrics = Metrics::new(Arc::default());
        let hang = "reconcile-watchdog: liveness failed (runtime)";
        record(&pod(&[(Some(hang), 1_700_000_000)]), Some(&metrics));
        let text = metrics.encode();
        assert!(
            text.contains(
                "\nreconcile_watchdog_last_hang_restart_timestamp_seconds 1700000000.0\n"
            ),
            "{text}"
        );
    }
}
