//! The report budget: how many per-reconcile lines the log gets, a burst per scan and a
//! rate across scans; what is over it is counted into one summary per kind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Summary, SummaryKind};

/// A token bucket: `burst` tokens at most, refilled at `per_minute`.
#[derive(Debug)]
pub(super) struct Budget {
    burst: u32,
    per_minute: u32,
    /// Tokens left, in millionths of a token, so refills are exact in integers.
    micro_tokens: u64,
    refilled_at: Option<Instant>,
}

const MICRO: u64 = 1_000_000;

impl Budget {
    pub(super) fn new(burst: u32, per_minute: u32) -> Self {
        Self {
            burst,
            per_minute,
            micro_tokens: u64::from(burst) * MICRO,
            refilled_at: None,
        }
    }

    /// Takes `wanted` tokens at `now` if there are that many, else none; returns how
    /// many it got.
    pub(super) fn take_all(&mut self, wanted: usize, now: Instant) -> usize {
        self.refill(now);
        if self.whole() < wanted {
            return 0;
        }
        self.take(wanted, now)
    }

    fn whole(&self) -> usize {
        usize::try_from(self.micro_tokens / MICRO).unwrap_or(usize::MAX)
    }

    /// Takes up to `wanted` tokens at `now`; returns how many it got.
    pub(super) fn take(&mut self, wanted: usize, now: Instant) -> usize {
        self.refill(now);
        let got = wanted.min(self.whole());
        self.micro_tokens -= u64::try_from(got).unwrap_or(u64::MAX) * MICRO;
        got
    }

    fn refill(&mut self, now: Instant) {
        let cap = u64::from(self.burst) * MICRO;
        if let Some(at) = self.refilled_at {
            let elapsed = now.saturating_duration_since(at);
            // Whole micro-tokens earned: per_minute tokens per 60 s.
            let earned_micro = elapsed
                .as_micros()
                .saturating_mul(u128::from(self.per_minute))
                .saturating_mul(u128::from(MICRO))
                / 60_000_000;
            self.micro_tokens = self
                .micro_tokens
                .saturating_add(u64::try_from(earned_micro).unwrap_or(u64::MAX))
                .min(cap);
        }
        self.refilled_at = Some(now);
    }
}

/// Lines over the budget of one kind, waiting for their summary.
#[derive(Debug, Default)]
pub(super) struct Pending {
    count: usize,
    /// Counts per (controller, state or outcome); controllers are few, and told apart
    /// by their name's address.
    by_group: Vec<(Arc<str>, &'static str, usize)>,
    last_summary: Option<Instant>,
}

impl Pending {
    pub(super) fn add(&mut self, (controller, state): (Arc<str>, &'static str)) {
        self.count += 1;
        match self
            .by_group
            .iter_mut()
            .find(|(c, s, _)| *s == state && crate::monitor::summary::same_name(c, &controller))
        {
            Some((_, _, n)) => *n += 1,
            None => self.by_group.push((controller, state, 1)),
        }
    }

    /// The summary of what is pending, when there is some and the last summary of this
    /// kind is at least `every` old.
    pub(super) fn flush(
        &mut self,
        kind: SummaryKind,
        every: Duration,
        now: Instant,
    ) -> Option<Summary> {
        if self.count == 0
            || self
                .last_summary
                .is_some_and(|at| now.saturating_duration_since(at) < every)
        {
            return None;
        }
        self.last_summary = Some(now);
        let mut by_group = std::mem::take(&mut self.by_group);
        // In a stable order for equal counts: by name, then state.
        by_group.sort_by(|a, b| (&*a.0, a.1).cmp(&(&*b.0, b.1)));
        Some(Summary {
            kind,
            count: std::mem::take(&mut self.count),
            by_group: crate::monitor::summary::count_groups(
                by_group
                    .iter()
                    .map(|(controller, state, n)| (super::Group(controller, state), *n)),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut budget = Budget::new(10, 6);
        assert_eq!(budget.take(100, t0), 10);
        assert_eq!(budget.take(100, t0 + Duration::from_secs(9)), 0);
        assert_eq!(budget.take(100, t0 + Duration::from_secs(10)), 1);
        assert_eq!(budget.take(100, t0 + Duration::from_secs(25)), 1);
        assert_eq!(budget.take(100, t0 + Duration::from_secs(30)), 1);
        // Refills stop at the burst.
        assert_eq!(budget.take(100, t0 + Duration::from_secs(3600)), 10);
        // All or nothing.
        let t1 = t0 + Duration::from_secs(7200);
        assert_eq!(budget.take_all(11, t1), 0);
        assert_eq!(budget.take_all(4, t1), 4);
        assert_eq!(budget.take(100, t1), 6);
    }
}
