//! The monotonic clock as a count of nanoseconds: what the guard reads at each start and end.
//!
//! It is the clock `std::time::Instant` reads (`CLOCK_MONOTONIC` on Linux), read without
//! `Instant`'s wrapping: `Instant::now` checks and normalises the `timespec`, and the
//! difference of two is a checked `timespec` subtraction. A reconcile's start and end
//! read it once each, so that wrapping cost about 80 instructions a reconcile
//! (callgrind, `benches/check-instructions.sh`); here a difference is one subtraction.
//! Readings become `Instant`s only off the hot path, from an [`Epoch`](super::entry).
#![allow(unsafe_code)]

/// Now on the monotonic clock, in nanoseconds since an origin fixed by the system.
#[cfg(target_os = "linux")]
#[inline]
pub(crate) fn now() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// Now on the coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`: the kernel's last tick,
/// 1 to 4 ms old at most), in nanoseconds on the same scale as [`now`]. It reads a
/// value the kernel keeps instead of the CPU's counter: about 10 instructions and a
/// few nanoseconds where a precise read costs 15 instructions and 30 ns (this project's
/// VM). For times that only date reports: when a poll began, when a wake came.
#[cfg(target_os = "linux")]
#[inline]
pub(crate) fn coarse_now() -> u64 {
    read(libc::CLOCK_MONOTONIC_COARSE)
}

/// How far behind the precise clock [`coarse_now`] may be: its resolution, one kernel
/// tick (1 to 10 ms).
#[cfg(target_os = "linux")]
pub(crate) fn coarse_tick() -> std::time::Duration {
    let mut res = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_getres` writes one `timespec` through the pointer, which points to
    // a live, writable, properly aligned local; the coarse clock is supported on every
    // Linux since 2.6.32 (a failure would leave the zeroes).
    unsafe {
        libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut res);
    }
    // Non-negative, and nanoseconds below 10^9.
    std::time::Duration::new(res.tv_sec as u64, res.tv_nsec as u32)
}

/// Where there is no coarse clock, the precise one: no tick behind.
#[cfg(not(target_os = "linux"))]
pub(crate) fn coarse_tick() -> std::time::Duration {
    std::time::Duration::ZERO
}

/// One reading of `clock`, in nanoseconds.
#[cfg(target_os = "linux")]
#[inline]
fn read(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` through the pointer, which points to
    // a live, writable, properly aligned local. Both clocks read here are supported on
    // every Linux since 2.6.32, so the call cannot fail (and a failure would leave the
    // zeroes, which are still a time).
    unsafe {
        libc::clock_gettime(clock, &mut now);
    }
    // Monotonic seconds are non-negative and nanoseconds below 10^9: no sign or overflow
    // to handle for 584 years of uptime.
    (now.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(now.tv_nsec as u64)
}

/// Where there is no coarse clock, the precise one.
#[cfg(not(target_os = "linux"))]
#[inline]
pub(crate) fn coarse_now() -> u64 {
    now()
}

/// Now on the monotonic clock, in nanoseconds since the process first read it.
#[cfg(not(target_os = "linux"))]
#[inline]
pub(crate) fn now() -> u64 {
    use std::sync::LazyLock;
    use std::time::Instant;
    static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);
    u64::try_from(ORIGIN.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::now;

    #[test]
    fn it_is_the_clock_instant_reads() {
        // Bracket one reading of ours between two of `Instant`, twice, a sleep apart:
        // the differences agree within the brackets' width.
        let (a0, ours0, b0) = (Instant::now(), now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (a1, ours1, b1) = (Instant::now(), now(), Instant::now());
        let ours = Duration::from_nanos(ours1 - ours0);
        assert!(ours >= a1.duration_since(b0), "{ours:?}");
        assert!(ours <= b1.duration_since(a0), "{ours:?}");
        assert!(ours >= Duration::from_millis(20));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_coarse_tick_is_a_kernel_tick() {
        let tick = super::coarse_tick();
        assert!(tick >= Duration::from_millis(1), "{tick:?}");
        assert!(tick <= Duration::from_millis(10), "{tick:?}");
    }

    #[test]
    fn the_coarse_clock_trails_the_precise_one_by_less_than_a_tick() {
        // Bracketed by two precise reads: the coarse reading (the last tick's time) is
        // not after the second, and at most a tick (10 ms at 100 Hz) before the
        // first. Being switched out between the reads only widens the bracket.
        let (before, coarse, after) = (now(), super::coarse_now(), now());
        // (A millisecond of slack for the kernel adjusting its clock between reads.)
        assert!(coarse <= after + 1_000_000, "{before} {coarse} {after}");
        assert!(coarse + 10_000_000 >= before, "{before} {coarse} {after}");
    }
}
