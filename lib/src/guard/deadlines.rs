//! Deadlines per controller, and the share of a deadline past which an end is a near miss.

use std::collections::HashMap;
use std::time::Duration;

/// Deadlines per controller: a default, and overrides by controller name.
#[derive(Clone, Debug)]
pub struct Deadlines {
    default: Duration,
    overrides: HashMap<String, Duration>,
    /// The share of its deadline past which a reconcile that ends on time is a near
    /// miss; `None`: never.
    near_miss_share: Option<f64>,
}

/// The default near-miss share of a deadline: 80 %.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub const NEAR_MISS_SHARE: f64 = 0.8;

impl Deadlines {
    /// Every controller gets `default` unless overridden.
    #[must_use]
    pub fn new(default: Duration) -> Self {
        Self {
            default,
            overrides: HashMap::new(),
            near_miss_share: Some(NEAR_MISS_SHARE),
        }
    }

    /// A reconcile that ends on time after more than `share` (between 0 and 1) of its
    /// deadline is a near miss, told to the observer; `None` turns near misses off.
    /// A share outside (0, 1) turns them off too.
    #[must_use]
    pub fn near_miss_share(mut self, share: Option<f64>) -> Self {
        self.near_miss_share = share.filter(|s| *s > 0.0 && *s < 1.0);
        self
    }

    /// The near-miss share (`None`: off).
    #[must_use]
    pub fn near_miss(&self) -> Option<f64> {
        self.near_miss_share
    }

    /// The deadline of controller `name` when a flag or [`with`](Self::with) set it,
    /// `None` when it has the default.
    #[must_use]
    pub fn override_for(&self, name: &str) -> Option<Duration> {
        self.overrides.get(name).copied()
    }

    /// The names of the controllers with a deadline of their own.
    pub fn overridden(&self) -> impl Iterator<Item = &str> {
        self.overrides.keys().map(String::as_str)
    }

    /// How long a reconcile with `deadline` runs before its end is told to the
    /// observer as late: past the near-miss share, or past the deadline when off.
    pub(super) fn late_after(&self, deadline: Duration) -> Duration {
        self.near_miss_share
            .map_or(deadline, |share| deadline.mul_f64(share))
    }

    /// Gives controller `name` its own deadline.
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, deadline: Duration) -> Self {
        self.overrides.insert(name.into(), deadline);
        self
    }

    /// The deadline of controller `name`.
    #[must_use]
    pub fn for_controller(&self, name: &str) -> Duration {
        self.overrides.get(name).copied().unwrap_or(self.default)
    }

    /// The default deadline.
    #[must_use]
    pub fn default_deadline(&self) -> Duration {
        self.default
    }
}

impl From<Duration> for Deadlines {
    fn from(default: Duration) -> Self {
        Self::new(default)
    }
}
