//! The registry of in-flight reconciles and the RAII guard that keeps it honest.

use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::clock;
use super::entry::{Clocks, Entry, Epoch, InFlight, ObjectKey, Outcome};
use super::fanout::{Both, Fanout};
use super::guarded::Guarded;
use super::thread::InfoCache;

/// Deadlines per controller: a default, and overrides by controller name.
#[derive(Clone, Debug)]
pub struct Deadlines {
    default: Duration,
    overrides: HashMap<String, Duration>,
    /// The share of its deadline past which a reconcile that ends on time is a near
    /// miss; `None`: never.
    near_miss_share: Option<f64>,
}

/// The default near-miss share of a deadline: 80 %.
pub const NEAR_MISS_SHARE: f64 = 0.8;

impl Deadlines {
    /// Every controller gets `default` unless overridden.
    #[must_use]
    pub fn new(default: Duration) -> Self {
        Self {
            default,
            overrides: HashMap::new(),
            near_miss_share: Some(NEAR_MISS_SHARE),
        }
    }

    /// A reconcile that ends on time after more than `share` (between 0 and 1) of its
    /// deadline is a near miss, told to the observer; `None` turns near misses off.
    /// A share outside (0, 1) turns them off too.
    #[must_use]
    pub fn near_miss_share(mut self, share: Option<f64>) -> Self {
        self.near_miss_share = share.filter(|s| *s > 0.0 && *s < 1.0);
        self
    }

    /// The near-miss share (`None`: off).
    #[must_use]
    pub fn near_miss(&self) -> Option<f64> {
        self.near_miss_share
    }

    /// The deadline of controller `name` when a flag or [`with`](Self::with) set it,
    /// `None` when it has the default.
    #[must_use]
    pub fn override_for(&self, name: &str) -> Option<Duration> {
        self.overrides.get(name).copied()
    }

    /// The names of the controllers with a deadline of their own.
    pub fn overridden(&self) -> impl Iterator<Item = &str> {
        self.overrides.keys().map(String::as_str)
    }

    /// How long a reconcile with `deadline` runs before its end is told to the
    /// observer as late: past the near-miss share, or past the deadline when off.
    fn late_after(&self, deadline: Duration) -> Duration {
        self.near_miss_share
            .map_or(deadline, |share| deadline.mul_f64(share))
    }

    /// Gives controller `name` its own deadline.
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, deadline: Duration) -> Self {
        self.overrides.insert(name.into(), deadline);
        self
    }

    /// The deadline of controller `name`.
    #[must_use]
    pub fn for_controller(&self, name: &str) -> Duration {
        self.overrides.get(name).copied().unwrap_or(self.default)
    }

    /// The default deadline.
    #[must_use]
    pub fn default_deadline(&self) -> Duration {
        self.default
    }
}

impl From<Duration> for Deadlines {
    fn from(default: Duration) -> Self {
        Self::new(default)
    }
}

/// A reconcile that ended after the monitor had reported it hung; the monitor drains
/// these to write the "ended after hang" event.
#[derive(Clone, Debug)]
pub struct Ended {
    /// The reconcile as it was last seen.
    pub reconcile: InFlight,
    /// How long it ran in all.
    pub elapsed: Duration,
    /// How it ended.
    pub outcome: Outcome,
}

/// Told of every reconcile that ends (metrics, the deadline advisor). It is asked once
/// per controller handle for that controller's [`ControllerObserver`], which each end
/// then goes to straight: no lookup by name on the reconcile's thread.
pub trait Observer: Send + Sync + 'static {
    /// The observer of the ends of `controller`'s reconciles of `kind`, or `None` to be
    /// told nothing of them (then an end costs the guard no clock read and no call).
    fn controller(&self, controller: &str, kind: &str) -> Option<Arc<dyn ControllerObserver>>;
}

/// Told of each end of one controller's reconciles. It runs on the reconcile's own
/// thread as the guard drops, so it must be quick and must not block.
pub trait ControllerObserver: Send + Sync + 'static {
    /// A reconcile ended with `outcome` after `elapsed`.
    fn finished(&self, outcome: Outcome, elapsed: Duration);

    /// A reconcile ended after more than its controller's near-miss share of its
    /// deadline (see [`Deadlines::near_miss_share`]), or past the deadline itself. Told
    /// after [`finished`](Self::finished), on the same thread; the common end costs the
    /// guard one comparison and no call.
    fn ended_late(&self, end: &LateEnd<'_>) {
        let _ = end;
    }
}

/// A reconcile that ended late: past its near-miss threshold or past its deadline.
#[derive(Clone, Copy, Debug)]
pub struct LateEnd<'a> {
    /// The controller that ran it.
    pub controller: &'a str,
    /// The kind of the object reconciled.
    pub kind: &'a str,
    /// The object reconciled.
    pub object: &'a ObjectKey,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it ran.
    pub elapsed: Duration,
    /// Its deadline.
    pub deadline: Duration,
    /// The monitor had reported it hung.
    pub reported_hung: bool,
}

impl LateEnd<'_> {
    /// Ended on time (within its deadline, never reported hung): a near miss.
    #[must_use]
    pub fn is_near_miss(&self) -> bool {
        self.elapsed <= self.deadline && !self.reported_hung
    }
}

/// Shards of the in-flight map. A scan read-locks one shard at a time, which a
/// registration passes over (see `Shared::insert`) and a guard's removal waits for: with
/// 256 shards, 1/256 of a scan (DashMap's default on a 2-core machine is 8).
/// Registration costs the same with any count; the spare shards cost 32 KiB.
const SHARDS: usize = 256;

/// One map value: what a scan needs to pass over an on-time reconcile, kept inline so
/// that it does not follow the pointer to the entry (a cache miss per reconcile).
struct Slot {
    /// When it started ([`clock`]); the scan compares it with one threshold per
    /// controller (now less the deadline), so registering does no arithmetic.
    started: u64,
    /// The address of the entry's `Controller`: compared to count per controller, never
    /// dereferenced (a clone of the `Arc` would cost two atomics per reconcile).
    controller: usize,
    entry: Arc<Entry>,
}

/// The hasher of the registry's map. Its keys are ids from a counter, never chosen by a
/// client, so one multiply by 2^64 / φ (Fibonacci hashing) spreads them over shards
/// (high bits) and buckets (low bits) alike, for a fraction of SipHash's cost.
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; any other input still gets mixed.
        for b in bytes {
            self.write_u64(self.0 ^ u64::from(*b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Builds [`IdHasher`]s.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub type BuildIdHasher = BuildHasherDefault<IdHasher>;

/// What every reconcile of one controller shares, fixed when its handle is made.
///
/// Entries hold it and it holds the registry, so a guard reaches the map through its
/// entry. That is a reference cycle (map, entry, controller, registry) only while the
/// entry is in the map, and the guard's drop takes it out.
///
/// Aligned to a cache line so that its fields, read by every reconcile, do not share
/// one with the `Arc`'s reference counts, which every reconcile writes: on two cores
/// that sharing made each read a miss.
#[repr(align(64))]
pub(crate) struct Controller {
    pub(crate) registry: Registry,
    pub(crate) name: Arc<str>,
    pub(crate) kind: Arc<str>,
    pub(crate) deadline: Duration,
    /// An end after this many nanoseconds is told to the observer as late (near miss or
    /// worse).
    late_after: u64,
    /// What the registry's observers resolved for this controller: the first, and the
    /// second (the others told after it, in pairs). The usual two (the advisor and the
    /// metrics) are told with one call each; behind one `Fanout` observer they took three.
    observers: [Option<Arc<dyn ControllerObserver>>; 2],
}

impl Controller {
    fn new(registry: &Registry, name: Arc<str>, kind: Arc<str>, deadline: Duration) -> Self {
        let shared = &registry.shared;
        let mut resolved = shared
            .observers
            .iter()
            .filter_map(|observer| observer.controller(&name, &kind));
        let first = resolved.next();
        let second = resolved.reduce(|first, then| Arc::new(Both(first, then)));
        Self {
            observers: [first, second],
            registry: registry.clone(),
            name,
            kind,
            deadline,
            late_after: u64::try_from(shared.deadlines.late_after(deadline).as_nanos())
                .unwrap_or(u64::MAX),
        }
    }
}

/// In-flight reconciles per controller, as a scan counted them.
pub type ControllerCounts = Vec<(Arc<str>, usize)>;

struct Shared {
    epoch: Epoch,
    observers: Vec<Arc<dyn Observer>>,
    /// Written by every registration; on a cache line of its own (see [`Controller`]).
    next_id: OwnLine<AtomicU64>,
    in_flight: DashMap<u64, Slot, BuildIdHasher>,
    deadlines: Deadlines,
    // Only reconciles already reported hung land here: rare, so a plain mutex.
    ended: Mutex<Vec<Ended>>,
}

/// A value alone on its cache line.
#[repr(align(64))]
struct OwnLine<T>(T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// How many busy shards a registration passes over before it waits for one.
const BUSY_SHARDS_SKIPPED: usize = 4;

impl Shared {
    /// Inserts `slot` under a fresh id, and returns the id.
    ///
    /// A scan read-locks one shard at a time; a registration that lands on that shard
    /// waits, and if the kernel has switched the scanner out meanwhile, for as long as
    /// another thread runs in its place (a time slice, milliseconds). The id is ours to
    /// choose, so a registration that finds its shard locked takes the next id instead,
    /// which hashes to another shard; only after several busy shards in a row does it wait.
    fn insert(&self, slot: Slot) -> u64 {
        for _ in 0..BUSY_SHARDS_SKIPPED {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            // Ids are never reused, so the entry is always vacant.
            if let Some(dashmap::Entry::Vacant(vacant)) = self.in_flight.try_entry(id) {
                vacant.insert(slot);
                return id;
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.in_flight.insert(id, slot);
        id
    }
}

/// The in-flight reconciles of a process. Cheap to clone: clones share one map.
#[derive(Clone)]
pub struct Registry {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("in_flight", &self.len())
            .finish()
    }
}

impl Registry {
    /// An empty registry whose controllers get these deadlines.
    #[must_use]
    pub fn new(deadlines: impl Into<Deadlines>) -> Self {
        Self::build(deadlines.into(), Vec::new())
    }

    /// Like [`new`](Self::new), telling `observer` of every reconcile that ends.
    #[must_use]
    pub fn with_observer(deadlines: impl Into<Deadlines>, observer: Arc<dyn Observer>) -> Self {
        Self::build(deadlines.into(), vec![observer])
    }

    /// Like [`new`](Self::new), telling each of `observers`, in order, of every
    /// reconcile that ends. Cheaper per reconcile than the same [`Fanout`] given to
    /// [`with_observer`](Self::with_observer), which tells them through one more call.
    #[must_use]
    pub fn with_observers(deadlines: impl Into<Deadlines>, observers: Fanout) -> Self {
        Self::build(deadlines.into(), observers.into_observers())
    }

    fn build(deadlines: Deadlines, observers: Vec<Arc<dyn Observer>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                epoch: Epoch::now(),
                observers,
                next_id: OwnLine(AtomicU64::new(1)),
                in_flight: DashMap::with_hasher_and_shard_amount(BuildIdHasher::default(), SHARDS),
                deadlines,
                ended: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The instant its entries' clocks count from.
    pub(crate) fn epoch(&self) -> Epoch {
        self.shared.epoch
    }

    /// The deadlines this registry hands out.
    #[must_use]
    pub fn deadlines(&self) -> &Deadlines {
        &self.shared.deadlines
    }

    /// A handle that registers reconciles of one controller, with that controller's
    /// deadline resolved once here rather than on every reconcile.
    #[must_use]
    pub fn controller(&self, name: &str, kind: &str) -> ControllerHandle {
        let deadline = self.shared.deadlines.for_controller(name);
        ControllerHandle {
            controller: Arc::new(Controller::new(self, name.into(), kind.into(), deadline)),
        }
    }

    /// How many reconciles are in flight.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.in_flight.len()
    }

    /// Whether no reconcile is in flight.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shared.in_flight.is_empty()
    }

    /// A copy of every in-flight reconcile. Holds each shard's read lock only while
    /// copying it: reconciles that start meanwhile take another shard, and those that
    /// end wait for at most one shard's copy.
    #[must_use]
    pub fn snapshot(&self) -> Vec<InFlight> {
        let clocks = Clocks::now();
        let mut threads = InfoCache::default();
        self.shared
            .in_flight
            .iter()
            .map(|e| e.value().entry.snapshot_at(*e.key(), &clocks, &mut threads))
            .collect()
    }

    /// What the monitor needs of one scan, cheaply: copies into `out` only the
    /// reconciles past their deadline at `now` (and, with `in_poll`, those inside a poll),
    /// and counts every reconcile per controller into `counts`. On-time reconciles are
    /// counted from the map alone, without touching their entries. Each overdue
    /// reconcile is marked as reported hung, as the verdict reports every one it is given, so
    /// that its end is queued for [`take_ended`](Self::take_ended).
    pub(crate) fn scan_into(
        &self,
        now: Instant,
        in_poll: bool,
        out: &mut Vec<InFlight>,
        counts: &mut ControllerCounts,
    ) {
        out.clear();
        counts.clear();
        let clocks = Clocks::at(now);
        let mut threads = InfoCache::default();
        // Controllers are few: tell them apart by the address in the slot, and read a
        // controller's name and deadline from its first entry only. Per controller, the
        // reconciles that started before `overdue_before` are overdue (none when the
        // deadline reaches back past the clock's origin).
        let epoch = self.shared.epoch;
        let mut seen: Vec<(usize, Option<u64>)> = Vec::new();
        for slot in self.shared.in_flight.iter() {
            let overdue_before = match seen.iter().position(|&(c, _)| c == slot.controller) {
                Some(i) => {
                    counts[i].1 += 1;
                    seen[i].1
                }
                None => {
                    let controller = &slot.entry.controller;
                    let overdue_before = now
                        .checked_sub(controller.deadline)
                        .map(|before| epoch.nanos(before));
                    seen.push((slot.controller, overdue_before));
                    counts.push((Arc::clone(&controller.name), 1));
                    overdue_before
                }
            };
            let overdue = overdue_before.is_some_and(|before| slot.started < before);
            if overdue {
                // The verdict reports every reconcile this scan finds overdue as hung.
                // Mark it now, under the shard's read lock, not after the verdict: the
                // guard leaves the map under the write lock and then reads the mark, so
                // one that ends from here on, however soon, queues its end.
                slot.entry.mark_reported_hung();
            }
            if overdue || (in_poll && slot.entry.in_poll()) {
                out.push(slot.entry.snapshot_at(*slot.key(), &clocks, &mut threads));
            }
        }
    }

    /// A copy of reconcile `id`, while it is in flight.
    pub(crate) fn get(&self, id: u64) -> Option<InFlight> {
        let entry = Arc::clone(&self.shared.in_flight.get(&id)?.entry);
        Some(entry.snapshot(id))
    }

    /// Takes the reconciles that ended after being reported hung.
    #[must_use]
    pub(crate) fn take_ended(&self) -> Vec<Ended> {
        std::mem::take(&mut *self.shared.ended.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Asks reconcile `id` to stop at its next poll and wakes it. Returns false when it
    /// has already ended.
    pub(crate) fn request_cancel(&self, id: u64) -> bool {
        // Clone the Arc out so no shard lock is held while waking: the waker may run
        // arbitrary code.
        let entry = self
            .shared
            .in_flight
            .get(&id)
            .map(|e| Arc::clone(&e.value().entry));
        match entry {
            Some(entry) => {
                entry.request_cancel();
                true
            }
            None => false,
        }
    }
}

/// Registers the reconciles of one controller.
#[derive(Clone)]
pub struct ControllerHandle {
    controller: Arc<Controller>,
}

impl std::fmt::Debug for ControllerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerHandle")
            .field("name", &self.controller.name)
            .field("kind", &self.controller.kind)
            .field("deadline", &self.controller.deadline)
            .finish()
    }
}

impl ControllerHandle {
    /// The controller's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.controller.name
    }

    /// The controller's deadline.
    #[must_use]
    pub fn deadline(&self) -> Duration {
        self.controller.deadline
    }

    /// The registry it registers in.
    #[must_use]
    pub fn registry(&self) -> &Registry {
        &self.controller.registry
    }

    /// The same controller with another deadline than the registry's [`Deadlines`] give
    /// it, for the reconciles registered through the returned handle.
    #[must_use]
    pub fn with_deadline(self, deadline: Duration) -> Self {
        let c = &self.controller;
        Self {
            controller: Arc::new(Controller::new(
                &c.registry,
                Arc::clone(&c.name),
                Arc::clone(&c.kind),
                deadline,
            )),
        }
    }

    /// Registers a reconcile of `object` by hand; prefer [`guard`](Self::guard).
    pub fn register(&self, object: ObjectKey) -> Guard {
        let controller = &self.controller;
        let shared = &controller.registry.shared;
        let started = clock::now();
        // The entry the thread's latest reconcile left, when nothing held it as it ended:
        // no allocation, and most fields stay as they are.
        let fresh = |object| {
            Arc::new(Entry::new(
                Arc::clone(controller),
                object,
                shared.epoch,
                started,
            ))
        };
        let entry = match SPARE.try_with(Cell::take).ok().flatten() {
            Some(mut spare) => match Arc::get_mut(&mut spare) {
                Some(unshared) => {
                    unshared.reuse(controller, object, started);
                    spare
                }
                None => fresh(object),
            },
            None => fresh(object),
        };
        let id = shared.insert(Slot {
            started,
            controller: Arc::as_ptr(controller) as usize,
            entry: Arc::clone(&entry),
        });
        Guard {
            id,
            entry: Some(entry),
            outcome: None,
        }
    }

    /// Runs `reconcile` for `object` under a guard that records its polls.
    pub fn guard<F, T, E>(&self, object: ObjectKey, reconcile: F) -> Guarded<F>
    where
        F: Future<Output = Result<T, E>>,
    {
        Guarded::new(self.register(object), reconcile)
    }
}

/// Keeps one reconcile in the registry for as long as it lives.
///
/// Dropping it removes the entry, whatever the path: a finished reconcile, an error,
/// a panic unwinding through it, or the future that owns it being dropped.
#[must_use = "the reconcile leaves the registry as soon as the guard is dropped"]
pub struct Guard {
    id: u64,
    /// Always there until the drop takes it (to keep it for the thread's next
    /// registration).
    entry: Option<Arc<Entry>>,
    outcome: Option<Outcome>,
}

thread_local! {
    /// An entry whose reconcile ended on this thread with nothing else holding it, kept
    /// for the thread's next registration: an allocation and a free saved per reconcile
    /// (about 200 instructions of the guard's 800, callgrind). One per thread, so it
    /// holds at most one entry's memory (and its controller's) per thread.
    static SPARE: Cell<Option<Arc<Entry>>> = const { Cell::new(None) };
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("id", &self.id)
            .field("controller", &self.entry().controller.name)
            .field("object", &self.entry().object)
            .finish()
    }
}

impl Guard {
    /// The registry id of this reconcile.
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Records how the reconcile ended; without it, a dropped guard counts as
    /// [`Outcome::Dropped`] (or [`Outcome::Panic`] while unwinding).
    #[inline]
    pub fn finish(mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
    }

    #[inline]
    pub(crate) fn entry(&self) -> &Arc<Entry> {
        match &self.entry {
            Some(entry) => entry,
            None => unreachable!("the entry is only taken by the drop"),
        }
    }

    /// A second reference to the entry, for `Guarded` to lend to the thread during its
    /// polls; the entry counts it as held, not as a waker.
    pub(crate) fn lend(&self) -> Arc<Entry> {
        let entry = self.entry();
        entry.lent();
        Arc::clone(entry)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(mut entry) = self.entry.take() else {
            return;
        };
        let outcome = || {
            self.outcome.unwrap_or(if std::thread::panicking() {
                Outcome::Panic
            } else {
                Outcome::Dropped
            })
        };
        let controller = &entry.controller;
        let shared = &controller.registry.shared;
        // Leave the map before queueing the end: the monitor takes ends before it
        // snapshots, so it never sees one reconcile both ended and in flight.
        shared.in_flight.remove(&self.id);
        // The second is only there with the first.
        if let [Some(first), second] = &controller.observers {
            let ran = clock::now().saturating_sub(entry.started);
            let elapsed = Duration::from_nanos(ran);
            first.finished(outcome(), elapsed);
            if let Some(second) = second {
                second.finished(outcome(), elapsed);
            }
            if ran > controller.late_after {
                let end = LateEnd {
                    controller: &controller.name,
                    kind: &controller.kind,
                    object: &entry.object,
                    outcome: outcome(),
                    elapsed,
                    deadline: controller.deadline,
                    reported_hung: entry.was_reported_hung(),
                };
                first.ended_late(&end);
                if let Some(second) = second {
                    second.ended_late(&end);
                }
            }
        }
        if entry.was_reported_hung() {
            let outcome = outcome();
            let reconcile = entry.snapshot(self.id);
            let ended = Ended {
                elapsed: reconcile.started.elapsed(),
                reconcile,
                outcome,
            };
            shared
                .ended
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(ended);
        }
        // Out of the map, nobody else holds it (no waker clone, no reader, no request
        // still in flight): the thread keeps it for its next reconcile.
        if let Some(unshared) = Arc::get_mut(&mut entry) {
            unshared.clear();
            // (Not during the thread's exit, when its thread-locals are gone.)
            let _ = SPARE.try_with(|spare| spare.set(Some(entry)));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn a_reconcile_that_ends_right_after_the_scan_that_found_it_overdue_queues_its_end() {
        let registry = Registry::new(Duration::from_secs(60));
        let handle = registry.controller("web", "Widget");
        let on_time = handle.register(ObjectKey::cluster("on-time"));
        let overdue = handle
            .clone()
            .with_deadline(Duration::ZERO)
            .register(ObjectKey::cluster("overdue"));
        let (mut out, mut counts) = (Vec::new(), Vec::new());
        let now = Instant::now() + Duration::from_secs(1);
        registry.scan_into(now, false, &mut out, &mut counts);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].id, overdue.id());

        // Ends right after the scan, before the verdict has looked: the scan marked it.
        let id = overdue.id();
        overdue.finish(Outcome::Ok);
        let ended = registry.take_ended();
        assert_eq!(
            ended.len(),
            1,
            "the end of a reconcile reported hung is queued"
        );
        assert_eq!(ended[0].reconcile.id, id);
        assert_eq!(ended[0].outcome, Outcome::Ok);

        // An on-time reconcile is not marked, and queues nothing.
        on_time.finish(Outcome::Ok);
        assert!(registry.take_ended().is_empty());
    }

    #[test]
    fn a_registration_passes_over_a_shard_being_read() {
        let registry = Registry::new(Duration::from_secs(60));
        let handle = registry.controller("web", "Widget");
        let first = handle.register(ObjectKey::cluster("a"));
        // Read-lock the shard of `first`, as a scan does the shard it is on, and make
        // that id the next one handed out: the registration's first choice is busy.
        let held = registry
            .shared
            .in_flight
            .get(&first.id())
            .expect("registered");
        registry.shared.next_id.store(first.id(), Ordering::Relaxed);

        let (sent, received) = mpsc::channel();
        let registering = std::thread::spawn(move || {
            let second = handle.register(ObjectKey::cluster("b"));
            sent.send(second.id()).expect("the test waits");
            second
        });
        // Had it waited for the shard, it would wait for as long as `held` lives.
        let second = received
            .recv_timeout(Duration::from_secs(10))
            .expect("the registration did not wait for the read-locked shard");
        drop(held);
        assert_ne!(second, first.id());
        drop(registering.join().expect("no panic"));
        drop(first);
        assert!(registry.is_empty());
    }
}
