//! What the election has found so far, shared by the elector, the `leader-election`
//! check, the metrics and the controllers' leadership gate.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::decision::{self, Role};
use crate::health::Check;

/// The name of the liveness (and readiness) check of the election.
pub const LEADER_ELECTION: &str = "leader-election";

/// The election's state: the role for the check, and until when the lease counts as
/// held for the gate (an atomic, read before every reconcile).
#[derive(Debug)]
pub(crate) struct Status {
    role: Mutex<Role>,
    /// Nanoseconds after `epoch` until which this process may act as leader; 0 when it
    /// does not lead.
    held_until: AtomicU64,
    epoch: Instant,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    tolerance: Duration,
}

impl Status {
    pub(crate) fn new(
        identity: &str,
        lease_duration: Duration,
        renew_deadline: Duration,
        tolerance: Duration,
    ) -> Self {
        Self {
            role: Mutex::new(Role::Candidate),
            held_until: AtomicU64::new(0),
            epoch: Instant::now(),
            identity: identity.to_owned(),
            lease_duration,
            renew_deadline,
            tolerance,
        }
    }

    pub(crate) fn role(&self) -> Role {
        self.role.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, role: Role) {
        *self.role.lock().unwrap_or_else(|p| p.into_inner()) = role;
    }

    /// It follows `holder` (None: the lease is free but not yet taken by this process).
    pub(crate) fn following(&self, holder: Option<String>) {
        self.held_until.store(0, Ordering::Release);
        self.set(Role::Follower { holder });
    }

    /// A write that began at `sent` acquired or renewed the lease. The lease counts as
    /// held until `sent + renew deadline`: the elector steps down by then without a
    /// newer renewal, before any follower may take over at `lease duration`.
    pub(crate) fn renewed(&self, sent: Instant) {
        let until = match sent.checked_duration_since(self.epoch) {
            Some(after) => after + self.renew_deadline,
            None => self
                .renew_deadline
                .saturating_sub(self.epoch.duration_since(sent)),
        };
        self.held_until.store(
            u64::try_from(until.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Release,
        );
        self.set(Role::Leader { renewed: sent });
    }

    /// It led and lost the lease (to `holder`, when known).
    pub(crate) fn lost(&self, holder: Option<String>) {
        self.held_until.store(0, Ordering::Release);
        self.set(Role::Lost { holder });
    }

    /// It released the lease on shutdown.
    pub(crate) fn released(&self) {
        self.held_until.store(0, Ordering::Release);
        self.set(Role::Follower { holder: None });
    }

    /// Whether this process may act as leader at `now`.
    pub(crate) fn holds(&self, now: Instant) -> bool {
        let now =
            u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        now < self.held_until.load(Ordering::Acquire)
    }

    /// How long ago the leader's last renewal was sent; None when it does not lead.
    pub(crate) fn renewal_age(&self, now: Instant) -> Option<Duration> {
        match self.role() {
            Role::Leader { renewed } => Some(now.saturating_duration_since(renewed)),
            _ => None,
        }
    }

    /// The check's answer at `now`: `Ok` with the role and holder, or why it fails.
    pub(crate) fn verdict(&self, now: Instant) -> Result<String, String> {
        decision::verdict(
            &self.role(),
            &self.identity,
            self.lease_duration,
            self.tolerance,
            now,
        )
    }
}

/// The `leader-election` check (liveness, and listed in readiness).
#[derive(Debug)]
pub(crate) struct LeaderCheck(pub(crate) std::sync::Arc<Status>);

impl Check for LeaderCheck {
    fn name(&self) -> &str {
        LEADER_ELECTION
    }

    fn check(&self) -> Result<(), String> {
        self.0.verdict(Instant::now()).map(|_| ())
    }

    fn detail(&self) -> Result<Option<String>, String> {
        self.0.verdict(Instant::now()).map(Some)
    }
}

/// Whether this process holds the lease now: the gate the controllers pass before each
/// reconcile, so that a leader that has lost its lease (or cannot tell, having been
/// frozen past its renew deadline) writes nothing more while it steps down.
#[derive(Clone, Debug)]
pub struct Leadership(pub(crate) std::sync::Arc<Status>);

impl Leadership {
    /// True while the last renewal is younger than the renew deadline.
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.0.holds(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_closes_at_the_renew_deadline_and_on_loss() {
        let status = Status::new(
            "me",
            Duration::from_secs(15),
            Duration::from_secs(10),
            Duration::from_secs(2),
        );
        let t0 = Instant::now();
        assert!(!status.holds(t0));
        status.renewed(t0);
        assert!(status.holds(t0 + Duration::from_secs(9)));
        assert!(!status.holds(t0 + Duration::from_secs(10)));
        assert_eq!(
            status.renewal_age(t0 + Duration::from_secs(4)),
            Some(Duration::from_secs(4))
        );
        status.lost(Some("pod-b".into()));
        assert!(!status.holds(t0));
        assert_eq!(status.renewal_age(t0), None);
        assert!(status.verdict(t0).is_err());
    }
}
