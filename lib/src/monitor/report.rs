//! Turns the verdict's events into log events: the hang report.
//!
//! Every field of the report is a tracing field, so the `json` log format makes each a
//! key that log tools can filter on, and the `text` format prints a line a human reads
//! at a glance. The target is `reconcile_watchdog::hang` for every report.

use std::fmt::Write;
use std::time::{Instant, SystemTime};

use crate::guard::{InFlight, PollState};

use super::inspect::StuckThread;
use super::summary::{ITEM_BYTES, NAMED, clip, count_groups, name_few};
use super::verdict::driver::{Held, Wake};
use super::verdict::{Event, HangState, Pause, Summary, SummaryKind, fmt_duration};

/// The log target of every hang report.
pub const TARGET: &str = "reconcile_watchdog::hang";

/// The log target of the reports that the runtime's timers and I/O were kept going
/// (an idle worker woken for a blocked one): not hangs.
pub const RUNTIME_TARGET: &str = "reconcile_watchdog::runtime";

/// What the async runtime looked like at a stall, from its stable metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeSample {
    /// Worker threads.
    pub workers: usize,
    /// Worker threads parked (idle): none when every worker is blocked, and the watchdog
    /// then has nobody to wake to drive timers and I/O.
    pub idle_workers: usize,
    /// Tasks alive.
    pub alive_tasks: usize,
    /// Tasks waiting in the global queue.
    pub global_queue_depth: usize,
}

/// The fields shared by every per-reconcile report, rendered as strings once.
struct Fields {
    controller: String,
    object: String,
    kind: String,
    elapsed: String,
    deadline: String,
    started_at: String,
    polls: u64,
    last_poll_ago: String,
    thread: String,
    task_id: String,
    /// `METHOD path` of the oldest request in flight.
    waiting_on: Option<String>,
    sent_ago: Option<String>,
    response_head: Option<bool>,
    label: Option<&'static str>,
    /// `none` when no waker of it is alive.
    waker: Option<&'static str>,
}

impl Fields {
    fn of(r: &InFlight, now: Instant) -> Self {
        Self {
            controller: r.controller.to_string(),
            object: r.object.to_string(),
            kind: r.kind.to_string(),
            elapsed: fmt_duration(r.elapsed(now)),
            deadline: fmt_duration(r.deadline),
            started_at: rfc3339(r.started_at),
            polls: r.polls,
            last_poll_ago: r
                .last_poll_ago(now)
                .map_or_else(|| "never polled".into(), fmt_duration),
            thread: r.thread.as_ref().map_or_else(
                || "unknown".into(),
                |t| match t.tid {
                    Some(tid) => format!("{} (tid {tid})", t.name),
                    None => t.name.to_string(),
                },
            ),
            task_id: r.task_id.map_or_else(|| "none".into(), |id| id.to_string()),
            waiting_on: r
                .request
                .as_ref()
                .map(|q| format!("{} {}", q.method, q.path)),
            sent_ago: r.request.as_ref().map(|q| fmt_duration(q.sent_ago)),
            response_head: r.request.as_ref().map(|q| q.response_head),
            label: r.label,
            waker: r.no_waker.then_some("none"),
        }
    }
}

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

fn explain(r: &InFlight, state: HangState, now: Instant) -> String {
    match (state, r.poll) {
        (HangState::Awaiting, _) => r.waiting().map_or_else(
            || "waiting on an await that never woke".into(),
            |w| w.to_string(),
        ),
        (HangState::InPoll, _) => {
            "stuck inside a poll (a blocking call, a lock or a busy loop)".into()
        }
        (HangState::Starved, PollState::Woken { since }) => format!(
            "starved: woken {} ago but not polled since (its worker is blocked or the runtime stalled)",
            fmt_duration(now.saturating_duration_since(since))
        ),
        (HangState::Starved, _) => "starved: waiting while the async runtime is stalled".into(),
    }
}

/// The `kernel_state` and `stack` fields of a report about `threads`: absent when it is
/// about none, one block per thread (headed by its name) when about several.
fn thread_fields(threads: &[StuckThread]) -> (Option<String>, Option<String>) {
    if threads.is_empty() {
        return (None, None);
    }
    let headed = threads.len() > 1;
    let mut kernel = Vec::new();
    let mut stacks = Vec::new();
    for thread in threads {
        let d = &thread.diagnostics;
        let state = match &d.kernel {
            Ok(state) => state.to_string(),
            Err(error) => format!("unreadable: {error}"),
        };
        let stack = match &d.stack {
            Ok(stack) => stack.to_string(),
            Err(error) => format!("unavailable: {error}"),
        };
        if headed {
            kernel.push(format!("{} (tid {}): {state}", thread.name, d.tid));
            stacks.push(format!("thread {} (tid {}):\n{stack}", thread.name, d.tid));
        } else {
            kernel.push(state);
            stacks.push(stack);
        }
    }
    (Some(kernel.join("; ")), Some(stacks.join("\n")))
}

/// Writes one verdict event to the log. `now` is the scan's clock; `runtime` is a
/// sample of the runtime's metrics, used by the stall report; `threads` are the stuck
/// threads the event is about, inspected (by the monitor's inspector); `task_trace` is
/// the async backtrace of an awaiting hung reconcile's task (feature `task-dump`).
pub(crate) fn emit(
    event: &Event,
    now: Instant,
    runtime: Option<RuntimeSample>,
    threads: &[StuckThread],
    task_trace: Option<&str>,
) {
    let (kernel_state, stack) = thread_fields(threads);
    macro_rules! reconcile_event {
        ($level:ident, $f:expr, $state:expr, $action:expr, $($msg:tt)+) => {{
            let f = $f;
            tracing::$level!(
                target: TARGET,
                controller = %f.controller,
                object = %f.object,
                kind = %f.kind,
                elapsed = %f.elapsed,
                deadline = %f.deadline,
                started_at = %f.started_at,
                state = %$state,
                polls = f.polls,
                last_poll_ago = %f.last_poll_ago,
                thread = %f.thread,
                task_id = %f.task_id,
                waiting_on = f.waiting_on.as_deref(),
                sent_ago = f.sent_ago.as_deref(),
                response_head = f.response_head,
                label = f.label,
                waker = f.waker,
                action = %$action,
                kernel_state = kernel_state.as_deref(),
                stack = stack.as_deref().map(tracing::field::display),
                task_trace = task_trace.map(tracing::field::display),
                $($msg)+
            );
        }};
    }

    match event {
        Event::Hung {
            reconcile,
            state,
            action,
        } => {
            let f = Fields::of(reconcile, now);
            let msg = format!(
                "reconcile hung: {} {} has run {}, past its {} deadline; {}",
                f.controller,
                f.object,
                f.elapsed,
                f.deadline,
                explain(reconcile, *state, now)
            );
            reconcile_event!(error, f, state, action, "{msg}");
        }
        Event::StillHung {
            reconcile,
            state,
            deadlines,
            action,
        } => {
            let f = Fields::of(reconcile, now);
            let msg = format!(
                "reconcile still hung: {} {} has run {} ({deadlines} deadlines); {}",
                f.controller,
                f.object,
                f.elapsed,
                explain(reconcile, *state, now)
            );
            reconcile_event!(warn, f, state, action, "{msg}");
        }
        Event::Escalated {
            controller,
            object,
            reason,
            ..
        } => {
            tracing::error!(
                target: TARGET,
                controller = %controller,
                object = %object,
                action = "failing liveness (restart)",
                reason = %reason,
                kernel_state = kernel_state.as_deref(),
                stack = stack.as_deref().map(tracing::field::display),
                "reconcile hang escalated: {controller} {object}: {reason}; failing liveness"
            );
        }
        Event::Ended(ended) => {
            let r = &ended.reconcile;
            tracing::info!(
                target: TARGET,
                controller = %r.controller,
                object = %r.object,
                kind = %r.kind,
                elapsed = %fmt_duration(ended.elapsed),
                deadline = %fmt_duration(r.deadline),
                started_at = %rfc3339(r.started_at),
                outcome = %ended.outcome,
                polls = r.polls,
                "reconcile ended after hang: {} {} finished ({}) after {}",
                r.controller,
                r.object,
                ended.outcome,
                fmt_duration(ended.elapsed)
            );
        }
        Event::RuntimeStalled { age, in_poll } => {
            let culprits = name_in_poll(in_poll, now);
            let sample = runtime.unwrap_or_default();
            tracing::error!(
                target: TARGET,
                stalled_for = %fmt_duration(*age),
                in_poll = %culprits,
                workers = sample.workers,
                idle_workers = sample.idle_workers,
                alive_tasks = sample.alive_tasks,
                global_queue_depth = sample.global_queue_depth,
                kernel_state = kernel_state.as_deref(),
                stack = stack.as_deref().map(tracing::field::display),
                "async runtime stalled: no heartbeat for {}; {} of {} workers idle{}; reconciles stuck inside a poll: {}",
                fmt_duration(*age),
                sample.idle_workers,
                sample.workers,
                if sample.idle_workers == 0 {
                    " (none to take over timers and I/O)"
                } else {
                    " (woken, and the heartbeat did not come back)"
                },
                if culprits.is_empty() { "none" } else { &culprits }
            );
        }
        Event::StallVictims { count, listed, .. } => {
            tracing::error!(
                target: TARGET,
                state = %HangState::Starved,
                count = count,
                starved = %listed,
                "async runtime stalled: {count} reconciles past their deadline are its victims (woken or waiting, not polled): {listed}"
            );
        }
        Event::Summary(summary) => emit_summary(summary),
        Event::Paused(pause) => emit_pause(pause),
        Event::ApiServerSilent {
            silent_for,
            why,
            held,
            reminder,
        } => {
            let silent = fmt_duration(*silent_for);
            if *reminder {
                tracing::warn!(
                    target: TARGET,
                    silent_for = %silent,
                    reason = %why,
                    held = held,
                    action = "not restarting",
                    "the API server still does not answer ({why}, for {silent}): not restarting for the {held} overdue reconciles that await it"
                );
            } else {
                tracing::error!(
                    target: TARGET,
                    silent_for = %silent,
                    reason = %why,
                    held = held,
                    action = "not restarting",
                    "the API server does not answer ({why}, for {silent}): not restarting; {held} overdue reconciles await it, and a restart cannot help"
                );
            }
        }
        Event::ApiServerAnswers {
            silent_for,
            still_stuck,
        } => {
            tracing::info!(
                target: TARGET,
                silent_for = %fmt_duration(*silent_for),
                still_stuck = still_stuck,
                "the API server answers again after {}; {still_stuck} overdue reconciles still stuck on their old requests now fail liveness",
                fmt_duration(*silent_for)
            );
        }
        Event::RuntimeRecovered { stalled_for } => {
            tracing::info!(
                target: TARGET,
                stalled_for = %fmt_duration(*stalled_for),
                "async runtime recovered after a stall of at least {}",
                fmt_duration(*stalled_for)
            );
        }
    }
}

/// The reconciles inside a poll, longest first: the first few named with how long and
/// on which thread, the rest counted per controller (a stall's and a rescue's culprits).
fn name_in_poll(in_poll: &[InFlight], now: Instant) -> String {
    name_few(
        in_poll,
        NAMED,
        "; ",
        |r| r.last_poll_ago(now),
        |r| {
            let f = Fields::of(r, now);
            format!(
                "{} {} in a poll for {} on {}",
                f.controller, f.object, f.last_poll_ago, f.thread
            )
        },
        |r| format!("{} in-poll", r.controller),
    )
}

/// The WARN of a rescue: the monitor woke an idle worker because the reconciles in
/// `in_poll` held a worker in one poll; `held` are the rescues since the previous such
/// WARN, not reported at once.
pub(crate) fn emit_driver_rescue(wake: &Wake, in_poll: &[InFlight], now: Instant, held: &Held) {
    let culprits = name_in_poll(in_poll, now);
    let took_over = fmt_duration(wake.unattended);
    let what = format!(
        "a reconcile blocked a runtime worker in one poll; an idle worker was woken after {took_over} to take over timers and I/O: {culprits}"
    );
    let held_in_poll = name_held(held);
    let since = match (held.rescues, held_in_poll.is_empty()) {
        (0, _) => String::new(),
        (n, true) => format!(" ({n} more rescues since the previous report)"),
        (n, false) => format!(
            " ({n} more rescues since the previous report, reconciles inside a poll at them: {held_in_poll})"
        ),
    };
    let first = in_poll.iter().max_by_key(|r| r.last_poll_ago(now));
    tracing::warn!(
        target: RUNTIME_TARGET,
        controller = first.map(|r| tracing::field::display(&r.controller)),
        object = first.map(|r| tracing::field::display(&r.object)),
        in_poll = %culprits,
        timers_late_up_to = %took_over,
        idle_workers = wake.idle,
        workers = wake.workers,
        unreported = held.rescues,
        unreported_in_poll = %held_in_poll,
        action = "woke an idle worker",
        "{what}{since}"
    );
}

/// The WARN of the rescues held since the previous one when no further rescue came to
/// report them (or the monitor stops).
pub(crate) fn emit_held_rescues(held: &Held) {
    let in_poll = name_held(held);
    let first = held.named.first().map(|(c, _)| c);
    let rescues = held.rescues;
    tracing::warn!(
        target: RUNTIME_TARGET,
        controller = first.map(|c| tracing::field::display(&c.controller)),
        object = first.map(|c| tracing::field::display(&c.object)),
        unreported = rescues,
        unreported_in_poll = %in_poll,
        action = "woke an idle worker",
        "{rescues} more rescues since the previous report: idle workers were woken to take over timers and I/O from workers in one poll; reconciles inside a poll at them: {in_poll}"
    );
}

/// The held rescues' culprits: the first few named with their longest poll (and how
/// many rescues found each, when several did), the rest counted per controller.
fn name_held(held: &Held) -> String {
    let mut out = String::new();
    for (culprit, rescues) in &held.named {
        if !out.is_empty() {
            out.push_str("; ");
        }
        let name = if *rescues > 1 {
            format!(
                "{} {} in a poll for up to {}, at {rescues} rescues",
                culprit.controller,
                culprit.object,
                fmt_duration(culprit.in_poll_for)
            )
        } else {
            format!(
                "{} {} in a poll for {}",
                culprit.controller,
                culprit.object,
                fmt_duration(culprit.in_poll_for)
            )
        };
        out.push_str(&clip(name, ITEM_BYTES));
    }
    if !held.counted.is_empty() {
        let more: u64 = held.counted.iter().map(|(_, n)| n).sum();
        if !out.is_empty() {
            out.push_str("; ");
        }
        let groups = count_groups(
            held.counted
                .iter()
                .map(|(c, n)| (c, usize::try_from(*n).unwrap_or(usize::MAX))),
        );
        let _ = write!(out, "and {more} more: {groups}");
    }
    out
}

/// One summary of per-reconcile lines over the report budget, at their kind's level.
fn emit_pause(pause: &Pause) {
    let throttled = match pause.throttled {
        Some(t) if !t.is_zero() => format!("; the cgroup was CPU-throttled {}", fmt_duration(t)),
        _ => String::new(),
    };
    tracing::warn!(
        target: TARGET,
        paused = %fmt_duration(pause.length),
        throttled = pause.throttled.map(fmt_duration).unwrap_or_default(),
        "the process was not scheduled for {} (paused or CPU-throttled): no verdict for that time{throttled}",
        fmt_duration(pause.length)
    );
}

fn emit_summary(summary: &Summary) {
    const WHERE: &str = "every one is counted in the metrics and listed on /debug/reconciles";
    let Summary {
        count,
        by_group,
        named,
        unnamed,
        ..
    } = summary;
    // `oldest: a, b, c` or `oldest: a, b, c and 7 not named here`.
    let names = if *unnamed == 0 {
        named.clone()
    } else if named.is_empty() {
        format!("none named here ({unnamed})")
    } else {
        format!("{named} and {unnamed} not named here")
    };
    match summary.kind {
        SummaryKind::Hung => tracing::error!(
            target: TARGET,
            count = count,
            by_group = %by_group,
            objects = %named,
            unnamed = unnamed,
            "{count} more reconciles hung, beyond the report budget: {by_group}; oldest first: {names}; {WHERE}"
        ),
        SummaryKind::StillHung => tracing::warn!(
            target: TARGET,
            count = count,
            by_group = %by_group,
            objects = %named,
            unnamed = unnamed,
            "{count} more reminders of reconciles still hung, beyond the report budget: {by_group}; oldest first: {names}; {WHERE}"
        ),
        SummaryKind::Ended => tracing::info!(
            target: TARGET,
            count = count,
            by_group = %by_group,
            objects = %named,
            unnamed = unnamed,
            "{count} more hung reconciles ended, beyond the report budget: {by_group}; oldest first: {names}"
        ),
    }
}
