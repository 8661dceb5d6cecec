//! The suggestion rule: from observed durations to a deadline a person would write.
//!
//! The larger of 3 × p99.9 and 1.5 × the longest reconcile seen, never below
//! [`FLOOR`], rounded up to the next value of a readable ladder (…, 8s, 10s, 12s, 15s,
//! 20s, …). Below [`MIN_RECONCILES`] observations it declines to guess. A pure
//! function of its input, so it is tested on synthetic distributions.

use std::time::Duration;

use super::sketch::Summary;

/// Reconciles a controller must have ended before a deadline is suggested for it.
/// With fewer, p99.9 is only the maximum, and one slow reconcile more would change it.
pub(crate) const MIN_RECONCILES: u64 = 100;

/// No suggestion is shorter: below a second, a scheduling hiccup or a slow API
/// answer would fail a healthy reconcile, and the watchdog scans once a second.
pub(crate) const FLOOR: Duration = Duration::from_secs(1);

/// How many times p99.9 the suggestion leaves as headroom.
const P999_FACTOR: u32 = 3;
/// How many times the longest reconcile seen (as halves: 3/2).
const MAX_FACTOR_HALVES: u32 = 3;

/// What the advisor says about one controller's deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Suggestion {
    /// Too few reconciles ended to suggest anything.
    TooFew {
        /// How many ended.
        observed: u64,
    },
    /// A deadline, and why.
    Deadline {
        /// The suggested deadline, a readable value.
        deadline: Duration,
        /// How it was reached, in words.
        reasoning: String,
    },
}

/// The deadline suggested for durations `observed`, given the `current` deadline.
#[must_use]
pub(crate) fn suggest(observed: &Summary, current: Duration) -> Suggestion {
    let count = observed.count();
    let Some(p999) = observed.quantile(0.999).filter(|_| count >= MIN_RECONCILES) else {
        return Suggestion::TooFew { observed: count };
    };
    let max = observed.max();
    let from_p999 = p999.saturating_mul(P999_FACTOR);
    let from_max = max.saturating_mul(MAX_FACTOR_HALVES) / 2;
    let (raw, why) = if from_p999 >= from_max {
        (
            from_p999,
            format!("3 x p99.9 ({}) = {}", show(p999), show(from_p999)),
        )
    } else {
        (
            from_max,
            format!("1.5 x max ({}) = {}", show(max), show(from_max)),
        )
    };
    let floored = raw.max(FLOOR);
    let deadline = readable(floored);
    let mut reasoning = format!("{why} is the larger of 3 x p99.9 and 1.5 x max");
    if floored > raw {
        reasoning.push_str(&format!("; raised to the {} floor", show(FLOOR)));
    }
    if deadline > floored {
        reasoning.push_str(&format!("; rounded up to {}", show(deadline)));
    }
    reasoning.push_str(&format!(
        "; from {count} reconciles; the current deadline is {}",
        show(current)
    ));
    let comparison = match deadline.cmp(&current) {
        std::cmp::Ordering::Less => "longer than needed: a hang is found sooner with this one",
        std::cmp::Ordering::Equal => "already right",
        std::cmp::Ordering::Greater => "too tight: healthy reconciles come close to it",
    };
    reasoning.push_str(&format!(" ({comparison})"));
    Suggestion::Deadline {
        deadline,
        reasoning,
    }
}

/// The readable deadlines, in milliseconds; past the last, whole hours.
const LADDER_MS: [u64; 39] = [
    1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 8_000, 10_000, 12_000, 15_000, 20_000, 25_000,
    30_000, 40_000, 45_000, 60_000, 90_000, 120_000, 180_000, 240_000, 300_000, 360_000, 480_000,
    600_000, 720_000, 900_000, 1_200_000, 1_500_000, 1_800_000, 2_400_000, 2_700_000, 3_600_000,
    5_400_000, 7_200_000, 10_800_000, 14_400_000, 21_600_000, 28_800_000, 43_200_000,
];

/// The smallest readable value at or above `d` (at least one second).
#[must_use]
pub(crate) fn readable(d: Duration) -> Duration {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    // A fraction of a millisecond rounds up too.
    let ms = if Duration::from_millis(ms) < d {
        ms.saturating_add(1)
    } else {
        ms
    };
    match LADDER_MS.iter().find(|&&step| step >= ms) {
        Some(&step) => Duration::from_millis(step),
        None => Duration::from_secs(ms.div_ceil(3_600_000).saturating_mul(3_600)),
    }
}

/// `d` as a flag value: whole hours `2h`, whole minutes `5m`, whole seconds `45s`,
/// otherwise milliseconds (`90s` and `1500ms` rather than `1m 30s` and `1s 500ms`,
/// which need quoting on a command line).
#[must_use]
pub(crate) fn flag_value(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 || !ms.is_multiple_of(1_000) {
        return format!("{ms}ms");
    }
    let s = ms / 1_000;
    if s.is_multiple_of(3_600) {
        format!("{}h", s / 3_600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// `d` for a person, to the millisecond (`1s 250ms`, `4m 3s`), or to the microsecond
/// below a millisecond.
#[must_use]
pub(crate) fn show(d: Duration) -> String {
    let rounded = if d < Duration::from_millis(1) {
        Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    } else {
        Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    };
    humantime::format_duration(rounded).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn deadline(s: &Suggestion) -> Duration {
        match s {
            Suggestion::Deadline { deadline, .. } => *deadline,
            Suggestion::TooFew { observed } => panic!("too few: {observed}"),
        }
    }

    /// A deterministic pseudo-random stream (a 64-bit LCG), uniform in [0, 1).
    fn uniform(seed: u64) -> impl Iterator<Item = f64> {
        let mut state = seed;
        std::iter::repeat_with(move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            #[allow(clippy::cast_precision_loss)]
            let top = (state >> 11) as f64;
            top / (1_u64 << 53) as f64
        })
    }

    #[test]
    fn too_few_observations_give_no_deadline() {
        let few = Summary::of((0..MIN_RECONCILES - 1).map(|_| ms(200)));
        assert_eq!(
            suggest(&few, ms(3_000)),
            Suggestion::TooFew {
                observed: MIN_RECONCILES - 1
            }
        );
        assert_eq!(
            suggest(&Summary::of([]), ms(3_000)),
            Suggestion::TooFew { observed: 0 }
        );
    }

    #[test]
    fn a_tight_uniform_distribution_is_ruled_by_p999() {
        // 10,000 reconciles uniform in [2 s, 4 s]: p99.9 is about 4 s, so 3 x p99.9
        // (about 12 s) beats 1.5 x max (6 s), and 12 s is on the ladder (within the
        // sketch's 1/16, the bucket's bound may read just above: then 15 s).
        let observed = Summary::of(
            uniform(7)
                .take(10_000)
                .map(|u| Duration::from_secs_f64(2.0 + 2.0 * u)),
        );
        let s = suggest(&observed, ms(5_000));
        assert!([ms(12_000), ms(15_000)].contains(&deadline(&s)), "{s:?}");
        let Suggestion::Deadline { reasoning, .. } = s else {
            unreachable!()
        };
        assert!(reasoning.starts_with("3 x p99.9 ("), "{reasoning}");
        assert!(reasoning.contains("from 10000 reconciles"), "{reasoning}");
        assert!(reasoning.contains("too tight"), "{reasoning}");
    }

    #[test]
    fn one_outlier_rules_through_the_maximum() {
        // 2,000 reconciles of 100 ms and one of 20 s: p99.9 is 100 ms (300 ms), the
        // maximum rules: 1.5 x 20 s = 30 s, on the ladder.
        let observed =
            Summary::of(std::iter::repeat_n(ms(100), 2_000).chain(std::iter::once(ms(20_000))));
        let s = suggest(&observed, ms(300_000));
        assert_eq!(deadline(&s), ms(30_000), "{s:?}");
        let Suggestion::Deadline { reasoning, .. } = s else {
            unreachable!()
        };
        assert!(
            reasoning.starts_with("1.5 x max (20s) = 30s"),
            "{reasoning}"
        );
        assert!(reasoning.contains("longer than needed"), "{reasoning}");
        assert!(!reasoning.contains("rounded up"), "{reasoning}");
    }

    #[test]
    fn a_heavy_tail_of_rare_slow_reconciles_moves_p999() {
        // Exponential durations with a mean of 1 s: p99.9 is about 6.9 s, so 3 x p99.9
        // is about 20.7 s against 1.5 x max, and the answer lands at 25 s or above,
        // the next readable values.
        let observed = Summary::of(
            uniform(42)
                .take(20_000)
                .map(|u| Duration::from_secs_f64(-(1.0 - u).ln())),
        );
        let got = deadline(&suggest(&observed, ms(300_000)));
        assert!(got >= ms(20_000) && got <= ms(40_000), "{got:?}");
    }

    #[test]
    fn fast_reconciles_get_the_floor() {
        let observed = Summary::of((0..1_000).map(|i| ms(5 + i % 45)));
        let s = suggest(&observed, ms(3_000));
        assert_eq!(deadline(&s), FLOOR, "{s:?}");
        let Suggestion::Deadline { reasoning, .. } = s else {
            unreachable!()
        };
        assert!(reasoning.contains("raised to the 1s floor"), "{reasoning}");
    }

    #[test]
    fn readable_values_round_up_along_the_ladder() {
        for (input, want) in [
            (ms(1), ms(1_000)),
            (ms(1_000), ms(1_000)),
            (ms(1_001), ms(2_000)),
            (ms(7_000), ms(8_000)),
            (ms(40_500), ms(45_000)),
            (ms(61_000), ms(90_000)),
            (ms(43_200_001), Duration::from_secs(13 * 3_600)),
        ] {
            assert_eq!(readable(input), want, "{input:?}");
        }
        assert!(readable(Duration::MAX) >= Duration::from_secs(u64::MAX / 1_000));
        assert!(LADDER_MS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn flag_values_parse_back_to_themselves() {
        for step in LADDER_MS {
            let d = ms(step);
            let value = flag_value(d);
            assert!(!value.contains(' '), "{value}");
            assert_eq!(humantime::parse_duration(&value).unwrap(), d, "{value}");
        }
        assert_eq!(flag_value(ms(45_000)), "45s");
        assert_eq!(flag_value(ms(90_000)), "90s");
        assert_eq!(flag_value(ms(300_000)), "5m");
        assert_eq!(flag_value(ms(5_400_000)), "90m");
        assert_eq!(flag_value(ms(7_200_000)), "2h");
        assert_eq!(flag_value(ms(1_500)), "1500ms");
    }
}
