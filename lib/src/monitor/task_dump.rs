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

use tokio::runtime::Handle;

use super::task_trace::{MAX_TRACE, bounded, not_dumped, reconcile_frames};
use super::verdict::{Event, HangState, fmt_duration};

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
    pub(crate) fn of(&self, event: &Event, runtime_stalled: bool) -> Option<String> {
        let Event::Hung {
            reconcile,
            state: HangState::Awaiting,
            ..
        } = event
        else {
            return None;
        };
        let handle = self.handle.as_ref()?;
        let task = match not_dumped(
            reconcile.task_id,
            runtime_stalled,
            handle.metrics().num_alive_tasks(),
            handle.runtime_flavor(),
        ) {
            Ok(task) => task,
            Err(why) => return Some(why),
        };
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
