//! The async backtrace of an awaiting hung reconcile's task, from a tokio task dump
//! (feature `task-dump`, built with `--cfg tokio_unstable`; Linux).
//!
//! Once per awaiting hang, the monitor asks the watched runtime for a dump on a thread
//! of its own and waits a bounded time for it: a dump pauses every worker and polls
//! every task in a tracing mode, so it waits for busy workers, and a wedged runtime
//! never answers. A stalled runtime is not asked at all. The trace of the reconcile's
//! task is cut to its outermost frames (2 KiB at most), the rest counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::runtime::{Handle, RuntimeFlavor};

use super::verdict::{Event, HangState, fmt_duration};

/// The longest trace a report carries.
pub(crate) const MAX_TRACE: usize = 2048;

/// The most tasks alive at which the runtime is asked for a dump. A dump pauses every
/// worker while one traces every task, and its time grew much faster than the task
/// count here: the demo's runtime (about 70 tasks) was dumped within the monitor's wait,
/// while 1,000 tasks kept a worker tracing for more than 40 seconds
/// (`docs/performance.md`).
pub(crate) const MAX_TASKS: usize = 100;

/// How long the monitor waits for a dump before it reports without one.
pub(crate) const DUMP_TIMEOUT: Duration = Duration::from_secs(1);

/// Asks the watched runtime for task traces.
#[derive(Debug)]
pub(crate) struct TaskTraces {
    handle: Option<Handle>,
    /// Set while a dump thread waits for the runtime: one at a time, so that a wedged
    /// runtime holds one thread, not one per hang.
    dumping: Arc<AtomicBool>,
}

impl TaskTraces {
    pub(crate) fn new(handle: Option<Handle>) -> Self {
        Self {
            handle,
            dumping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The `task_trace` of `event`'s report: for a new awaiting hang of a task of the
    /// watched runtime, its trace or why there is none; `None` for other events.
    /// `worker_blocked` tells, when asked, whether a worker is held in one poll now: a
    /// dump then is not started, as it would make every healthy worker wait for that
    /// poll at each of its maintenance points (tokio's trace barrier) for as long as it
    /// lasts.
    pub(crate) fn of(
        &self,
        event: &Event,
        runtime_stalled: bool,
        worker_blocked: impl FnOnce() -> bool,
    ) -> Option<String> {
        let Event::Hung {
            reconcile,
            state: HangState::Awaiting,
            ..
        } = event
        else {
            return None;
        };
        let handle = self.handle.as_ref()?;
        let Some(task) = reconcile.task_id else {
            return Some("none: it is not polled inside a tokio task".into());
        };
        if runtime_stalled {
            return Some(
                "skipped: the runtime is stalled, and a dump waits for every worker".into(),
            );
        }
        if worker_blocked() {
            return Some(
                "skipped: a worker is held in one poll, and a dump would make the others wait for it".into(),
            );
        }
        let alive = handle.metrics().num_alive_tasks();
        if alive > MAX_TASKS {
            return Some(format!(
                "skipped: {alive} tasks alive, more than {MAX_TASKS}; a dump would pause the runtime's workers for seconds"
            ));
        }
        if handle.runtime_flavor() != RuntimeFlavor::MultiThread {
            // A current-thread runtime is dumped only from inside itself.
            return Some("skipped: only a multi-thread runtime is dumped from outside".into());
        }
        if self.dumping.swap(true, Ordering::AcqRel) {
            return Some("skipped: an earlier dump still waits for the runtime's workers".into());
        }
        let (sent, received) = mpsc::channel();
        let (handle, dumping) = (handle.clone(), Arc::clone(&self.dumping));
        let spawned = std::thread::Builder::new()
            .name("task-dump".into())
            .spawn(move || {
                let began = Instant::now();
                // The dump's own future waits on a thread tokio starts for it, and
                // needs no runtime of ours.
                let dump = crate::block_on::block_on(handle.dump());
                dumping.store(false, Ordering::Release);
                let _ = sent.send((dump, began.elapsed()));
            });
        if let Err(error) = spawned {
            self.dumping.store(false, Ordering::Release);
            return Some(format!("skipped: no thread for the dump: {error}"));
        }
        match received.recv_timeout(DUMP_TIMEOUT) {
            Ok((dump, _took)) => Some(
                dump.tasks()
                    .iter()
                    .find(|t| crate::guard::task_id_number(t.id()) == task)
                    .map_or_else(
                        || format!("none: task {task} is not in the dump"),
                        |t| bounded(&reconcile_frames(&t.trace().to_string()), MAX_TRACE),
                    ),
            ),
            Err(_) => Some(format!(
                "skipped: the runtime's workers did not pause for a dump within {}",
                fmt_duration(DUMP_TIMEOUT)
            )),
        }
    }
}

/// The frames of `trace` inside the guard's poll, which are the reconcile's own (the
/// guard's, above them, are the same in every report), moved left to start a line.
fn reconcile_frames(trace: &str) -> String {
    let lines: Vec<&str> = trace.lines().collect();
    let Some(guard) = lines
        .iter()
        .rposition(|l| l.contains("reconcile_watchdog::guard::guarded::Guarded<F>"))
        .filter(|at| at + 1 < lines.len())
    else {
        return trace.to_owned();
    };
    let inner = &lines[guard + 1..];
    let indent = inner[0].len() - inner[0].trim_start().len();
    inner
        .iter()
        .map(|l| match l.get(..indent) {
            Some(head) if head.trim().is_empty() => &l[indent..],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first lines of `trace` that fit in `max` bytes, and a count of the rest.
fn bounded(trace: &str, max: usize) -> String {
    let lines: Vec<&str> = trace.lines().collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        // Room for the count line, should it come.
        if out.len() + line.len() + 1 > max.saturating_sub(40) {
            out.push_str(&format!("... and {} more frames", lines.len() - i));
            return out;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.truncate(out.trim_end().len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_trace_keeps_its_outermost_frames_and_counts_the_rest() {
        let trace: String = (0..200)
            .map(|i| {
                format!(
                    "{:indent$}└╼ frame_{i}::{{{{closure}}}} at src/x.rs:{i}:1\n",
                    "",
                    indent = i % 8
                )
            })
            .collect();
        let cut = bounded(&trace, MAX_TRACE);
        assert!(cut.len() <= MAX_TRACE, "{}", cut.len());
        assert!(cut.starts_with("└╼ frame_0::"), "{cut}");
        let shown = cut.lines().count() - 1;
        assert!(
            cut.ends_with(&format!("... and {} more frames", 200 - shown)),
            "{cut}"
        );
        assert_eq!(bounded("a\nb", MAX_TRACE), "a\nb");
    }

    #[test]
    fn the_guard_s_own_frames_are_left_out() {
        let trace = "╼ <reconcile_watchdog::guard::guarded::Guarded<F> as Future> at a.rs:1:1\n  └╼ std::panicking::catch_unwind at b.rs:2:2\n     └╼ <reconcile_watchdog::guard::guarded::Guarded<F> as Future>::poll at a.rs:3:3\n        └╼ demo::inject_hang at c.rs:4:4\n           └╼ demo::await_forever at c.rs:5:5";
        assert_eq!(
            reconcile_frames(trace),
            "└╼ demo::inject_hang at c.rs:4:4\n   └╼ demo::await_forever at c.rs:5:5"
        );
        assert_eq!(
            reconcile_frames("╼ other at x.rs:1:1"),
            "╼ other at x.rs:1:1"
        );
    }

    #[test]
    fn the_hung_task_trace_names_the_function_awaiting() {
        #[inline(never)]
        async fn waits_for_the_issuer(rx: tokio::sync::oneshot::Receiver<()>) {
            let _ = rx.await;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let registry = crate::guard::Registry::new(Duration::ZERO);
        let (_tx, rx) = tokio::sync::oneshot::channel();
        let task = runtime.spawn(registry.controller("c", "K").guard(
            crate::guard::ObjectKey::cluster("a"),
            async move {
                waits_for_the_issuer(rx).await;
                Ok::<(), ()>(())
            },
        ));
        let reconcile = loop {
            if let Some(r) = registry.snapshot().pop().filter(|r| r.polls > 0) {
                break r;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let traces = TaskTraces::new(Some(runtime.handle().clone()));
        let event = Event::Hung {
            reconcile,
            state: HangState::Awaiting,
            action: super::super::verdict::Action::ReportOnly,
        };
        let trace = traces.of(&event, false, || false).unwrap();
        assert!(trace.contains("waits_for_the_issuer"), "{trace}");
        assert_eq!(
            traces.of(&event, true, || false).as_deref(),
            Some("skipped: the runtime is stalled, and a dump waits for every worker")
        );
        assert_eq!(
            traces.of(&event, false, || true).as_deref(),
            Some(
                "skipped: a worker is held in one poll, and a dump would make the others wait for it"
            )
        );
        task.abort();
    }
}
