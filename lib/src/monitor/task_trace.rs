//! The text of a task trace in a hang report, apart from taking the dump (which needs
//! the `task-dump` feature and `--cfg tokio_unstable`), so that every build tests it:
//! when no dump is taken and why, the reconcile's own frames, and the bound.
// Used only where task dumps are built.
#![cfg_attr(
    not(all(feature = "task-dump", tokio_unstable, target_os = "linux")),
    allow(dead_code)
)]

use tokio::runtime::RuntimeFlavor;

/// The longest trace a report carries.
pub(crate) const MAX_TRACE: usize = 2048;

/// The most tasks alive at which the runtime is asked for a dump. A dump pauses every
/// worker while one traces every task, and its time grew much faster than the task
/// count here: the demo's runtime (about 70 tasks) was dumped within the monitor's wait,
/// while 1,000 tasks kept a worker tracing for more than 40 seconds
/// (`docs/performance.md`).
pub(crate) const MAX_TASKS: usize = 100;

/// The task of the hung reconcile to dump, or why the runtime is not asked: `task` is its
/// tokio task id, `alive` the runtime's tasks alive now.
pub(crate) fn not_dumped(
    task: Option<u64>,
    runtime_stalled: bool,
    alive: usize,
    flavor: RuntimeFlavor,
) -> Result<u64, String> {
    let Some(task) = task else {
        return Err("none: it is not polled inside a tokio task".into());
    };
    if runtime_stalled {
        return Err("skipped: the runtime is stalled, and a dump waits for every worker".into());
    }
    if alive > MAX_TASKS {
        return Err(format!(
            "skipped: {alive} tasks alive, more than {MAX_TASKS}; a dump would pause the runtime's workers for seconds"
        ));
    }
    if flavor != RuntimeFlavor::MultiThread {
        // A current-thread runtime is dumped only from inside itself.
        return Err("skipped: only a multi-thread runtime is dumped from outside".into());
    }
    Ok(task)
}

/// The frames of `trace` inside the guard's poll, which are the reconcile's own (the
/// guard's, above them, are the same in every report), moved left to start a line.
pub(crate) fn reconcile_frames(trace: &str) -> String {
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
pub(crate) fn bounded(trace: &str, max: usize) -> String {
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
    fn no_dump_without_a_task_of_a_healthy_multi_thread_runtime() {
        assert_eq!(
            not_dumped(Some(7), false, 3, RuntimeFlavor::MultiThread),
            Ok(7)
        );
        assert_eq!(
            not_dumped(None, false, 3, RuntimeFlavor::MultiThread).unwrap_err(),
            "none: it is not polled inside a tokio task"
        );
        assert_eq!(
            not_dumped(Some(7), true, 3, RuntimeFlavor::MultiThread).unwrap_err(),
            "skipped: the runtime is stalled, and a dump waits for every worker"
        );
        assert!(
            not_dumped(Some(7), false, MAX_TASKS + 1, RuntimeFlavor::MultiThread)
                .unwrap_err()
                .starts_with("skipped: 101 tasks alive, more than 100;")
        );
        assert_eq!(
            not_dumped(Some(7), false, 3, RuntimeFlavor::CurrentThread).unwrap_err(),
            "skipped: only a multi-thread runtime is dumped from outside"
        );
    }
}
