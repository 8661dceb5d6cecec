//! The pure rules of leader election: what one look at the Lease tells a candidate to
//! do, and whether the leader's renewals are recent enough for the liveness check.
//!
//! Both take the time as an argument, so they are tested with an injected clock.

use std::time::{Duration, Instant};

/// What a candidate does after reading the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// It holds the lease: renew it.
    Renew,
    /// Nobody holds it, or the holder let it expire: take it.
    Acquire,
    /// Another candidate holds it and it has not expired.
    Follow {
        /// The holder's identity.
        holder: String,
    },
}

/// When this candidate last saw the Lease change, by resourceVersion.
///
/// Expiry is judged from that local moment plus the lease's duration, never from the
/// `renewTime` written by another node's clock: client-go's rule, immune to clock skew.
#[derive(Clone, Debug, Default)]
pub(crate) struct Observed {
    version: Option<String>,
    at: Option<Instant>,
}

impl Observed {
    /// Records that the Lease reads `version` at `now`; returns when it last changed.
    pub(crate) fn saw(&mut self, version: Option<&str>, now: Instant) -> Instant {
        if self.at.is_none() || self.version.as_deref() != version {
            self.version = version.map(str::to_owned);
            self.at = Some(now);
        }
        self.at.unwrap_or(now)
    }
}

/// The decision of one attempt, from the Lease's holder and duration as last read,
/// when this candidate saw that record change, and now.
pub(crate) fn decide(
    identity: &str,
    holder: Option<&str>,
    lease_duration: Duration,
    changed_at: Instant,
    now: Instant,
) -> Next {
    match holder.filter(|h| !h.is_empty()) {
        None => Next::Acquire,
        Some(h) if h == identity => Next::Renew,
        Some(_) if now.saturating_duration_since(changed_at) > lease_duration => Next::Acquire,
        Some(h) => Next::Follow {
            holder: h.to_owned(),
        },
    }
}

/// This process's part in the election, as the `leader-election` check sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// It has not read the Lease yet.
    Candidate,
    /// Another candidate leads (or nobody, until this one acquires).
    Follower {
        /// The holder, when there is one.
        holder: Option<String>,
    },
    /// It leads; `renewed` is when its latest successful write was sent.
    Leader {
        /// The start of the latest successful acquire or renewal.
        renewed: Instant,
    },
    /// It led and lost the lease; the process is stepping down.
    Lost {
        /// The new holder, when known.
        holder: Option<String>,
    },
}

/// The `leader-election` check: passes for candidates and followers (a follower has
/// nothing to renew), and for a leader whose last renewal is at most `lease_duration +
/// tolerance` old (client-go's `HealthzAdaptor`). `Ok` carries what `?verbose` shows.
pub(crate) fn verdict(
    role: &Role,
    identity: &str,
    lease_duration: Duration,
    tolerance: Duration,
    now: Instant,
) -> Result<String, String> {
    match role {
        Role::Candidate => Ok("candidate, holder not known yet".into()),
        Role::Follower { holder: Some(h) } => Ok(format!("follower, holder {h}")),
        Role::Follower { holder: None } => Ok("follower, no holder".into()),
        Role::Leader { renewed } => {
            let age = now.saturating_duration_since(*renewed);
            let limit = lease_duration + tolerance;
            if age > limit {
                Err(format!(
                    "the leader last renewed its lease {} ago, more than the lease duration {} + tolerance {}",
                    seconds(age),
                    seconds(lease_duration),
                    seconds(tolerance)
                ))
            } else {
                Ok(format!(
                    "leader, holder {identity}, renewed {} ago",
                    seconds(age)
                ))
            }
        }
        Role::Lost { holder } => Err(format!(
            "leadership lost, holder {}",
            holder.as_deref().unwrap_or("unknown")
        )),
    }
}

/// `1.5s`: tenths are enough for timings of seconds.
fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);
    const TOLERANCE: Duration = Duration::from_secs(2);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn an_empty_lease_is_taken_and_our_own_renewed() {
        let t0 = Instant::now();
        assert_eq!(decide("me", None, LEASE, t0, t0), Next::Acquire);
        assert_eq!(decide("me", Some(""), LEASE, t0, t0), Next::Acquire);
        assert_eq!(
            decide("me", Some("me"), LEASE, t0, t0 + secs(60)),
            Next::Renew
        );
    }

    #[test]
    fn another_holder_is_followed_until_its_lease_expires_by_our_clock() {
        let t0 = Instant::now();
        let follow = Next::Follow {
            holder: "pod-a".into(),
        };
        assert_eq!(decide("me", Some("pod-a"), LEASE, t0, t0), follow);
        assert_eq!(decide("me", Some("pod-a"), LEASE, t0, t0 + LEASE), follow);
        assert_eq!(
            decide(
                "me",
                Some("pod-a"),
                LEASE,
                t0,
                t0 + LEASE + Duration::from_millis(1)
            ),
            Next::Acquire
        );
    }

    #[test]
    fn expiry_counts_from_the_last_change_seen_not_the_first() {
        let t0 = Instant::now();
        let mut observed = Observed::default();
        assert_eq!(observed.saw(Some("1"), t0), t0);
        // The same version later: the holder has not renewed since t0.
        assert_eq!(observed.saw(Some("1"), t0 + secs(10)), t0);
        // A renewal (new version) restarts the count.
        assert_eq!(observed.saw(Some("2"), t0 + secs(12)), t0 + secs(12));
        let changed = observed.saw(Some("2"), t0 + secs(20));
        assert_eq!(
            decide("me", Some("pod-a"), LEASE, changed, t0 + secs(20)),
            Next::Follow {
                holder: "pod-a".into()
            }
        );
        assert_eq!(
            decide("me", Some("pod-a"), LEASE, changed, t0 + secs(28)),
            Next::Acquire
        );
    }

    #[test]
    fn followers_and_candidates_pass_with_the_holder_shown() {
        let now = Instant::now();
        assert_eq!(
            verdict(
                &Role::Follower {
                    holder: Some("pod-a_x1".into())
                },
                "me",
                LEASE,
                TOLERANCE,
                now
            ),
            Ok("follower, holder pod-a_x1".into())
        );
        assert!(verdict(&Role::Candidate, "me", LEASE, TOLERANCE, now).is_ok());
        assert!(
            verdict(
                &Role::Follower { holder: None },
                "me",
                LEASE,
                TOLERANCE,
                now
            )
            .is_ok()
        );
    }

    #[test]
    fn a_leader_fails_once_its_last_renewal_is_older_than_lease_plus_tolerance() {
        let renewed = Instant::now();
        let leader = Role::Leader { renewed };
        assert_eq!(
            verdict(&leader, "me", LEASE, TOLERANCE, renewed + secs(3)),
            Ok("leader, holder me, renewed 3.0s ago".into())
        );
        // Exactly at the limit it still passes; a moment later it fails.
        assert!(verdict(&leader, "me", LEASE, TOLERANCE, renewed + LEASE + TOLERANCE).is_ok());
        let reason = verdict(
            &leader,
            "me",
            LEASE,
            TOLERANCE,
            renewed + LEASE + TOLERANCE + Duration::from_millis(100),
        )
        .unwrap_err();
        assert_eq!(
            reason,
            "the leader last renewed its lease 17.1s ago, more than the lease duration 15.0s + tolerance 2.0s"
        );
    }

    #[test]
    fn a_lost_leadership_fails_naming_the_new_holder() {
        let now = Instant::now();
        assert_eq!(
            verdict(
                &Role::Lost {
                    holder: Some("pod-b_y2".into())
                },
                "me",
                LEASE,
                TOLERANCE,
                now
            ),
            Err("leadership lost, holder pod-b_y2".into())
        );
    }
}
