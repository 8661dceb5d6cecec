//! The reconcile duration histogram: on atomics, one observation per reconcile's end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeMetric;
use prometheus_client::metrics::MetricType;

use super::RECONCILE_BUCKETS;

/// [`RECONCILE_BUCKETS`] in nanoseconds, for [`DurationHistogram`]: computed at compile
/// time, so an observation reads no lazy cell.
const RECONCILE_BUCKET_NANOS: [u64; RECONCILE_BUCKETS.len()] = {
    let mut nanos = [0; RECONCILE_BUCKETS.len()];
    let mut i = 0;
    while i < nanos.len() {
        // Rounded to the nearest nanosecond (`f64::round` is not const).
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        {
            nanos[i] = (RECONCILE_BUCKETS[i] * 1e9 + 0.5) as u64;
        }
        i += 1;
    }
    nanos
};

/// A histogram of reconcile durations over [`RECONCILE_BUCKETS`] on atomics: every
/// reconcile's end records into one, so it takes no lock (prometheus-client's
/// `Histogram` locks a mutex per observation) and sums whole nanoseconds.
#[derive(Clone, Debug, Default)]
pub(super) struct DurationHistogram(Arc<DurationCounts>);

#[derive(Debug, Default)]
struct DurationCounts {
    /// Per bucket, not cumulative; the last one is `+Inf`.
    buckets: [AtomicU64; RECONCILE_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl DurationHistogram {
    pub(super) fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        // The first bucket whose bound is at or above it (`le`).
        let bucket = RECONCILE_BUCKET_NANOS.partition_point(|&bound| bound < nanos);
        let counts = &self.0;
        counts.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        counts.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl prometheus_client::metrics::TypedMetric for DurationHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for DurationHistogram {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        // Per bucket: the encoder adds them up into the cumulative `le` counts.
        let buckets: Vec<(f64, u64)> = RECONCILE_BUCKETS
            .iter()
            .chain(&[f64::INFINITY])
            .zip(&self.0.buckets)
            .map(|(&bound, n)| (bound, n.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        #[allow(clippy::cast_precision_loss)]
        let sum = self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_lands_in_the_first_bucket_at_or_above_it() {
        let histogram = DurationHistogram::default();
        for millis in [30, 50, 51, 7_200_000] {
            histogram.observe(Duration::from_millis(millis));
        }
        let counts: Vec<u64> = histogram
            .0
            .buckets
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect();
        // le 0.05 holds 30 ms and exactly 50 ms; 51 ms is in le 0.1; two hours in +Inf.
        assert_eq!(counts[2], 2, "{counts:?}");
        assert_eq!(counts[3], 1, "{counts:?}");
        assert_eq!(counts[RECONCILE_BUCKETS.len()], 1, "{counts:?}");
        assert_eq!(counts.iter().sum::<u64>(), 4);
        assert_eq!(
            histogram.0.sum_nanos.load(Ordering::Relaxed),
            (30 + 50 + 51 + 7_200_000) * 1_000_000
        );
    }
}
