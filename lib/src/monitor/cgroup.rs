//! Reads how long cgroup v2 has CPU-throttled this process's cgroup (`cpu.stat`).
//!
//! A throttled process does not run, so its reconciles and heartbeats look stuck when
//! nothing is: the monitor reads this to tell a pause from a stall, and the metrics show
//! it because it explains slow reconciles.

use std::path::PathBuf;
use std::time::Duration;

/// Errors of finding or reading the cgroup's `cpu.stat`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// `/proc/self/cgroup` or the `cpu.stat` file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The process is not in a cgroup v2 hierarchy (no `0::` line).
    #[error("not in a cgroup v2 hierarchy")]
    NotV2,
    /// `cpu.stat` has no `throttled_usec` (the cpu controller is not enabled there).
    #[error("cpu.stat has no throttled_usec")]
    NoThrottling,
}

/// This process's cgroup v2 `cpu.stat`.
#[derive(Clone, Debug)]
pub(crate) struct CpuStat {
    path: PathBuf,
}

impl CpuStat {
    /// Finds this process's cgroup from `/proc/self/cgroup` under the usual mount
    /// point, and checks that its `cpu.stat` tells throttled time.
    pub(crate) fn find() -> Result<Self, Error> {
        let proc = PathBuf::from("/proc/self/cgroup");
        let text =
            std::fs::read_to_string(&proc).map_err(|source| Error::Read { path: proc, source })?;
        let relative = text
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .ok_or(Error::NotV2)?;
        let stat = Self {
            path: PathBuf::from("/sys/fs/cgroup")
                .join(relative.trim_start_matches('/'))
                .join("cpu.stat"),
        };
        stat.throttled()?;
        Ok(stat)
    }

    /// The time the cgroup has been throttled in all.
    pub(crate) fn throttled(&self) -> Result<Duration, Error> {
        let text = std::fs::read_to_string(&self.path).map_err(|source| Error::Read {
            path: self.path.clone(),
            source,
        })?;
        parse_throttled(&text).ok_or(Error::NoThrottling)
    }
}

/// `throttled_usec` of a `cpu.stat` text.
fn parse_throttled(text: &str) -> Option<Duration> {
    text.lines()
        .find_map(|line| line.strip_prefix("throttled_usec "))
        .and_then(|n| n.trim().parse().ok())
        .map(Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttled_time_is_read_from_cpu_stat() {
        let text = "usage_usec 1000\nuser_usec 800\nsystem_usec 200\nnr_periods 12\nnr_throttled 3\nthrottled_usec 8240000\n";
        assert_eq!(parse_throttled(text), Some(Duration::from_millis(8240)));
        assert_eq!(parse_throttled("usage_usec 1000\n"), None);
    }
}
