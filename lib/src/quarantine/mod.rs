//! Quarantine: an object whose reconcile keeps failing liveness is not reconciled for a
//! while, so that one bad object cannot crash-loop the whole operator.
//!
//! A reconcile that blocks its worker cannot be cancelled; under `--on-hang restart` the
//! watchdog fails liveness and the kubelet restarts the process. When one object hangs
//! its reconcile every time, the restarted process reconciles it again first thing and
//! is restarted again. So the process records, at the moment liveness fails, the
//! objects whose hangs made it fail, in a ledger kept in a [`Store`] that survives
//! the restart (the kube integration's is a ConfigMap). [`Quarantine`] is the whole
//! decision, a pure function of the ledger, the object and the time: an object that
//! failed liveness `after` times within `period` is quarantined for `period` from its
//! latest failure, unless its spec changed (its generation), it was re-created (its
//! uid) or a person lifted it. [`Keeper`] drives it in a process: it hears the
//! monitor's scans without ever blocking them, writes the ledger from a thread of its
//! own, and answers the kube integration, which skips the reconcile of a quarantined
//! object and requeues it for when the quarantine ends.

mod keeper;
mod store;
#[cfg(test)]
mod tests;

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

#[cfg(any(test, feature = "_kube"))]
pub(crate) use keeper::{Admission, Announcement};
pub use keeper::{Keeper, LIFT_ANNOTATION};
pub use store::{MemoryStore, Store, StoreError, Stored};

/// The format of the ledger this version writes and reads.
pub(crate) const LEDGER_VERSION: u32 = 1;

/// The largest ledger read, in bytes: a bigger one is ignored (a ConfigMap holds 1 MiB).
pub(crate) const MAX_LEDGER_BYTES: usize = 256 * 1024;

/// The most failure times one entry keeps (its `count` goes on counting).
const MAX_TIMES: usize = 16;

/// The longest text kept of how a reconcile hung, in bytes.
const MAX_HOW: usize = 256;

/// Errors of the quarantine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ledger is larger than what is read (256 KiB).
    #[error("the quarantine ledger is {size} bytes, more than the {max} read", max = MAX_LEDGER_BYTES)]
    TooBig {
        /// Its size.
        size: usize,
    },
    /// The ledger is not the JSON of a ledger.
    #[error("the quarantine ledger is malformed")]
    Malformed(#[source] serde_json::Error),
    /// The ledger is of another format version.
    #[error("the quarantine ledger is of version {0}, this process reads version {read}", read = LEDGER_VERSION)]
    Version(u32),
    /// The OS refused to start the keeper's thread.
    #[error("failed to start the quarantine thread")]
    Spawn(#[source] std::io::Error),
}

/// How a reconcile hung when it failed liveness, as the record keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Hang {
    /// `in-poll`, `awaiting` or `starved`, as the hang report's `state`.
    pub(crate) state: String,
    /// Where it waited, when the report knew (the request in flight, a labelled await).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) waiting: Option<String>,
    /// The stack's first own frame (`function at file:line`, the innermost of the
    /// operator's own code), when its thread's stack was captured: a reconcile blocked
    /// inside a poll. An awaiting one has no thread, so no stack, and has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) frame: Option<String>,
    /// How liveness came to fail: `restart`, or `escalated` under `--on-hang cancel`.
    pub(crate) action: String,
}

/// One liveness failure an object's hung reconcile caused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The controller whose reconcile hung.
    pub(crate) controller: String,
    /// The kind of the object.
    pub(crate) kind: String,
    /// The object, `namespace/name` or `name`.
    pub(crate) object: String,
    /// Its uid when known.
    pub(crate) uid: Option<String>,
    /// Its generation when known.
    pub(crate) generation: Option<i64>,
    /// How it hung.
    pub(crate) hang: Hang,
    /// When liveness failed.
    pub(crate) at: SystemTime,
}

/// The stack's own frame of a failure recorded before its stack was captured (the
/// capture waits for `--stack-capture-after` inside the poll).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LateFrame {
    /// The controller whose reconcile hung.
    pub(crate) controller: String,
    /// The object, `namespace/name` or `name`.
    pub(crate) object: String,
    /// When the failure was recorded: the frame belongs to the entry whose latest it is.
    pub(crate) at: SystemTime,
    /// `function at file:line`.
    pub(crate) frame: String,
}

/// What the ledger remembers of one object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// The controller whose reconciles hung.
    pub(crate) controller: String,
    /// The kind of the object.
    pub(crate) kind: String,
    /// The object, `namespace/name` or `name`.
    pub(crate) object: String,
    /// Its uid at the failures, when known: a re-created object is another one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) uid: Option<String>,
    /// Its generation at the failures, when known: a new spec starts over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) generation: Option<i64>,
    /// How its latest hang was.
    pub(crate) hang: Hang,
    /// How many liveness failures it caused (of this uid and generation).
    pub(crate) count: u32,
    /// When, the latest [`MAX_TIMES`] of them, oldest first (RFC 3339).
    #[serde(with = "times")]
    pub(crate) failures: Vec<SystemTime>,
}

impl Entry {
    /// The latest failure.
    #[must_use]
    pub(crate) fn latest(&self) -> Option<SystemTime> {
        self.failures.last().copied()
    }

    fn is(&self, controller: &str, object: &str) -> bool {
        self.controller == controller && self.object == object
    }
}

/// The record of liveness failures that survives a restart: bounded, the entries whose
/// latest failure is oldest dropped first, and counted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ledger {
    /// The format version ([`LEDGER_VERSION`]).
    pub(crate) version: u32,
    /// Entries dropped to keep within the bound, in all.
    #[serde(default)]
    pub(crate) dropped: u64,
    /// Liveness failures recorded, in all: a counter that survives restarts.
    #[serde(default)]
    pub(crate) recorded: u64,
    /// One per object.
    #[serde(default)]
    pub(crate) entries: Vec<Entry>,
}

impl Ledger {
    /// An empty ledger.
    #[must_use]
    pub(crate) fn new() -> Self {
        Self {
            version: LEDGER_VERSION,
            ..Self::default()
        }
    }

    /// Reads a ledger: refused when too big, malformed or of another version.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, Error> {
        if bytes.len() > MAX_LEDGER_BYTES {
            return Err(Error::TooBig { size: bytes.len() });
        }
        let ledger: Self = serde_json::from_slice(bytes).map_err(Error::Malformed)?;
        if ledger.version != LEDGER_VERSION {
            return Err(Error::Version(ledger.version));
        }
        Ok(ledger)
    }

    /// The ledger as the store keeps it: one line of JSON.
    #[must_use]
    pub(crate) fn encode(&self) -> Vec<u8> {
        // Serializing plain data into a Vec cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The entry of `object` of `controller`, if any.
    #[must_use]
    pub(crate) fn entry(&self, controller: &str, object: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.is(controller, object))
    }

    /// Gives the entry whose latest failure is `late`'s the frame it lacks (a failure
    /// since is another hang, whose frame this is not).
    pub(crate) fn late_frame(&mut self, late: &LateFrame) {
        let at = to_millis(late.at);
        if let Some(entry) = self.entries.iter_mut().find(|e| {
            e.is(&late.controller, &late.object) && e.latest() == Some(at) && e.hang.frame.is_none()
        }) {
            let mut frame = late.frame.clone();
            truncate(&mut frame, MAX_HOW);
            entry.hang.frame = Some(frame);
        }
    }

    /// Forgets the entry of `object` of `controller` if its latest failure is
    /// `latest` (a failure recorded since is kept). Whether it did.
    pub(crate) fn forget(
        &mut self,
        controller: &str,
        object: &str,
        latest: Option<SystemTime>,
    ) -> bool {
        let before = self.entries.len();
        self.entries
            .retain(|e| !(e.is(controller, object) && e.latest() == latest));
        self.entries.len() != before
    }
}

/// Why a quarantine ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Lift {
    /// Its spec changed: a new generation.
    SpecChanged,
    /// It was re-created: a new uid.
    Recreated,
    /// Its time was up.
    Expired,
    /// A person asked, with the lift annotation.
    ByHand,
    /// Its entry is gone from the ledger: deleted by hand, or expired and pruned.
    Removed,
}

impl Lift {
    /// Why, in words.
    #[must_use]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::SpecChanged => "its spec changed (a new generation)",
            Self::Recreated => "it was re-created (a new uid)",
            Self::Expired => "its quarantine expired",
            Self::ByHand => "the lift annotation asked for it",
            Self::Removed => "its entry is gone from the quarantine ledger (deleted, or expired)",
        }
    }
}

impl fmt::Display for Lift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An object about to be reconciled, as the decision sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Subject<'a> {
    /// The controller that reconciles it.
    pub(crate) controller: &'a str,
    /// `namespace/name`, or `name`.
    pub(crate) object: &'a str,
    /// Its uid, when known.
    pub(crate) uid: Option<&'a str>,
    /// Its generation, when known.
    pub(crate) generation: Option<i64>,
    /// Whether it carries the lift annotation.
    pub(crate) lift_asked: bool,
}

/// Where an object stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Reconcile it.
    Free,
    /// Do not reconcile it until `until`.
    Quarantined {
        /// The failure that quarantined it.
        since: SystemTime,
        /// When the quarantine ends.
        until: SystemTime,
        /// The liveness failures it caused.
        count: u32,
    },
    /// It was quarantined and no longer is: reconcile it, and forget its entry (whose
    /// latest failure is `latest`).
    Lifted {
        /// Why.
        why: Lift,
        /// The entry's latest failure.
        latest: Option<SystemTime>,
    },
}

/// The decision: when an object is quarantined, and when that ends. See the
/// [module](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quarantine {
    after: u32,
    period: Duration,
    max_objects: usize,
}

impl Default for Quarantine {
    /// After 2 liveness failures within an hour, for an hour; at most 100 objects.
    fn default() -> Self {
        Self::new(2, Duration::from_secs(3600))
    }
}

impl Quarantine {
    /// An object that caused `after` liveness failures within `period` is quarantined
    /// for `period` from the latest (`after` 0 quarantines nothing).
    #[must_use]
    pub fn new(after: u32, period: Duration) -> Self {
        Self {
            after,
            period,
            max_objects: 100,
        }
    }

    /// The ledger keeps at most `max` objects (default 100, at least 1); beyond, those
    /// whose latest failure is oldest are dropped, and counted.
    #[must_use]
    pub fn max_objects(mut self, max: usize) -> Self {
        self.max_objects = max.max(1);
        self
    }

    /// How many liveness failures quarantine an object.
    #[must_use]
    pub fn after(&self) -> u32 {
        self.after
    }

    /// The window they count in, and how long a quarantine lasts.
    #[must_use]
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Whether it ever quarantines.
    #[must_use]
    pub fn is_on(&self) -> bool {
        self.after > 0
    }

    /// Records `failure` into `ledger` at `now`: a new spec or a new object starts its
    /// entry over; entries whose latest failure is older than the period are pruned;
    /// beyond the bound, the entries whose latest failure is oldest are dropped.
    pub(crate) fn record(&self, ledger: &mut Ledger, failure: Failure, now: SystemTime) {
        ledger.version = LEDGER_VERSION;
        ledger.recorded += 1;
        // As the ledger stores it: what is in memory is what a restart reads.
        let mut failure = failure;
        failure.at = to_millis(failure.at);
        let mut how = failure.hang;
        truncate(&mut how.state, MAX_HOW);
        for text in [&mut how.waiting, &mut how.frame].into_iter().flatten() {
            truncate(text, MAX_HOW);
        }
        let same = |e: &Entry| {
            e.is(&failure.controller, &failure.object)
                && !differs(e.uid.as_deref(), failure.uid.as_deref())
                && !differs(e.generation, failure.generation)
        };
        match ledger.entries.iter_mut().find(|e| same(e)) {
            Some(entry) => {
                entry.count = entry.count.saturating_add(1);
                entry.failures.push(failure.at);
                entry.failures.sort();
                let excess = entry.failures.len().saturating_sub(MAX_TIMES);
                entry.failures.drain(..excess);
                entry.hang = how;
                entry.kind = failure.kind;
                entry.uid = entry.uid.take().or(failure.uid);
                entry.generation = entry.generation.or(failure.generation);
            }
            None => {
                ledger
                    .entries
                    .retain(|e| !e.is(&failure.controller, &failure.object));
                ledger.entries.push(Entry {
                    controller: failure.controller,
                    kind: failure.kind,
                    object: failure.object,
                    uid: failure.uid,
                    generation: failure.generation,
                    hang: how,
                    count: 1,
                    failures: vec![failure.at],
                });
            }
        }
        self.prune(ledger, now);
    }

    /// Drops what is no longer of use at `now` (failures more than a period before
    /// their entry's latest, entries whose latest is more than a period old), then the
    /// entries beyond the bound whose latest failure is oldest, counted.
    pub(crate) fn prune(&self, ledger: &mut Ledger, now: SystemTime) {
        let period = self.period;
        // Failures more than a period before an entry's latest can no longer count with
        // it; an entry whose latest is more than a period old quarantines nothing more.
        // (A failure dated after `now`, by another node's clock, is kept.)
        for entry in &mut ledger.entries {
            if let Some(latest) = entry.latest() {
                entry
                    .failures
                    .retain(|at| latest.duration_since(*at).unwrap_or_default() <= period);
            }
        }
        ledger.entries.retain(|e| {
            e.latest()
                .is_some_and(|latest| now.duration_since(latest).unwrap_or_default() < period)
        });
        let excess = ledger.entries.len().saturating_sub(self.max_objects);
        if excess > 0 {
            ledger.entries.sort_by_key(Entry::latest);
            ledger.entries.drain(..excess);
            ledger.dropped += excess as u64;
        }
    }

    /// Where `subject` stands at `now` by `ledger`.
    #[must_use]
    #[cfg_attr(not(feature = "_kube"), allow(dead_code))]
    pub(crate) fn judge(
        &self,
        ledger: &Ledger,
        subject: &Subject<'_>,
        now: SystemTime,
    ) -> Standing {
        if !self.is_on() {
            return Standing::Free;
        }
        let Some(entry) = ledger.entry(subject.controller, subject.object) else {
            return Standing::Free;
        };
        let Some(since) = self.quarantined_since(entry) else {
            return Standing::Free;
        };
        let latest = entry.latest();
        let lifted = |why| Standing::Lifted { why, latest };
        if differs(entry.uid.as_deref(), subject.uid) {
            return lifted(Lift::Recreated);
        }
        if differs(entry.generation, subject.generation) {
            return lifted(Lift::SpecChanged);
        }
        if subject.lift_asked {
            return lifted(Lift::ByHand);
        }
        let until = since + self.period;
        if now >= until {
            return lifted(Lift::Expired);
        }
        Standing::Quarantined {
            since,
            until,
            count: entry.count,
        }
    }

    /// When `entry`'s failures quarantined it: the latest, if the `after` latest fall
    /// within the period.
    fn quarantined_since(&self, entry: &Entry) -> Option<SystemTime> {
        let after = usize::try_from(self.after).ok()?;
        if entry.failures.len() < after {
            return None;
        }
        let latest = *entry.failures.last()?;
        let first = entry.failures[entry.failures.len() - after];
        let span = latest.duration_since(first).unwrap_or_default();
        (span <= self.period).then_some(latest)
    }
}

/// Whether two known values differ (an unknown one differs from nothing).
fn differs<T: PartialEq>(a: Option<T>, b: Option<T>) -> bool {
    matches!((a, b), (Some(a), Some(b)) if a != b)
}

/// `t` to the millisecond, as RFC 3339 in the ledger keeps it.
fn to_millis(t: SystemTime) -> SystemTime {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let millis = Duration::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
    SystemTime::UNIX_EPOCH + millis
}

/// Cuts `s` to at most `limit` bytes, on a character boundary.
fn truncate(s: &mut String, limit: usize) {
    if s.len() > limit {
        let mut end = limit;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// Failure times as RFC 3339 strings, readable in `kubectl get configmap -o yaml`.
mod times {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub(super) fn serialize<S: Serializer>(times: &[SystemTime], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            times
                .iter()
                .map(|t| humantime::format_rfc3339_millis(*t).to_string()),
        )
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<SystemTime>, D::Error> {
        let texts = Vec::<String>::deserialize(d)?;
        let mut times = texts
            .iter()
            .map(|t| humantime::parse_rfc3339_weak(t).map_err(D::Error::custom))
            .collect::<Result<Vec<_>, _>>()?;
        times.sort();
        Ok(times)
    }
}
