//! Leader election on a coordination.k8s.io Lease, with the lease watched like a
//! reconcile.
//!
//! [`LeaderElection`] runs client-go's protocol (read the Lease, write it back with the
//! resourceVersion read; renew every retry period; step down when no renewal succeeded
//! within the renew deadline) and:
//! - runs every Lease request under a guard of the `leader-election` controller, so a
//!   request that hangs gets the same hang report as a reconcile;
//! - adds the `leader-election` check to liveness and readiness: it passes for
//!   followers (ready and idle) and fails when the leader's last renewal is older than
//!   the lease duration plus a tolerance (client-go's `HealthzAdaptor`);
//! - runs the leader's work (the controllers) only while it leads: on losing the lease
//!   it drops that work at once and returns [`Error::LeadershipLost`]; when the work
//!   ends by itself (graceful shutdown, drained), it releases the lease so that a
//!   follower takes over within about one retry period.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use reconcile_watchdog::Watchdog;
//! use reconcile_watchdog::kube::Controllers;
//! use reconcile_watchdog::kube::leader::{Config, LeaderElection, identity};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(watchdog: &Watchdog, client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! // The Lease `operators/my-operator`; kube-controller-manager's default timings.
//! let config = Config::new("operators", "my-operator", identity())
//!     .lease_duration(Duration::from_secs(15))
//!     .renew_deadline(Duration::from_secs(10))
//!     .retry_period(Duration::from_secs(2));
//! let election = LeaderElection::new(watchdog, config)?;
//! let shutdown = CancellationToken::new(); // cancel it on SIGTERM, as in docs/embedding.md
//! let (registry, health) = (watchdog.registry().clone(), Arc::clone(watchdog.health()));
//! let until = shutdown.clone();
//! election
//!     .run(client, shutdown, move |leadership| {
//!         // Built on taking the lease, dropped on losing it.
//!         Controllers::with_parts(registry, &health, until)
//!             .only_while(leadership)
//!             // .add("configmaps", controller, reconcile, error_policy, context)
//!             .run()
//!     })
//!     .await?; // Err(LeadershipLost): exit non-zero, restart as a follower
//! # Ok(())
//! # }
//! ```

mod decision;
mod lease;
mod status;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_rs::Client;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use self::decision::{Observed, Role};
use self::lease::{Attempt, LeaseLock};
use self::status::{LeaderCheck, Status};
use crate::guard::{self, ControllerHandle, ObjectKey, Registry};
use crate::health::{Check, Health};
use crate::metrics::Metrics;
use crate::watchdog::Watchdog;

pub use status::{LEADER_ELECTION, Leadership};

/// The kind the `leader-election` controller's guards name.
const KIND: &str = "Lease";

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The timings cannot work (see [`Config::validate`]).
    #[error("{0}")]
    Timing(String),
    /// A Lease request failed.
    #[error("lease request failed")]
    Api(#[source] kube_rs::Error),
    /// A Lease request did not answer in time.
    #[error("lease request did not answer within {}", humantime::format_duration(*.0))]
    TimedOut(Duration),
    /// A Lease request panicked or was cancelled by the watchdog.
    #[error("lease request stopped by the watchdog")]
    Watchdog(#[source] guard::Error),
    /// This process led and lost the lease; its controllers were stopped.
    #[error("leadership lost, holder {}", .holder.as_deref().unwrap_or("unknown"))]
    LeadershipLost {
        /// The new holder, when known.
        holder: Option<String>,
    },
}

/// Which Lease, who this candidate is, and the timings (kube-controller-manager's
/// `--leader-elect-*` flags and defaults).
#[derive(Clone, Debug)]
pub struct Config {
    namespace: String,
    name: String,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    tolerance: Option<Duration>,
}

impl Config {
    /// The Lease `namespace/name`, contended for as `identity`; lease duration 15s,
    /// renew deadline 10s, retry period 2s.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            tolerance: None,
        }
    }

    /// How long followers wait, after the Lease last changed, before taking it.
    #[must_use]
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// How long the leader keeps trying to renew before it steps down.
    #[must_use]
    pub fn renew_deadline(mut self, deadline: Duration) -> Self {
        self.renew_deadline = deadline;
        self
    }

    /// How often candidates try to take the lease and the leader renews it; also the
    /// deadline of each Lease request's guard.
    #[must_use]
    pub fn retry_period(mut self, period: Duration) -> Self {
        self.retry_period = period;
        self
    }

    /// How much older than the lease duration the leader's last renewal may be before
    /// the `leader-election` check fails (default: one retry period).
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = Some(tolerance);
        self
    }

    /// The identity this process contends as.
    #[must_use]
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// client-go's rules: every timing positive, the renew deadline shorter than the
    /// lease duration (the leader steps down before a follower may take over), the retry
    /// period shorter than the renew deadline (a failed renewal is retried in time).
    pub fn validate(&self) -> Result<(), Error> {
        if self.retry_period.is_zero() {
            return Err(Error::Timing(
                "the retry period must be greater than zero".into(),
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(Error::Timing(format!(
                "the renew deadline ({}) must be shorter than the lease duration ({})",
                humantime::format_duration(self.renew_deadline),
                humantime::format_duration(self.lease_duration)
            )));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(Error::Timing(format!(
                "the retry period ({}) must be shorter than the renew deadline ({})",
                humantime::format_duration(self.retry_period),
                humantime::format_duration(self.renew_deadline)
            )));
        }
        if self.namespace.is_empty() || self.name.is_empty() || self.identity.is_empty() {
            return Err(Error::Timing(
                "the lease namespace, name and identity must not be empty".into(),
            ));
        }
        Ok(())
    }
}

/// A candidate for the lease: its check is in the watchdog's health sets from the
/// start; [`run`](Self::run) campaigns, and leads while it holds the lease.
#[derive(Debug)]
pub struct LeaderElection {
    config: Config,
    status: Arc<Status>,
    requests: ControllerHandle,
    metrics: Option<Arc<Metrics>>,
}

impl LeaderElection {
    /// A candidate under `watchdog`: its guards, health sets and metrics.
    pub fn new(watchdog: &Watchdog, config: Config) -> Result<Self, Error> {
        Self::with_parts(
            watchdog.registry(),
            watchdog.health(),
            watchdog.shared_metrics().cloned(),
            config,
        )
    }

    /// Like [`new`](Self::new), from parts of your own.
    pub fn with_parts(
        registry: &Registry,
        health: &Health,
        metrics: Option<Arc<Metrics>>,
        config: Config,
    ) -> Result<Self, Error> {
        config.validate()?;
        let tolerance = config.tolerance.unwrap_or(config.retry_period);
        let status = Arc::new(Status::new(
            &config.identity,
            config.lease_duration,
            config.renew_deadline,
            tolerance,
        ));
        let check: Arc<dyn Check> = Arc::new(LeaderCheck(Arc::clone(&status)));
        health.liveness.add(Arc::clone(&check));
        health.readiness.add(check);
        if let Some(metrics) = &metrics {
            metrics.set_leader(&config.identity, false);
            let status = Arc::clone(&status);
            metrics.watch_lease_renewal_age(move || status.renewal_age(Instant::now()));
        }
        let requests = registry
            .controller(LEADER_ELECTION, KIND)
            .with_deadline(config.retry_period);
        Ok(Self {
            config,
            status,
            requests,
            metrics,
        })
    }

    /// The gate that tells whether this process holds the lease right now.
    #[must_use]
    pub fn leadership(&self) -> Leadership {
        Leadership(Arc::clone(&self.status))
    }

    /// Campaigns until this process holds the lease, then runs `lead` while it holds it.
    ///
    /// - `shutdown` cancelled before leading: returns `Ok` (nothing to release).
    /// - `lead` ends (after a graceful shutdown it drained): releases the lease, `Ok`.
    /// - The lease lost (another holder, or no renewal within the renew deadline): drops
    ///   `lead` at once, logs ERROR "leadership lost" and returns
    ///   [`Error::LeadershipLost`]; the process should exit and restart as a follower.
    pub async fn run<F, Fut>(
        self,
        client: Client,
        shutdown: CancellationToken,
        lead: F,
    ) -> Result<(), Error>
    where
        F: FnOnce(Leadership) -> Fut,
        Fut: Future<Output = ()>,
    {
        let lock = LeaseLock::new(
            client,
            &self.config.namespace,
            &self.config.name,
            &self.config.identity,
            self.config.lease_duration,
        );
        let mut observed = Observed::default();
        tracing::info!(
            identity = %self.config.identity,
            lease = %self.lease(),
            "leader election: campaigning for the lease"
        );
        let Some(acquired) = self.campaign(&lock, &mut observed, &shutdown).await else {
            return Ok(());
        };
        tracing::info!(
            identity = %self.config.identity,
            lease = %self.lease(),
            "leader election: acquired the lease; starting the controllers"
        );

        let lost = {
            let leading = std::pin::pin!(lead(self.leadership()));
            let holding = std::pin::pin!(self.hold(&lock, &mut observed, acquired));
            // The lease is polled first: after a freeze, its lapse is seen before the
            // controllers get a turn.
            match futures::future::select(holding, leading).await {
                futures::future::Either::Left((lost, _)) => Some(lost),
                futures::future::Either::Right(((), _)) => None,
            }
            // `lead` is dropped here: every controller and reconcile in flight with it.
        };
        self.set_leader(false);
        match lost {
            None => {
                self.release(&lock).await;
                Ok(())
            }
            Some(mut holder) => {
                self.status.lost(holder.clone());
                if holder.is_none() {
                    holder = self.current_holder(&lock).await;
                    self.status.lost(holder.clone());
                }
                tracing::error!(
                    identity = %self.config.identity,
                    lease = %self.lease(),
                    holder = holder.as_deref().unwrap_or("unknown"),
                    "leadership lost: every controller stopped; exiting to restart as a follower"
                );
                Err(Error::LeadershipLost { holder })
            }
        }
    }

    /// Tries every retry period until this candidate holds the lease (returns when its
    /// winning write was sent) or `shutdown` is cancelled (None).
    async fn campaign(
        &self,
        lock: &LeaseLock,
        observed: &mut Observed,
        shutdown: &CancellationToken,
    ) -> Option<Instant> {
        let mut last_holder: Option<Option<String>> = None;
        loop {
            if shutdown.is_cancelled() {
                return None;
            }
            let sent = Instant::now();
            // A follower has nothing to finish: a signal ends even a request in flight (a
            // winning write cut short leaves a lease that expires after its duration).
            let attempt = tokio::select! {
                () = shutdown.cancelled() => return None,
                attempt = self.request(
                    lock.try_acquire_or_renew(observed),
                    self.config.renew_deadline,
                ) => attempt,
            };
            match attempt {
                Ok(Attempt::Holding) => {
                    self.status.renewed(sent);
                    self.set_leader(true);
                    return Some(sent);
                }
                Ok(Attempt::Following { holder }) => {
                    // A lost race names no holder: keep the one known.
                    let holder = holder.or_else(|| last_holder.clone().flatten());
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(
                            identity = %self.config.identity,
                            holder = holder.as_deref().unwrap_or("unknown"),
                            "leader election: following; ready and idle"
                        );
                    }
                    self.status.following(holder.clone());
                    last_holder = Some(holder);
                }
                Err(error) => {
                    if self.status.role() == Role::Candidate {
                        self.status.following(None);
                    }
                    tracing::warn!(
                        error = %crate::kube::error_chain(&error),
                        lease = %self.lease(),
                        "leader election: could not read or take the lease; retrying"
                    );
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return None,
                () = tokio::time::sleep(jittered(self.config.retry_period)) => {}
            }
        }
    }

    /// Renews every retry period; returns when the lease is lost: to another holder
    /// (Some), or for want of a renewal within the renew deadline (None).
    async fn hold(
        &self,
        lock: &LeaseLock,
        observed: &mut Observed,
        mut renewed: Instant,
    ) -> Option<String> {
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let deadline = renewed + self.config.renew_deadline;
            let sent = Instant::now();
            // Frozen (SIGSTOP, a stalled node) past the deadline: a follower may hold
            // the lease already, so writing now could make two leaders.
            let Some(left) = deadline
                .checked_duration_since(sent)
                .filter(|d| !d.is_zero())
            else {
                self.count_renewal(false);
                return None;
            };
            match self
                .request(lock.try_acquire_or_renew(observed), left)
                .await
            {
                Ok(Attempt::Holding) => {
                    renewed = sent;
                    self.status.renewed(sent);
                    self.count_renewal(true);
                }
                Ok(Attempt::Following {
                    holder: Some(holder),
                }) => {
                    self.count_renewal(false);
                    return Some(holder);
                }
                Ok(Attempt::Following { holder: None }) => {
                    // Another candidate wrote first; the next read names it.
                    self.count_renewal(false);
                }
                Err(error) => {
                    self.count_renewal(false);
                    tracing::warn!(
                        error = %crate::kube::error_chain(&error),
                        lease = %self.lease(),
                        left = %humantime::format_duration(to_millis(
                            deadline.saturating_duration_since(Instant::now())
                        )),
                        "leader election: renewal failed; retrying until the renew deadline"
                    );
                }
            }
        }
    }

    /// Gives the lease up after a graceful shutdown, bounded by the renew deadline.
    async fn release(&self, lock: &LeaseLock) {
        match self
            .request(lock.release(), self.config.renew_deadline)
            .await
        {
            Ok(true) => tracing::info!(
                identity = %self.config.identity,
                lease = %self.lease(),
                "leader election: released the lease"
            ),
            Ok(false) => tracing::warn!(
                lease = %self.lease(),
                "leader election: the lease was no longer ours to release"
            ),
            Err(error) => tracing::warn!(
                error = %crate::kube::error_chain(&error),
                lease = %self.lease(),
                "leader election: could not release the lease; it expires after its duration"
            ),
        }
        self.status.released();
    }

    /// The holder named by the Lease now, read once and bounded by half a retry period
    /// (the exit must not wait long on an API server that does not answer): for the log
    /// line of a leader that lost without seeing to whom.
    async fn current_holder(&self, lock: &LeaseLock) -> Option<String> {
        self.request(lock.holder(), self.config.retry_period / 2)
            .await
            .ok()
            .flatten()
    }

    /// Runs one Lease request under a guard of the `leader-election` controller
    /// (deadline: one retry period), abandoned after `limit`.
    async fn request<T>(
        &self,
        request: impl Future<Output = Result<T, kube_rs::Error>>,
        limit: Duration,
    ) -> Result<T, Error> {
        let key = ObjectKey::namespaced(&self.config.namespace, &self.config.name);
        match tokio::time::timeout(limit, self.requests.guard(key, request)).await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(error))) => Err(Error::Api(error)),
            Ok(Err(error)) => Err(Error::Watchdog(error)),
            Err(_) => Err(Error::TimedOut(limit)),
        }
    }

    fn set_leader(&self, leading: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.set_leader(&self.config.identity, leading);
        }
    }

    fn count_renewal(&self, success: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.lease_renewal(success);
        }
    }

    fn lease(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }
}

/// `d` to the millisecond, for log lines.
fn to_millis(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `period` plus up to a tenth more, so that candidates started together spread out.
fn jittered(period: Duration) -> Duration {
    period + period.mul_f64(rand::rng().random_range(0.0..0.1))
}

/// An identity for this process: `POD_NAME` (set by the Deployment through the downward
/// API), else the hostname, plus `_` and a random suffix, so that a restarted pod is a
/// new candidate rather than a leader that believes it still holds the lease.
#[must_use]
pub fn identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.trim().is_empty())
        .or_else(hostname)
        .unwrap_or_else(|| "reconcile-watchdog".into());
    let suffix: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(6)
        .map(|c| char::from(c).to_ascii_lowercase())
        .collect();
    format!("{}_{suffix}", base.trim())
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_follow_client_go_rules() {
        let config = Config::new("ns", "lease", "me");
        assert!(config.clone().validate().is_ok());
        let equal = config
            .clone()
            .renew_deadline(Duration::from_secs(15))
            .validate()
            .unwrap_err();
        assert!(
            equal
                .to_string()
                .contains("must be shorter than the lease duration"),
            "{equal}"
        );
        let slow_retry = config
            .clone()
            .retry_period(Duration::from_secs(10))
            .validate()
            .unwrap_err();
        assert!(
            slow_retry
                .to_string()
                .contains("must be shorter than the renew deadline"),
            "{slow_retry}"
        );
        assert!(config.retry_period(Duration::ZERO).validate().is_err());
    }

    #[test]
    fn identities_differ_per_process_start() {
        let (a, b) = (identity(), identity());
        assert_ne!(a, b);
        let (base, suffix) = a.rsplit_once('_').unwrap();
        assert!(!base.is_empty());
        assert_eq!(suffix.len(), 6);
    }

    #[test]
    fn a_leader_whose_renewals_stopped_fails_liveness_naming_the_check() {
        let health = Health::new();
        let registry = Registry::new(Duration::from_secs(60));
        let config = Config::new("ns", "l", "me")
            .lease_duration(Duration::from_secs(4))
            .renew_deadline(Duration::from_secs(3))
            .retry_period(Duration::from_secs(1));
        let election = LeaderElection::with_parts(&registry, &health, None, config).unwrap();
        let now = Instant::now();
        election.status.renewed(now);
        assert!(health.liveness.run(&[]).passed());
        // The last renewal 5.5s ago: past lease (4s) + tolerance (one retry, 1s).
        let stale = now
            .checked_sub(Duration::from_millis(5500))
            .expect("the monotonic clock started more than 5.5s ago");
        election.status.renewed(stale);
        let report = health.liveness.run(&[]);
        assert!(!report.passed());
        let text = report.to_string();
        // The age is read from the real clock at the check: 5.5s or a little more.
        assert!(
            text.contains("[-]leader-election failed: the leader last renewed its lease ")
                && text.contains("ago, more than the lease duration 4.0s + tolerance 1.0s\n"),
            "{text}"
        );
        assert!(!election.leadership().is_held());
    }

    #[test]
    fn the_check_joins_both_sets_and_starts_as_a_passing_candidate() {
        let health = Health::new();
        let registry = Registry::new(Duration::from_secs(60));
        let election =
            LeaderElection::with_parts(&registry, &health, None, Config::new("ns", "l", "me"))
                .unwrap();
        assert!(
            health
                .liveness
                .names()
                .contains(&LEADER_ELECTION.to_owned())
        );
        assert!(
            health
                .readiness
                .names()
                .contains(&LEADER_ELECTION.to_owned())
        );
        let text = health.readiness.run(&[]).to_string();
        assert!(
            text.contains("[+]leader-election ok: candidate, holder not known yet"),
            "{text}"
        );
        assert!(!election.leadership().is_held());
    }
}
