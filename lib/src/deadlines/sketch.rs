//! A bounded-memory sketch of reconcile durations: log-linear buckets of atomic counts.
//!
//! A duration in nanoseconds lands in one of [`BUCKETS`] buckets: below 16 ns, one per
//! nanosecond; above, 16 per power of two, so a bucket is at most 1/16 (6.25 %) of its
//! lower bound wide. Recording is one relaxed add and one load (plus, for a new maximum,
//! a `fetch_max`): no lock, no allocation. Quantiles read back the upper bound of their
//! bucket, so they err on the long side, which is the safe side for a deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;

/// Buckets of one sketch: every `u64` of nanoseconds has one (7.8 KiB of counts).
pub(crate) const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// The bucket of `nanos`.
fn bucket(nanos: u64) -> usize {
    if nanos < SUB {
        return nanos as usize;
    }
    let exponent = 63 - nanos.leading_zeros();
    let mantissa = (nanos >> (exponent - SUB_BITS)) & (SUB - 1);
    ((exponent - SUB_BITS + 1) as usize) * SUB as usize + mantissa as usize
}

/// The largest value of bucket `index`.
fn upper_bound(index: usize) -> u64 {
    let sub = SUB as usize;
    if index < sub {
        return index as u64;
    }
    let exponent = (index / sub) as u32 + SUB_BITS - 1;
    let mantissa = (index % sub) as u64;
    let lower = (SUB + mantissa) << (exponent - SUB_BITS);
    lower.saturating_add((1_u64 << (exponent - SUB_BITS)) - 1)
}

/// Durations recorded so far, in buckets.
pub(crate) struct Sketch {
    counts: Box<[AtomicU64]>,
    max: AtomicU64,
}

impl std::fmt::Debug for Sketch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sketch")
            .field("max_ns", &self.max.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for Sketch {
    fn default() -> Self {
        Self {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max: AtomicU64::new(0),
        }
    }
}

impl Sketch {
    /// Records one duration.
    pub(crate) fn record(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket(nanos)].fetch_add(1, Ordering::Relaxed);
        // A load first: once the maximum is known, a read-modify-write is rare.
        if nanos > self.max.load(Ordering::Relaxed) {
            self.max.fetch_max(nanos, Ordering::Relaxed);
        }
    }

    /// Takes back one duration recorded before (a reconcile found to have hung).
    /// The exact maximum cannot be taken back: the summary's maximum is then the upper
    /// bound of the highest bucket still counted.
    pub(crate) fn forget(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let _ =
            self.counts[bucket(nanos)]
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// A copy to compute quantiles from. Concurrent records may land on either side.
    #[must_use]
    pub(crate) fn summary(&self) -> Summary {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let highest = counts.iter().rposition(|n| *n > 0).map_or(0, upper_bound);
        Summary {
            count: counts.iter().sum(),
            counts,
            max: Duration::from_nanos(self.max.load(Ordering::Relaxed).min(highest)),
        }
    }
}

/// A copy of a [`Sketch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Summary {
    counts: Vec<u64>,
    count: u64,
    max: Duration,
}

impl Summary {
    /// A summary of `durations`, for tests and synthetic distributions.
    #[must_use]
    pub(crate) fn of(durations: impl IntoIterator<Item = Duration>) -> Self {
        let sketch = Sketch::default();
        for d in durations {
            sketch.record(d);
        }
        sketch.summary()
    }

    /// How many durations were recorded.
    #[must_use]
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// The longest, exactly.
    #[must_use]
    pub(crate) fn max(&self) -> Duration {
        self.max
    }

    /// The `q`-quantile (0 < q ≤ 1): the upper bound of the bucket holding the
    /// ⌈q·count⌉-th shortest duration, never above the maximum. `None` when empty.
    #[must_use]
    pub(crate) fn quantile(&self, q: f64) -> Option<Duration> {
        if self.count == 0 {
            return None;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(Duration::from_nanos(upper_bound(index)).min(self.max));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order_and_stay_narrow() {
        let mut previous = 0;
        for nanos in (0..10_000).chain([u64::MAX / 2, u64::MAX - 1, u64::MAX]) {
            let index = bucket(nanos);
            assert!(index < BUCKETS, "{nanos}");
            assert!(index >= previous, "{nanos}");
            previous = index;
            assert!(upper_bound(index) >= nanos, "{nanos}");
        }
        for index in SUB as usize..BUCKETS {
            let lower = upper_bound(index - 1) + 1;
            assert_eq!(bucket(lower), index, "{index}");
            assert_eq!(bucket(upper_bound(index)), index, "{index}");
            let width = upper_bound(index) - lower + 1;
            assert!(width <= lower / SUB, "{index}: {width} of {lower}");
        }
        assert_eq!(upper_bound(BUCKETS - 1), u64::MAX);
    }

    #[test]
    fn quantiles_are_within_a_sixteenth_above_the_exact_ones() {
        // 10,000 durations spread from 1 ms to about 10 s, deterministically.
        let mut durations: Vec<Duration> = (1..=10_000_u64)
            .map(|i| Duration::from_micros(1_000 + (i * i * 7_919) % 10_000_000))
            .collect();
        let summary = Summary::of(durations.iter().copied());
        durations.sort_unstable();
        assert_eq!(summary.count(), 10_000);
        assert_eq!(summary.max(), *durations.last().unwrap());
        for (q, rank) in [(0.5, 5_000), (0.99, 9_900), (0.999, 9_990), (1.0, 10_000)] {
            let exact = durations[rank - 1];
            let got = summary.quantile(q).unwrap();
            assert!(got >= exact, "p{q}: {got:?} < {exact:?}");
            assert!(got <= exact + exact / 16, "p{q}: {got:?} vs {exact:?}");
        }
    }

    #[test]
    fn a_forgotten_duration_leaves_count_and_maximum() {
        let sketch = Sketch::default();
        sketch.record(Duration::from_millis(100));
        sketch.record(Duration::from_secs(600));
        sketch.forget(Duration::from_secs(600));
        sketch.forget(Duration::from_secs(7)); // never recorded: no underflow
        let summary = sketch.summary();
        assert_eq!(summary.count(), 1);
        assert!(summary.max() >= Duration::from_millis(100));
        assert!(
            summary.max() <= Duration::from_millis(107),
            "{:?}",
            summary.max()
        );
        assert_eq!(summary.quantile(1.0), Some(summary.max()));
    }

    #[test]
    fn an_empty_sketch_has_no_quantile() {
        let summary = Sketch::default().summary();
        assert_eq!(summary.count(), 0);
        assert_eq!(summary.quantile(0.5), None);
        assert_eq!(summary.max(), Duration::ZERO);
    }
}
