//! The series read at scrape time rather than fed: the health checks, the API server's
//! reachability, CPU throttling, the lease's age, the watches' ages and the hang
//! reports' drops.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::series::{MAX_CONTROLLER_SERIES, OTHER};
use crate::health::Health;
use crate::monitor::ApiServerStatus;

/// Reads the age of the leader's last lease renewal; None when not leading.
pub(super) type LeaseAge = Box<dyn Fn() -> Option<Duration> + Send + Sync>;

/// `reconcile_watchdog_lease_renewal_age_seconds`, read at scrape time so that it keeps
/// growing while a renewal hangs.
#[derive(Clone, Default)]
pub(super) struct LeaseAgeCollector(pub(super) Arc<OnceLock<LeaseAge>>);

impl std::fmt::Debug for LeaseAgeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseAgeCollector")
            .field("watched", &self.0.get().is_some())
            .finish()
    }
}

impl Collector for LeaseAgeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(age) = self.0.get().and_then(|age| age()) else {
            return Ok(());
        };
        let metric = encoder.encode_descriptor(
            "lease_renewal_age",
            "Age of the leader's last successful lease renewal; absent when not leading",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        ConstGauge::new(age.as_secs_f64()).encode(metric)
    }
}

/// `reconcile_watchdog_watch_age_seconds{controller,resource}`, read at scrape time from
/// the watches: one series per controller of a watched resource, for the first
/// [`MAX_CONTROLLER_SERIES`] controllers named; the others' watches of a resource are
/// one series labelled [`OTHER`] (a resource has one watch, so one age).
#[derive(Clone, Debug, Default)]
pub(super) struct WatchAges(pub(super) Arc<OnceLock<Arc<dyn crate::plug::WatchAges>>>);

impl Collector for WatchAges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(watches) = self.0.get() else {
            return Ok(());
        };
        let ages = watches.ages(std::time::Instant::now());
        if ages.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            "watch_age",
            "Time since a watched resource last showed a sign of life (an event, a bookmark, a list), by controller and resource",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        let mut named: Vec<&str> = Vec::new();
        for watch in &ages {
            let mut other = false;
            for controller in &watch.controllers {
                let own = controller != OTHER
                    && (named.contains(&controller.as_str())
                        || named.len() < MAX_CONTROLLER_SERIES);
                if !own {
                    other = true;
                    continue;
                }
                if !named.contains(&controller.as_str()) {
                    named.push(controller);
                }
                let labels = [
                    ("controller", controller.as_str()),
                    ("resource", watch.resource.as_str()),
                ];
                ConstGauge::new(watch.age.as_secs_f64()).encode(family.encode_family(&labels)?)?;
            }
            // One age per watched resource: the others' watch of it is the same watch.
            if other {
                let labels = [("controller", OTHER), ("resource", watch.resource.as_str())];
                ConstGauge::new(watch.age.as_secs_f64()).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// `reconcile_watchdog_events_dropped_total`, read at scrape time from what the hang
/// reports are plugged into; absent when nothing is.
#[derive(Clone, Debug, Default)]
pub(super) struct EventsDropped(pub(super) Arc<OnceLock<Arc<dyn crate::plug::HangReports>>>);

impl Collector for EventsDropped {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(reports) = self.0.get() else {
            return Ok(());
        };
        let metric = ConstCounter::new(reports.dropped());
        let family = encoder.encode_descriptor(
            "events_dropped",
            "Hang reports not published as Events (their queue was full, or the API server did not take them in time)",
            None,
            metric.metric_type(),
        )?;
        metric.encode(family)
    }
}

/// `reconcile_watchdog_health_check_passing{probe, check}`: runs every check of both
/// sets at scrape time.
#[derive(Debug)]
pub(super) struct HealthChecks(pub(super) Arc<Health>);

impl Collector for HealthChecks {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "health_check_passing",
            "Whether a health check passes now (1) or fails (0), by probe (healthz, readyz) and check.",
            None,
            MetricType::Gauge,
        )?;
        for checks in [&self.0.liveness, &self.0.readiness] {
            for check in checks.run(&[]).checks {
                let labels = [("probe", checks.endpoint()), ("check", check.name.as_str())];
                ConstGauge::new(i64::from(check.result.is_ok()))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// `reconcile_watchdog_api_server_reachable` (1/0) and
/// `reconcile_watchdog_api_server_unreachable_seconds_total`, read at scrape time from
/// the API server check; absent until it has run.
#[derive(Debug)]
pub(super) struct ApiServerReachability(pub(super) Arc<ApiServerStatus>);

impl Collector for ApiServerReachability {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(reachable) = self.0.reachable() else {
            return Ok(());
        };
        let gauge = encoder.encode_descriptor(
            "api_server_reachable",
            "Whether the API server gave any HTTP answer at the latest reachability check (1) or none (0)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(reachable)).encode(gauge)?;
        let counter = encoder.encode_descriptor(
            "api_server_unreachable_seconds",
            "Time the API server has not answered the reachability check, in all",
            None,
            MetricType::Counter,
        )?;
        prometheus_client::metrics::counter::ConstCounter::new(
            self.0
                .unreachable_for(std::time::Instant::now())
                .as_secs_f64(),
        )
        .encode(counter)?;
        Ok(())
    }
}

/// `reconcile_watchdog_cpu_throttled_seconds_total`: the time cgroup v2 has throttled
/// this process's cgroup, read at scrape time; absent without cgroup v2's cpu controller.
#[derive(Debug)]
pub(super) struct CpuThrottled(pub(super) Option<crate::monitor::cgroup::CpuStat>);

impl Collector for CpuThrottled {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(throttled) = self.0.as_ref().and_then(|c| c.throttled().ok()) else {
            return Ok(());
        };
        let metric = ConstCounter::new(throttled.as_secs_f64());
        let family = encoder.encode_descriptor(
            "cpu_throttled_seconds",
            "Time cgroup v2 has CPU-throttled this process's cgroup (cpu.stat throttled_usec): it explains slow reconciles",
            None,
            metric.metric_type(),
        )?;
        metric.encode(family)
    }
}
