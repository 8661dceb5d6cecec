//! Whether a thread of this process is waiting for a CPU: what tells a preempted poll
//! from a blocking one.
//!
//! A thread inside a long poll blocks its worker when it runs (a busy loop) or waits in
//! the kernel (a lock, a blocking call). On a contended node it may instead be runnable
//! and wait on a run queue for a CPU: preempted, which is no fault of the reconcile.
//! `/proc/self/task/TID/stat` gives the thread's state (`R`: running or runnable, not
//! waiting in the kernel), and `schedstat` the time it ran and the time it waited on a
//! run queue, so two readings a short window apart tell running from waiting for a CPU.

use std::time::Duration;

/// The window between the two readings: a few scheduler ticks would be surer, but the
/// rescue's wake waits for it (the monitor's own time; it waits on no other thread).
pub(super) const WINDOW: Duration = Duration::from_millis(2);

/// A thread's `schedstat`: nanoseconds run, and nanoseconds runnable but waiting on a
/// run queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SchedStat {
    ran_ns: u64,
    waited_ns: u64,
}

impl SchedStat {
    /// Parses `schedstat`'s text: run time, run-queue wait, time slices.
    pub(super) fn parse(text: &str) -> Option<Self> {
        let mut fields = text.split_ascii_whitespace().map(str::parse::<u64>);
        Some(Self {
            ran_ns: fields.next()?.ok()?,
            waited_ns: fields.next()?.ok()?,
        })
    }

    /// Thread `tid`'s, now.
    #[cfg(target_os = "linux")]
    pub(super) fn read(tid: u32) -> Option<Self> {
        Self::parse(&std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?)
    }

    /// Nowhere else to read it.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn read(_tid: u32) -> Option<Self> {
        None
    }
}

/// Whether, from `before` to `after`, the thread waited on a run queue longer than it
/// ran: preempted rather than running.
pub(super) fn waited_more_than_ran(before: SchedStat, after: SchedStat) -> bool {
    let ran = after.ran_ns.saturating_sub(before.ran_ns);
    let waited = after.waited_ns.saturating_sub(before.waited_ns);
    waited > ran
}

/// The state letter of a `stat` line (`R`, `S`, `D`...): the first field after the
/// command's closing parenthesis (the command may hold spaces and parentheses itself).
pub(super) fn state_of(stat: &str) -> Option<char> {
    stat.get(stat.rfind(')')? + 1..)?
        .trim_start()
        .chars()
        .next()
}

#[cfg(target_os = "linux")]
fn state(tid: u32) -> Option<char> {
    state_of(&std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?)
}

/// Whether thread `tid` of this process is preempted now: runnable (state `R`, so in no
/// wait of the kernel) across [`WINDOW`], and waiting for a CPU more than running in
/// it. `false` when it waits in the kernel, runs, or cannot be read (then the poll
/// counts as blocking, as it did before this was known).
#[cfg(target_os = "linux")]
pub(super) fn is_preempted(tid: u32) -> bool {
    if state(tid) != Some('R') {
        return false;
    }
    let Some(before) = SchedStat::read(tid) else {
        return false;
    };
    std::thread::sleep(WINDOW);
    let Some(after) = SchedStat::read(tid) else {
        return false;
    };
    state(tid) == Some('R') && waited_more_than_ran(before, after)
}

/// Elsewhere nothing tells: the poll counts as blocking.
#[cfg(not(target_os = "linux"))]
pub(super) fn is_preempted(_tid: u32) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_and_stat_are_read_as_the_kernel_writes_them() {
        let stat = SchedStat::parse("182613883 14481666 379\n").unwrap();
        assert_eq!(
            stat,
            SchedStat {
                ran_ns: 182_613_883,
                waited_ns: 14_481_666
            }
        );
        assert_eq!(SchedStat::parse("12\n"), None);
        assert_eq!(state_of("24207 (cat) R 24202 24202"), Some('R'));
        assert_eq!(state_of("7 (a (b) c) S 1 1"), Some('S'));
        assert_eq!(state_of("garbage"), None);
    }

    #[test]
    fn waiting_on_a_run_queue_more_than_running_is_preemption() {
        let at = |ran_ns, waited_ns| SchedStat { ran_ns, waited_ns };
        assert!(waited_more_than_ran(at(100, 50), at(300, 2_000)));
        assert!(!waited_more_than_ran(at(100, 50), at(2_000, 300)));
        assert!(!waited_more_than_ran(at(100, 50), at(100, 50)), "neither");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_waiting_in_the_kernel_is_not_preempted() {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            tid_tx.send(crate::guard::kernel_tid()).unwrap();
            // Blocked in the kernel, as a reconcile on a lock is.
            let _ = stop_rx.recv();
        });
        let tid = tid_rx.recv().unwrap().expect("a kernel thread id");
        // Its state is `S` once it waits (it may still be on its way to the wait).
        let start = std::time::Instant::now();
        while state(tid) != Some('S') {
            assert!(start.elapsed() < Duration::from_secs(30), "never waited");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!is_preempted(tid));
        stop_tx.send(()).unwrap();
        sleeper.join().unwrap();
    }
}
