//! Why liveness fails, kept for the restart: the container's termination message and,
//! through the kube integration, the `LivenessFailing` Event on the operator's Pod.
//!
//! While liveness fails because of hung reconciles, an escalation or a runtime stall,
//! each scan keeps a [`Cause`]: the longest-running culprits (controller, object, how
//! long against the deadline, where each is stuck), a count of the rest, and the
//! failing checks' reasons. When the process exits with one (a [`Watchdog`] dropped:
//! after SIGTERM, SIGINT or its own end), it is written to the termination message
//! path, which Kubernetes reads into the container's `lastState.terminated.message`,
//! in one write of at most 4096 bytes. After a clean shutdown nothing is written.
//!
//! [`Watchdog`]: crate::Watchdog

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::guard::{InFlight, PollState};
use crate::monitor::HangState;
use crate::monitor::summary::clip;
use crate::monitor::verdict::{Decision, fmt_duration};
use crate::stack::Stack;

/// Kubernetes keeps at most this many bytes of a termination message.
pub const MESSAGE_BYTES: usize = 4096;

/// Where Kubernetes reads the termination message by default (the flag's default).
#[cfg(feature = "clap")]
pub(crate) const KUBERNETES_PATH: &str = "/dev/termination-log";

/// How many culprits a cause keeps by name; the rest are counted. With long names fewer
/// fit in [`MESSAGE_BYTES`]: the message names those that fit and counts the others.
const CULPRITS: usize = 32;

/// The most bytes of one culprit's line: an object's name and a function's may be long.
const LINE_BYTES: usize = 640;

/// How long the process waits, as it exits, for the termination message to be written:
/// a file system that does not answer must not hold up the exit.
pub(crate) const WRITE_PATIENCE: Duration = Duration::from_secs(1);

/// The first words of every message, by which a restarted process knows what its
/// predecessor left (and an engineer knows who wrote it).
pub(crate) const MESSAGE_START: &str = "reconcile-watchdog: liveness failed";

/// Why liveness fails, as the latest scan found it (see the [module](self)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// The longest-running culprits first.
    culprits: Vec<Culprit>,
    /// Culprits not kept by name.
    more: usize,
    /// The `reconcilers` check's reason, when it fails.
    reconcilers: Option<String>,
    /// The `runtime` check's reason, when it fails.
    runtime: Option<String>,
}

/// One reconcile that fails liveness.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Culprit {
    controller: Arc<str>,
    object: String,
    elapsed: Duration,
    deadline: Duration,
    state: HangState,
    /// Where it is stuck: the innermost frame of the operator's own code (in a poll), or
    /// what it waits on (awaiting), when known.
    place: Option<String>,
}

impl Cause {
    /// The cause of `decision`'s liveness failure, if it fails liveness: its failing
    /// overdue reconciles (and, while the runtime stalls, those inside a poll in
    /// `attention`), the longest-running first, each with the place `place_of` knows.
    pub(crate) fn of(
        decision: &Decision<'_>,
        attention: &[InFlight],
        now: Instant,
        place_of: impl Fn(&InFlight) -> Option<String>,
    ) -> Option<Self> {
        if decision.reconcilers_failure.is_none() && decision.runtime_failure.is_none() {
            return None;
        }
        let mut candidates: Vec<(&InFlight, Duration, HangState)> = decision
            .overdue
            .iter()
            .filter(|o| o.fails_liveness)
            .map(|o| (o.reconcile, o.elapsed, o.state))
            .collect();
        if decision.runtime_failure.is_some() {
            for r in attention {
                if matches!(r.poll, PollState::InPoll { .. })
                    && !candidates.iter().any(|(c, ..)| c.id == r.id)
                {
                    candidates.push((r, r.elapsed(now), HangState::InPoll));
                }
            }
        }
        let kept = CULPRITS.min(candidates.len());
        let longest_first = |a: &(&InFlight, Duration, HangState),
                             b: &(&InFlight, Duration, HangState)| {
            b.1.cmp(&a.1)
        };
        if kept > 0 && kept < candidates.len() {
            candidates.select_nth_unstable_by(kept - 1, longest_first);
        }
        let more = candidates.len() - kept;
        candidates.truncate(kept);
        candidates.sort_unstable_by(longest_first);
        let culprits = candidates
            .into_iter()
            .map(|(r, elapsed, state)| Culprit {
                controller: Arc::clone(&r.controller),
                object: r.object.to_string(),
                elapsed,
                deadline: r.deadline,
                state,
                place: place_of(r).or_else(|| r.waiting().map(|w| w.to_string())),
            })
            .collect();
        Some(Self {
            culprits,
            more,
            reconcilers: decision.reconcilers_failure.clone(),
            runtime: decision.runtime_failure.clone(),
        })
    }

    /// The cause in at most `max_bytes` bytes: a first line naming the failing checks,
    /// one line per culprit (the longest-running first) while they fit, `and N more`,
    /// then the runtime's reason. A culprit that does not fit is counted, never cut.
    #[must_use]
    pub fn text(&self, max_bytes: usize) -> String {
        let mut checks = Vec::new();
        if self.reconcilers.is_some() {
            checks.push("reconcilers");
        }
        if self.runtime.is_some() {
            checks.push("runtime");
        }
        let total = self.culprits.len() + self.more;
        let mut head = format!("{MESSAGE_START} ({})", checks.join(", "));
        if total > 0 {
            let _ = write!(
                head,
                "; {total} reconcile{} stuck, the longest-running first:",
                if total == 1 { "" } else { "s" }
            );
        }
        let mut tail = String::new();
        if let Some(runtime) = &self.runtime {
            tail = clip(format!("\nruntime: {runtime}"), LINE_BYTES);
        } else if self.culprits.is_empty()
            && let Some(reconcilers) = &self.reconcilers
        {
            // An escalation without an overdue reconcile (cancelled too often): its reason
            // is all there is to say.
            tail = clip(format!("\nreconcilers: {reconcilers}"), LINE_BYTES);
        }
        let mut out = clip(head, max_bytes.saturating_sub(tail.len()));
        let mut named = 0;
        for culprit in &self.culprits {
            let line = clip(format!("\n{}", culprit.line()), LINE_BYTES);
            let rest = total - named - 1;
            let room_for_rest = if rest > 0 { more_line(rest).len() } else { 0 };
            if out.len() + line.len() + room_for_rest + tail.len() > max_bytes {
                break;
            }
            out.push_str(&line);
            named += 1;
        }
        if named < total {
            let more = more_line(total - named);
            if out.len() + more.len() + tail.len() <= max_bytes {
                out.push_str(&more);
            }
        }
        if out.len() + tail.len() <= max_bytes {
            out.push_str(&tail);
        }
        // A limit too small for the first line's clipped form: cut it bare.
        if out.len() > max_bytes {
            let mut end = max_bytes;
            while !out.is_char_boundary(end) {
                end -= 1;
            }
            out.truncate(end);
        }
        out
    }
}

fn more_line(n: usize) -> String {
    format!("\nand {n} more")
}

impl Culprit {
    /// `controller namespace/name: ran 12s of a 3s deadline, in-poll, in f at file:line`.
    fn line(&self) -> String {
        let mut line = format!(
            "{} {}: ran {} of a {} deadline, {}",
            self.controller,
            self.object,
            fmt_duration(self.elapsed),
            fmt_duration(self.deadline),
            self.state
        );
        if let Some(place) = &self.place {
            let joint = if self.state == HangState::InPoll {
                ", in "
            } else {
                ", "
            };
            line.push_str(joint);
            line.push_str(place);
        }
        line
    }
}

/// The innermost frame of the operator's own code in `stack`, as `function at
/// file:line`: the first frame, from the innermost, that is neither the standard
/// library's (by its file under `rust/library`, or its function in `std`, `core` or
/// `alloc`), nor a registry crate's (its file under `NAME-VERSION/`), nor a C
/// library's (a bare symbol without a file), and lies above the guard's poll. `None`
/// when no frame is.
pub(crate) fn own_frame(
    stack: &Stack,
    is_guard_poll: impl Fn(&crate::stack::Frame) -> bool,
) -> Option<String> {
    stack
        .frames
        .iter()
        .take_while(|frame| !is_guard_poll(frame))
        .find(|frame| is_own(frame))
        .map(ToString::to_string)
}

fn is_own(frame: &crate::stack::Frame) -> bool {
    let Some(function) = frame.function.as_deref() else {
        return false;
    };
    let crate_name = function
        .trim_start_matches(['<', '&', '*', '('])
        .trim_start_matches("mut ")
        .trim_start_matches("dyn ")
        .split("::")
        .next()
        .unwrap_or_default();
    if matches!(crate_name, "std" | "core" | "alloc") {
        return false;
    }
    match frame.file.as_deref() {
        Some(file) => !is_library_file(file),
        // A bare symbol without a file is the C library's (or another's without
        // symbols); a Rust path is a crate's.
        None => function.contains("::"),
    }
}

/// Whether `file` (as a stack shortens it) is the standard library's or a registry
/// crate's: `rust/library/…`, `NAME-1.2.3/…`, or under a cargo home.
fn is_library_file(file: &str) -> bool {
    if file.starts_with("rust/library/") || file.starts_with("/rustc/") || file.contains("/.cargo/")
    {
        return true;
    }
    let first = file.split('/').next().unwrap_or_default();
    first.rsplit_once('-').is_some_and(|(name, version)| {
        !name.is_empty()
            && version.split('.').count() >= 3
            && version.split('.').take(3).all(|n| n.parse::<u64>().is_ok())
    })
}

/// Where the termination message goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Destination {
    /// This path, created if need be.
    Path(PathBuf),
    /// This path only if it exists already (the kubelet creates Kubernetes' default),
    /// so that nothing is written into `/dev` outside Kubernetes: the flags' default.
    #[cfg_attr(not(feature = "clap"), allow(dead_code))]
    IfExists(PathBuf),
}

impl Destination {
    /// The path to write to, if it is to be written: one that cannot be written (a
    /// directory that does not exist, no permission) is logged once here and skipped.
    pub(crate) fn check(self) -> Option<PathBuf> {
        match self {
            Self::IfExists(path) => path.exists().then_some(path),
            Self::Path(path) => {
                // Open without truncating: the file keeps what it had until the exit.
                match std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(&path)
                {
                    Ok(_) => Some(path),
                    Err(error) => {
                        tracing::warn!(
                            path = %path.display(),
                            %error,
                            "the termination message path cannot be written; no termination message will be"
                        );
                        None
                    }
                }
            }
        }
    }
}

/// Writes `message` to `path` at once, as a whole, on a thread of its own, waiting at
/// most `patience` for it: a temporary file beside it renamed over it where the
/// directory allows, else one write into it. Logs the outcome (one line).
pub(crate) fn write(path: &Path, message: String, patience: Duration) {
    let (done, written) = mpsc::channel();
    let target = path.to_owned();
    let spawned = std::thread::Builder::new()
        .name("termination-message".into())
        .spawn(move || {
            let _ = done.send(write_now(&target, message.as_bytes()).map(|()| message.len()));
        });
    let outcome = match spawned {
        Ok(_) => written.recv_timeout(patience),
        Err(error) => Ok(Err(error)),
    };
    match outcome {
        Ok(Ok(bytes)) => tracing::info!(
            path = %path.display(),
            bytes,
            "wrote why liveness failed to the termination message"
        ),
        Ok(Err(error)) => tracing::warn!(
            path = %path.display(),
            %error,
            "the termination message could not be written"
        ),
        Err(_) => tracing::warn!(
            path = %path.display(),
            patience = %fmt_duration(patience),
            "the termination message was not written in time; exiting without it"
        ),
    }
}

/// One whole write of `bytes` to `path`: renamed into place from a temporary file when
/// the directory lets one be made (a reader never sees half of it), else written in one
/// call into the file itself (Kubernetes' `/dev/termination-log` is a file mounted into
/// a directory the process cannot write).
fn write_now(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Some(name) = path.file_name()
    {
        let temporary = dir.join(format!(
            ".{}.{}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        if let Ok(mut file) = std::fs::File::create(&temporary) {
            let renamed = file
                .write_all(bytes)
                .and_then(|()| std::fs::rename(&temporary, path));
            if renamed.is_ok() {
                return Ok(());
            }
            // A mount point cannot be renamed over (EBUSY): write into it instead.
            let _ = std::fs::remove_file(&temporary);
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .create(true)
        .open(path)?;
    file.write_all(bytes)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::stack::Frame;

    fn culprit(n: usize, place: Option<&str>) -> Culprit {
        Culprit {
            controller: "configtemplates".into(),
            object: format!("default/object-{n:03}"),
            elapsed: Duration::from_secs(400 - n as u64),
            deadline: Duration::from_secs(300),
            state: if place.is_some_and(|p| p.contains(" at ")) {
                HangState::InPoll
            } else {
                HangState::Awaiting
            },
            place: place.map(str::to_owned),
        }
    }

    /// A cause of `n` culprits, half in a poll, half awaiting a request.
    pub(crate) fn cause(n: usize) -> Cause {
        let kept = n.min(CULPRITS);
        Cause {
            culprits: (0..kept)
                .map(|i| {
                    culprit(
                        i,
                        Some(if i % 2 == 0 {
                            "my_operator::reconcile::take_lock at src/reconcile.rs:42"
                        } else {
                            "waiting on GET /api/v1/namespaces/default/configmaps/a, sent 5m ago, no response yet"
                        }),
                    )
                })
                .collect(),
            more: n - kept,
            reconcilers: Some("configtemplates default/object-000 running 6m 40s".into()),
            runtime: None,
        }
    }

    #[test]
    fn the_message_names_each_culprit_on_a_line_and_counts_what_does_not_fit() {
        let one = cause(1).text(MESSAGE_BYTES);
        assert_eq!(
            one,
            "reconcile-watchdog: liveness failed (reconcilers); 1 reconcile stuck, the longest-running first:\n\
             configtemplates default/object-000: ran 6m 40s of a 5m deadline, in-poll, in my_operator::reconcile::take_lock at src/reconcile.rs:42"
        );
        for n in [10, 150, 100_000] {
            let text = cause(n).text(MESSAGE_BYTES);
            assert!(text.len() <= MESSAGE_BYTES, "{n}: {} bytes", text.len());
            let named = text
                .lines()
                .filter(|l| l.starts_with("configtemplates "))
                .count();
            if n == 10 {
                assert_eq!(named, 10, "{text}");
                assert!(!text.contains("more"), "{text}");
            } else {
                assert!(named >= 10, "{n}: {text}");
                assert!(
                    text.ends_with(&format!("\nand {} more", n - named)),
                    "{n}: {text}"
                );
            }
            assert!(text.contains(&format!("; {n} reconciles stuck")), "{text}");
        }
        // Small limits, as an Event's note has: never over, never a cut line.
        for limit in [0, 50, 200, 1024] {
            let text = cause(150).text(limit);
            assert!(text.len() <= limit, "{limit}: {text}");
        }
        let text = cause(150).text(1024);
        assert!(
            text.lines()
                .skip(1)
                .all(|l| l.starts_with("configtemplates ") || l.starts_with("and ")),
            "{text}"
        );
    }

    #[test]
    fn a_stall_and_an_escalation_say_their_reasons() {
        let stall = Cause {
            culprits: vec![culprit(0, Some("my_operator::spin at src/lib.rs:7"))],
            more: 0,
            reconcilers: None,
            runtime: Some("async runtime heartbeat is 12s old (threshold 10s)".into()),
        };
        let text = stall.text(MESSAGE_BYTES);
        assert!(
            text.starts_with("reconcile-watchdog: liveness failed (runtime); 1 reconcile stuck"),
            "{text}"
        );
        assert!(
            text.ends_with("\nruntime: async runtime heartbeat is 12s old (threshold 10s)"),
            "{text}"
        );
        let escalation = Cause {
            culprits: Vec::new(),
            more: 0,
            reconcilers: Some("web ns/a cancelled 3 times within 10m".into()),
            runtime: None,
        };
        assert_eq!(
            escalation.text(MESSAGE_BYTES),
            "reconcile-watchdog: liveness failed (reconcilers)\nreconcilers: web ns/a cancelled 3 times within 10m"
        );
    }

    fn frame(function: &str, file: Option<&str>) -> Frame {
        Frame {
            ip: 0x1000,
            function: Some(function.into()),
            file: file.map(str::to_owned),
            line: file.map(|_| 7),
        }
    }

    #[test]
    fn the_own_frame_is_the_innermost_outside_std_registry_crates_and_libc() {
        let stack = Stack {
            frames: vec![
                frame("syscall", None),
                frame(
                    "std::sys::pal::unix::futex::futex_wait",
                    Some("rust/library/std/src/sys/pal/unix/futex.rs"),
                ),
                frame("<std::sync::poison::mutex::Mutex<T>>::lock", None),
                frame(
                    "parking_lot::raw_mutex::RawMutex::lock_slow",
                    Some("parking_lot-0.12.3/src/raw_mutex.rs"),
                ),
                frame(
                    "my_operator::reconcile::take_lock",
                    Some("src/reconcile.rs"),
                ),
                frame(
                    "my_operator::reconcile::{{closure}}",
                    Some("src/reconcile.rs"),
                ),
                frame(
                    "<reconcile_watchdog::guard::guarded::Guarded<F>>::poll",
                    Some("lib/src/guard/guarded.rs"),
                ),
            ],
            ..Stack::default()
        };
        let guard = |f: &Frame| f.function.as_deref().is_some_and(|f| f.contains("Guarded"));
        assert_eq!(
            own_frame(&stack, guard).as_deref(),
            Some("my_operator::reconcile::take_lock at src/reconcile.rs:7")
        );
        // Only library frames below the guard's poll: none is named.
        let library = Stack {
            frames: vec![
                stack.frames[0].clone(),
                stack.frames[1].clone(),
                stack.frames[6].clone(),
                stack.frames[4].clone(),
            ],
            ..Stack::default()
        };
        assert_eq!(own_frame(&library, guard), None);
        // Without files (a binary run in place), by the function's path.
        let bare = Stack {
            frames: vec![
                frame("syscall", None),
                frame("core::ptr::drop", None),
                frame("my_operator::spin", None),
            ],
            ..Stack::default()
        };
        assert_eq!(
            own_frame(&bare, guard).as_deref(),
            Some("my_operator::spin")
        );
    }

    #[test]
    fn a_message_is_written_whole_to_a_new_path_and_over_an_old_one() {
        let dir = std::env::temp_dir().join(format!("restart-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("termination-log");
        assert_eq!(Destination::Path(path.clone()).check(), Some(path.clone()));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        write(&path, "first, and longer".into(), WRITE_PATIENCE);
        write(&path, "second".into(), WRITE_PATIENCE);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second");
        let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left behind");

        let absent = dir.join("absent");
        assert_eq!(Destination::IfExists(absent.clone()).check(), None);
        assert!(!absent.exists(), "the default is never created");
        let unwritable = dir.join("no-such-dir").join("log");
        assert_eq!(Destination::Path(unwritable).check(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
