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

/// The most reconciles one summary names, oldest first; it counts the rest.
const SUMMARY_NAMES: usize = 20;

/// The most bytes of one summary's names.
const SUMMARY_NAME_BYTES: usize = 2048;

/// Lines over the budget of one kind, waiting for their summary.
#[derive(Debug, Default)]
pub(super) struct Pending {
    count: usize,
    /// Counts per (controller, state or outcome); controllers are few, and told apart
    /// by their name's address.
    by_group: Vec<(Arc<str>, &'static str, usize)>,
    /// At most [`SUMMARY_NAMES`] of them, as `controller object`, those never named
    /// on a line before first, then the oldest by start: the summary names these, so
    /// that a hang over the budget still has its name on a line, if not this one then a
    /// later reminder's or its end's. Keyed by (named before, start), smallest kept.
    names: Vec<((bool, Instant), u64, String)>,
    /// Lines of this summary it will not name.
    unnamed: usize,
    last_summary: Option<Instant>,
}

impl Pending {
    /// Counts one line over the budget, of reconcile `id` started at `started`, which
    /// no line has named yet if `fresh`; `name` is asked for only if it is kept.
    pub(super) fn add(
        &mut self,
        (controller, state): (Arc<str>, &'static str),
        started: Instant,
        fresh: bool,
        id: u64,
        name: impl FnOnce() -> String,
    ) {
        self.count += 1;
        match self
            .by_group
            .iter_mut()
            .find(|(c, s, _)| *s == state && crate::monitor::summary::same_name(c, &controller))
        {
            Some((_, _, n)) => *n += 1,
            None => self.by_group.push((controller, state, 1)),
        }
        let key = (!fresh, started);
        if self.names.len() < SUMMARY_NAMES {
            self.names.push((key, id, name()));
            return;
        }
        // Full: the last kept (named before, or the youngest) gives way to one before it.
        self.unnamed += 1;
        if let Some(last) = self.names.iter_mut().max_by_key(|(key, _, _)| *key)
            && key < last.0
        {
            *last = (key, id, name());
        }
    }

    /// The summary of what is pending, when there is some and the last summary of this
    /// kind is at least `every` old, with the ids of the reconciles it names.
    pub(super) fn flush(
        &mut self,
        kind: SummaryKind,
        every: Duration,
        now: Instant,
    ) -> Option<(Summary, Vec<u64>)> {
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
        let mut names = std::mem::take(&mut self.names);
        // Oldest first, as the line says.
        names.sort_by(|a, b| (a.0.1, &a.2).cmp(&(b.0.1, &b.2)));
        let kept = names.len();
        let mut named = String::new();
        let mut named_ids = Vec::with_capacity(kept);
        let mut unnamed = std::mem::take(&mut self.unnamed);
        for (n, (_, id, name)) in names.into_iter().enumerate() {
            // One long name may not crowd out the others.
            let name = crate::monitor::summary::clip(name, SUMMARY_NAME_BYTES / 4);
            if named.len() + ", ".len() + name.len() > SUMMARY_NAME_BYTES {
                unnamed += kept - n;
                break;
            }
            if !named.is_empty() {
                named.push_str(", ");
            }
            named.push_str(&name);
            named_ids.push(id);
        }
        let summary = Summary {
            kind,
            count: std::mem::take(&mut self.count),
            by_group: crate::monitor::summary::count_groups(
                by_group
                    .iter()
                    .map(|(controller, state, n)| (super::Group(controller, state), *n)),
            ),
            named,
            unnamed,
        };
        Some((summary, named_ids))
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

    fn group() -> (Arc<str>, &'static str) {
        (Arc::from("web"), "awaiting")
    }

    #[test]
    fn a_summary_names_the_oldest_it_counts_and_counts_the_unnamed() {
        let t0 = Instant::now();
        let every = Duration::from_secs(15);
        let mut pending = Pending::default();
        // Younger first: the oldest must still be the ones named.
        for i in (0..25_u64).rev() {
            let started = t0 + Duration::from_secs(i);
            pending.add(group(), started, true, i, || format!("web ns/o-{i:02}"));
        }
        let (summary, ids) = pending.flush(SummaryKind::Hung, every, t0).unwrap();
        assert_eq!(ids, (0..20).collect::<Vec<u64>>(), "the ids of those named");
        assert_eq!(summary.count, 25);
        assert_eq!(summary.unnamed, 5);
        let names: Vec<&str> = summary.named.split(", ").collect();
        let oldest: Vec<String> = (0..20).map(|i| format!("web ns/o-{i:02}")).collect();
        assert_eq!(names, oldest, "the oldest twenty, oldest first");

        // A few are all named; the next summary starts afresh.
        for i in 0..3_u64 {
            pending.add(group(), t0, true, 100 + i, || format!("web ns/p-{i}"));
        }
        let (summary, _) = pending.flush(SummaryKind::Hung, every, t0 + every).unwrap();
        assert_eq!(
            (summary.count, summary.unnamed, summary.named.as_str()),
            (3, 0, "web ns/p-0, web ns/p-1, web ns/p-2")
        );
    }

    #[test]
    fn long_names_stay_within_the_bytes_of_a_summary() {
        let t0 = Instant::now();
        let mut pending = Pending::default();
        for i in 0..20_u64 {
            pending.add(group(), t0 + Duration::from_secs(i), true, i, || {
                format!("web ns/{i:02}-{}", "x".repeat(300))
            });
        }
        let (summary, ids) = pending
            .flush(SummaryKind::Hung, Duration::from_secs(15), t0)
            .unwrap();
        assert_eq!(
            ids.len(),
            summary.named.split(", ").count(),
            "only those named"
        );
        assert!(
            summary.named.len() <= SUMMARY_NAME_BYTES,
            "{}",
            summary.named.len()
        );
        let named = summary.named.split(", ").count();
        assert!(named >= 4, "{named} names");
        assert_eq!(named + summary.unnamed, 20, "every one named or counted");
        assert!(summary.named.starts_with("web ns/00-"), "{}", summary.named);
    }

    #[test]
    fn a_summary_names_those_never_named_before_the_older_ones_named_already() {
        let t0 = Instant::now();
        let mut pending = Pending::default();
        // Thirty over the budget: the ten oldest were named on an earlier line.
        for i in 0..30_u64 {
            let fresh = i >= 10;
            pending.add(group(), t0 + Duration::from_secs(i), fresh, i, || {
                format!("web ns/q-{i:02}")
            });
        }
        let (summary, ids) = pending
            .flush(SummaryKind::StillHung, Duration::from_secs(15), t0)
            .unwrap();
        assert_eq!(
            ids,
            (10..30).collect::<Vec<u64>>(),
            "the twenty never named"
        );
        assert_eq!(summary.unnamed, 10);
        assert!(
            summary.named.starts_with("web ns/q-10"),
            "{}",
            summary.named
        );
    }
}
