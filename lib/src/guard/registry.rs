//! The registry of in-flight reconciles and the RAII guard that keeps it honest.

use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError, mpsc};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::clock;
use super::entry::{
    Clocks, Entry, Epoch, InFlight, KEY_MASK, ObjectKey, Outcome, PollState, key_of,
};
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
    /// When the entry's running reconcile started ([`clock`]), or earlier: the start of
    /// its first reconcile, or of a later one a scan copied in. A later reconcile of
    /// the same entry starts later, so a slot that is on time by it is on time; the
    /// scan looks at the entry only past this (and then copies its start in).
    started: AtomicU64,
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
    /// Its reconciles in flight: what a scan counts. The map cannot tell, as it also
    /// holds idle spare entries. Written by every reconcile, so on a line of its own.
    in_flight: OwnLine<AtomicUsize>,
    /// An observer of its ends has panicked (logged once).
    observer_panicked: AtomicBool,
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
            in_flight: OwnLine(AtomicUsize::new(0)),
            observer_panicked: AtomicBool::new(false),
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
    /// The ends of reconciles reported hung, queued by their guards for the monitor.
    /// std's unbounded channel is a lock-free list: a guard's send never waits for the
    /// monitor, and the monitor's receive waits for no send (but one caught between
    /// claiming its slot and writing it, a few instructions).
    ended: mpsc::Sender<Ended>,
    /// Only the monitor takes ends; the lock is only ever tried (see `take_ended`).
    ended_taken: Mutex<mpsc::Receiver<Ended>>,
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
    /// Inserts `slot` under a fresh key, and returns the key.
    ///
    /// A scan read-locks one shard at a time; a registration that lands on that shard
    /// waits, and if the kernel has switched the scanner out meanwhile, for as long as
    /// another thread runs in its place (a time slice, milliseconds). The key is ours to
    /// choose, so a registration that finds its shard locked takes the next key instead,
    /// which hashes to another shard; only after several busy shards in a row does it wait.
    fn insert(&self, slot: Slot) -> u64 {
        let mut busy = 0;
        loop {
            // Keys come from a counter, in the bits a reconcile id keeps for them: they
            // wrap after 2^42 insertions, when one still in use is passed over.
            let key = self.next_id.fetch_add(1, Ordering::Relaxed) & KEY_MASK;
            if key == 0 {
                continue;
            }
            let entry = if busy < BUSY_SHARDS_SKIPPED {
                let Some(entry) = self.in_flight.try_entry(key) else {
                    busy += 1;
                    continue;
                };
                entry
            } else {
                self.in_flight.entry(key)
            };
            if let dashmap::Entry::Vacant(vacant) = entry {
                vacant.insert(slot);
                return key;
            }
        }
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
        let (ended, ended_taken) = mpsc::channel();
        Self {
            shared: Arc::new(Shared {
                epoch: Epoch::now(),
                observers,
                next_id: OwnLine(AtomicU64::new(1)),
                in_flight: DashMap::with_hasher_and_shard_amount(BuildIdHasher::default(), SHARDS),
                deadlines,
                ended,
                ended_taken: Mutex::new(ended_taken),
            }),
        }
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

    /// How many reconciles are in flight (a pass over the map).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared
            .in_flight
            .iter()
            .filter(|slot| slot.entry.state().is_active())
            .count()
    }

    /// Whether no reconcile is in flight.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        !self
            .shared
            .in_flight
            .iter()
            .any(|slot| slot.entry.state().is_active())
    }

    /// A copy of every in-flight reconcile. Holds each shard's read lock only while
    /// copying it: reconciles that start or end on a spare entry do not wait for it, and
    /// those that insert or remove an entry take another shard or wait for at most one
    /// shard's copy.
    #[must_use]
    pub fn snapshot(&self) -> Vec<InFlight> {
        let clocks = Clocks::now();
        let mut threads = InfoCache::default();
        self.shared
            .in_flight
            .iter()
            .filter_map(|slot| slot.entry.snapshot_running(&clocks, &mut threads))
            .collect()
    }

    /// What the monitor needs of one scan, cheaply: copies into `out` only the
    /// reconciles past their deadline at `now` (and, with `in_poll`, those inside a poll),
    /// and counts every reconcile per controller into `counts` (each controller's
    /// in-flight counter). On-time reconciles are passed over from the map alone,
    /// without touching their entries (see `Slot::started`). Each overdue
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
                Some(i) => seen[i].1,
                None => {
                    let controller = &slot.entry.controller;
                    let overdue_before = now
                        .checked_sub(controller.deadline)
                        .map(|before| epoch.nanos(before));
                    seen.push((slot.controller, overdue_before));
                    let in_flight = controller.in_flight.load(Ordering::Relaxed);
                    if in_flight > 0 {
                        counts.push((Arc::clone(&controller.name), in_flight));
                    }
                    overdue_before
                }
            };
            // Past it by the slot's start (a lower bound): maybe overdue.
            let past =
                overdue_before.filter(|&before| slot.started.load(Ordering::Relaxed) < before);
            if past.is_none() && !in_poll {
                continue;
            }
            let entry = &slot.entry;
            let state = entry.state();
            if !state.is_active() {
                continue;
            }
            if let Some(before) = past {
                // Read after the state: a reconcile's start is written before the state
                // word publishes it.
                let started = entry.started();
                if started < before {
                    // The verdict reports every reconcile this scan finds overdue as
                    // hung. Copy it, then mark it, before the verdict looks. The copy is
                    // checked as a seqlock's read (and dropped, to be taken at the next
                    // scan, when the reconcile ends meanwhile or its thread holds the
                    // object): it never waits for the reconcile's thread. The mark and
                    // the reconcile's end are each one step on its state word, so one
                    // that ends from here on, however soon, queues its end; one that
                    // ended first is not marked, and not reported.
                    if let Some(copy) = entry.snapshot_running(&clocks, &mut threads)
                        && copy.id == state.id()
                        && entry.mark_reported_hung(copy.id)
                    {
                        out.push(copy);
                    }
                    continue;
                }
                // On time: the slot takes its start, so that the next scans pass over
                // it without looking at the entry until this reconcile nears its own
                // deadline.
                slot.started.store(started, Ordering::Relaxed);
            }
            if in_poll
                && entry.in_poll()
                && let Some(copy) = entry.snapshot_running(&clocks, &mut threads)
            {
                out.push(copy);
            }
        }
    }

    /// Copies into `out` only the reconciles inside a poll that began at least `for_at_least`
    /// before `now`: a rescue's culprits. Like [`scan_into`](Self::scan_into) with
    /// `in_poll`, it reads one word of each entry and copies none but those; it marks
    /// nothing. Returns how many entries it read, the measure of its cost.
    pub(crate) fn in_poll_into(
        &self,
        now: Instant,
        for_at_least: Duration,
        out: &mut Vec<InFlight>,
    ) -> u64 {
        out.clear();
        let clocks = Clocks::at(now);
        let mut threads = InfoCache::default();
        let mut read = 0;
        for slot in self.shared.in_flight.iter() {
            read += 1;
            if !slot.entry.in_poll() {
                continue;
            }
            if let Some(copy) = slot.entry.snapshot_running(&clocks, &mut threads)
                && matches!(copy.poll, PollState::InPoll { since }
                    if now.saturating_duration_since(since) >= for_at_least)
            {
                out.push(copy);
            }
        }
        read
    }

    /// A copy of reconcile `id`, while it is in flight.
    pub(crate) fn get(&self, id: u64) -> Option<InFlight> {
        let entry = Arc::clone(&self.shared.in_flight.get(&key_of(id))?.entry);
        entry.snapshot_of(id)
    }

    /// Takes the reconciles that ended after being reported hung. Never waits: each end
    /// is taken once, and an end queued meanwhile, or while another caller takes, is
    /// taken at the next call.
    #[must_use]
    pub(crate) fn take_ended(&self) -> Vec<Ended> {
        let taken = match self.shared.ended_taken.try_lock() {
            Ok(taken) => taken,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            // The monitor is the only caller but for tests: what the other takes is theirs.
            Err(TryLockError::WouldBlock) => return Vec::new(),
        };
        taken.try_iter().collect()
    }

    /// Asks reconcile `id` to stop at its next poll and wakes it. Returns false when it
    /// has already ended.
    pub(crate) fn request_cancel(&self, id: u64) -> bool {
        // Clone the Arc out so no shard lock is held while waking: the waker may run
        // arbitrary code.
        let entry = self
            .shared
            .in_flight
            .get(&key_of(id))
            .map(|e| Arc::clone(&e.value().entry));
        entry.is_some_and(|entry| entry.request_cancel(id))
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
        let started = clock::now();
        controller.in_flight.fetch_add(1, Ordering::Relaxed);
        // An entry a reconcile of this controller left idle in the map on this thread:
        // no allocation, no insertion.
        if let Some(spare) = SPARES.try_with(|s| s.take(controller)).ok().flatten() {
            // Held by the map and this thread only: no waker, no request, no reader that
            // cloned it. A scan may still be copying it through the map's reference; its
            // copy is checked against the state word and dropped (see `StateWord`).
            if Arc::strong_count(&spare) == 2
                && let Some(id) = spare.next_reconcile()
            {
                spare.reuse(id, object, started);
                return Guard {
                    id,
                    entry: Some(spare),
                    outcome: None,
                };
            }
            // Read right now: it stays a spare. (Its ids used up: it leaves the map.)
            release(spare);
        }
        let entry = Arc::new(Entry::new(
            Arc::clone(controller),
            object,
            controller.registry.shared.epoch,
            started,
        ));
        let id = controller.registry.shared.insert(Slot {
            started: AtomicU64::new(started),
            controller: Arc::as_ptr(controller) as usize,
            entry: Arc::clone(&entry),
        });
        entry.begin(id);
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
/// Dropping it ends the reconcile in the registry, whatever the path: a finished
/// reconcile, an error, a panic unwinding through it, or the future that owns it being
/// dropped.
#[must_use = "the reconcile leaves the registry as soon as the guard is dropped"]
pub struct Guard {
    id: u64,
    /// Always there until the drop takes it (to keep it for the thread's next
    /// registration).
    entry: Option<Arc<Entry>>,
    outcome: Option<Outcome>,
}

/// Spare entries a thread keeps: enough for the controllers whose reconciles its
/// runtime's tasks interleave, few enough that the map holds few idle entries.
const SPARES_PER_THREAD: usize = 4;

thread_local! {
    /// Entries whose reconciles ended on this thread with nothing else holding them,
    /// left idle in the map for the thread's next reconciles of their controllers
    /// (at most one per controller, mostly): an allocation, a free, a map insertion
    /// and a removal saved per reconcile (the insertion and the removal alone were
    /// about 210 of the guard's 916 instructions, callgrind). At most
    /// [`SPARES_PER_THREAD`] entries' memory (and their controllers') per thread.
    static SPARES: Spares = const { Spares([const { Cell::new(None) }; SPARES_PER_THREAD]) };
}

/// The thread's spare entries; they leave the map with the thread.
struct Spares([Cell<Option<Arc<Entry>>>; SPARES_PER_THREAD]);

impl Spares {
    /// Takes a spare of `controller`.
    #[inline]
    fn take(&self, controller: &Arc<Controller>) -> Option<Arc<Entry>> {
        for cell in &self.0 {
            match cell.take() {
                Some(spare) if Arc::ptr_eq(&spare.controller, controller) => return Some(spare),
                other => cell.set(other),
            }
        }
        None
    }

    /// Keeps `entry` in the first free place, unless a spare of its controller comes
    /// first (then it gives `entry` back); when every place holds another controller's
    /// spare, the first is given back, the others move up and `entry` takes the last
    /// place, so that the controllers (and registries) a thread no longer runs do not
    /// keep theirs.
    #[inline]
    fn keep(&self, entry: Arc<Entry>) -> Option<Arc<Entry>> {
        for cell in &self.0 {
            match cell.take() {
                None => {
                    cell.set(Some(entry));
                    return None;
                }
                Some(kept) => {
                    let same = Arc::ptr_eq(&kept.controller, &entry.controller);
                    cell.set(Some(kept));
                    if same {
                        return Some(entry);
                    }
                }
            }
        }
        let oldest = self.0[0].take();
        for i in 1..SPARES_PER_THREAD {
            self.0[i - 1].set(self.0[i].take());
        }
        self.0[SPARES_PER_THREAD - 1].set(Some(entry));
        oldest
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        for cell in &self.0 {
            if let Some(entry) = cell.take() {
                leave_map(&entry);
            }
        }
    }
}

/// Takes an idle entry out of its registry's map: off the common path, where an entry
/// stays as a spare.
#[cold]
#[inline(never)]
fn leave_map(entry: &Entry) {
    entry
        .controller
        .registry
        .shared
        .in_flight
        .remove(&entry.key());
}

/// Keeps an idle entry as one of the thread's spares; what is not kept (it, or the
/// spare it displaces) leaves the map. (During the thread's exit, when its thread-locals
/// are gone, it leaves the map too.) Inlined into the guard's drop: as a call it cost
/// about 10 instructions a reconcile.
#[inline(always)]
fn keep_as_spare(entry: Arc<Entry>) {
    let mut unused = Some(entry);
    let _ = SPARES.try_with(|spares| unused = unused.take().and_then(|e| spares.keep(e)));
    if let Some(entry) = unused {
        leave_map(&entry);
    }
}

/// Logs, once per controller, that an observer of its reconciles' ends panicked (the
/// guard caught it).
#[cold]
#[inline(never)]
fn observer_panicked(controller: &Controller) {
    if !controller.observer_panicked.swap(true, Ordering::Relaxed) {
        tracing::error!(
            controller = %controller.name,
            "an observer of reconcile ends panicked; the guard caught it and ended the reconcile as usual (logged once per controller)"
        );
    }
}

/// Queues the end of reconcile `id`, reported hung, for the monitor's
/// [`Registry::take_ended`]: off the common path.
#[cold]
#[inline(never)]
fn queue_end(entry: &Arc<Entry>, id: u64, outcome: Outcome) {
    let reconcile = entry.snapshot(id);
    let ended = Ended {
        elapsed: reconcile.started.elapsed(),
        reconcile,
        outcome,
    };
    // The receiver lives as long as the sender, in the same registry.
    let _ = entry.controller.registry.shared.ended.send(ended);
}

/// Puts back an idle entry this thread's registration could not use: it stays a spare
/// while it has ids left, and leaves the map otherwise.
#[cold]
fn release(spare: Arc<Entry>) {
    if spare.next_reconcile().is_some() {
        keep_as_spare(spare);
    } else {
        leave_map(&spare);
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("id", &self.id)
            .field("controller", &self.entry().controller.name)
            .field("object", &*self.entry().object())
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
        let Some(entry) = self.entry.take() else {
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
        // Leave the in-flight set before queueing the end: the monitor takes ends before
        // it scans, so it never sees one reconcile both ended and in flight.
        let hung = entry.end().is_hung();
        controller.in_flight.fetch_sub(1, Ordering::Relaxed);
        // The second is only there with the first. Observers are the user's code: a
        // panic in one is caught here, so that the end below is queued and the entry
        // kept or taken out of the map whatever it does (and a panic while the
        // reconcile's own panic unwinds does not abort the process).
        if let [Some(first), second] = &controller.observers {
            let told = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let ran = clock::now().saturating_sub(entry.started());
                let elapsed = Duration::from_nanos(ran);
                first.finished(outcome(), elapsed);
                if let Some(second) = second {
                    second.finished(outcome(), elapsed);
                }
                if ran > controller.late_after {
                    let object = entry.object().clone();
                    let end = LateEnd {
                        controller: &controller.name,
                        kind: &controller.kind,
                        object: &object,
                        outcome: outcome(),
                        elapsed,
                        deadline: controller.deadline,
                        reported_hung: hung,
                    };
                    first.ended_late(&end);
                    if let Some(second) = second {
                        second.ended_late(&end);
                    }
                }
            }));
            if told.is_err() {
                observer_panicked(controller);
            }
        }
        if hung {
            queue_end(&entry, self.id, outcome());
        }
        // Nobody else holds it (no waker clone, no request still in flight, no reader
        // that cloned it: the map's reference and this one), and it was not reported
        // hung (the monitor's copies of it stay this reconcile's): it stays in the map,
        // idle, as one of the thread's spares. A scan may be copying it through the
        // map's reference; its copy is checked against the state word.
        if !hung && Arc::strong_count(&entry) == 2 {
            // Whatever the last other holder wrote happened before this point.
            std::sync::atomic::fence(Ordering::Acquire);
            entry.clear();
            keep_as_spare(entry);
        } else {
            leave_map(&entry);
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

    /// Panics at every end it is told of.
    struct Panicking;

    impl Observer for Panicking {
        fn controller(&self, _: &str, _: &str) -> Option<Arc<dyn ControllerObserver>> {
            Some(Arc::new(Panicking))
        }
    }

    impl ControllerObserver for Panicking {
        fn finished(&self, _: Outcome, _: Duration) {
            panic!("an observer's bug");
        }
    }

    #[test]
    fn a_panicking_observer_cannot_keep_an_entry_or_its_registry() {
        let registry = Registry::with_observer(Duration::from_secs(60), Arc::new(Panicking));
        let shared = Arc::downgrade(&registry.shared);
        let handle = registry.controller("web", "Widget");
        let reported = std::thread::scope(|s| {
            s.spawn(|| {
                // One reported hung, then one on time (kept as the thread's spare until
                // the thread exits), then one that panics itself.
                let hung = handle
                    .clone()
                    .with_deadline(Duration::ZERO)
                    .register(ObjectKey::cluster("hung"));
                let (mut out, mut counts) = (Vec::new(), Vec::new());
                registry.scan_into(
                    Instant::now() + Duration::from_secs(1),
                    false,
                    &mut out,
                    &mut counts,
                );
                drop(hung);
                drop(handle.register(ObjectKey::cluster("on-time")));
                let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    let _guard = handle.register(ObjectKey::cluster("panics"));
                    panic!("the reconcile's own panic");
                }));
                assert!(
                    panicked.is_err(),
                    "the reconcile's panic goes on, not abort"
                );
                out.len()
            })
            .join()
            .expect("the observer's panics were caught")
        });
        assert_eq!(reported, 1);
        let ended = registry.take_ended();
        assert_eq!(ended.len(), 1, "the hung reconcile's end was queued");
        assert_eq!(ended[0].reconcile.object.as_str(), "hung");
        assert!(registry.is_empty());
        assert_eq!(
            registry.shared.in_flight.len(),
            0,
            "no entry left in the map"
        );
        drop((registry, handle));
        assert!(
            shared.upgrade().is_none(),
            "nothing keeps the registry alive"
        );
    }

    #[test]
    fn taking_ends_never_waits_and_takes_each_end_once() {
        let registry = Registry::new(Duration::ZERO);
        let handle = registry.controller("web", "Widget");
        let hung: Vec<_> = (0..3)
            .map(|i| handle.register(ObjectKey::cluster(&format!("hung-{i}"))))
            .collect();
        let (mut out, mut counts) = (Vec::new(), Vec::new());
        let now = Instant::now() + Duration::from_secs(1);
        registry.scan_into(now, false, &mut out, &mut counts);
        assert_eq!(out.len(), 3);
        let mut hung = hung.into_iter();
        drop(hung.next());

        // Another taker holds the queue: a take returns at once, with nothing.
        let held = registry.shared.ended_taken.lock().unwrap();
        let (sent, received) = mpsc::channel();
        std::thread::spawn({
            let registry = registry.clone();
            move || {
                sent.send(registry.take_ended().len())
                    .expect("the test waits")
            }
        });
        assert_eq!(
            received.recv_timeout(Duration::from_secs(10)),
            Ok(0),
            "the take waited for the queue"
        );
        // Ends queue while it is held, and none is lost or taken twice.
        drop(hung.next());
        drop(held);
        let ids = |ended: Vec<Ended>| {
            let mut ids: Vec<u64> = ended.iter().map(|e| e.reconcile.id).collect();
            ids.sort_unstable();
            ids
        };
        let mut expected: Vec<u64> = out.iter().map(|r| r.id).collect();
        expected.sort_unstable();
        let mut taken = ids(registry.take_ended());
        assert_eq!(taken.len(), 2);
        drop(hung.next());
        taken.extend(ids(registry.take_ended()));
        taken.sort_unstable();
        assert_eq!(taken, expected);
        assert!(registry.take_ended().is_empty());
    }

    #[test]
    fn a_scan_never_waits_for_a_thread_parked_holding_an_entrys_object() {
        let registry = Registry::new(Duration::ZERO);
        let handle = registry.controller("web", "Widget");
        let guard = handle.register(ObjectKey::cluster("overdue"));
        let entry = Arc::clone(guard.entry());
        let scan = |registry: Registry| {
            let (sent, received) = mpsc::channel();
            std::thread::spawn(move || {
                let (mut out, mut counts) = (Vec::new(), Vec::new());
                let now = Instant::now() + Duration::from_secs(1);
                registry.scan_into(now, true, &mut out, &mut counts);
                let _ = sent.send(out.iter().map(|r| r.id).collect::<Vec<_>>());
            });
            received
                .recv_timeout(Duration::from_secs(10))
                .expect("the scan waited for the thread holding the object")
        };

        // A thread parked where the entry's reuse writes the object: the scan goes on,
        // and leaves the copy (and the mark) for a later scan.
        let (park, parked) = mpsc::channel::<()>();
        let (holding, held) = mpsc::channel();
        let holder = {
            let entry = Arc::clone(&entry);
            std::thread::spawn(move || {
                let _object = entry.hold_object_as_reuse_does();
                holding.send(()).expect("the test waits");
                let _ = parked.recv();
            })
        };
        held.recv().expect("holding");
        assert_eq!(scan(registry.clone()), Vec::<u64>::new());
        assert!(registry.take_ended().is_empty());
        drop(park);
        holder.join().expect("no panic");

        // Released: the next scan reports it, and marks it.
        assert_eq!(scan(registry.clone()), vec![guard.id()]);
        drop(guard);
        assert_eq!(registry.take_ended().len(), 1);
    }

    #[test]
    fn an_ended_entry_holds_the_threads_next_reconcile_and_the_old_id_reaches_nothing() {
        let registry = Registry::new(Duration::from_secs(60));
        let handle = registry.controller("web", "Widget");
        let first = handle.register(ObjectKey::cluster("a"));
        let first_id = first.id();
        first.finish(Outcome::Ok);
        assert!(registry.is_empty());
        assert_eq!(registry.len(), 0);
        assert_eq!(
            registry.shared.in_flight.len(),
            1,
            "the ended entry stays in the map as the thread's spare"
        );
        assert!(registry.snapshot().is_empty());

        let second = handle.register(ObjectKey::cluster("b"));
        assert_ne!(second.id(), first_id);
        assert_eq!(key_of(second.id()), key_of(first_id), "the same entry");
        assert_eq!(registry.shared.in_flight.len(), 1);
        assert_eq!(registry.len(), 1);
        // The ended reconcile's id finds nothing, and cannot cancel its successor.
        assert!(registry.get(first_id).is_none());
        assert!(!registry.request_cancel(first_id));
        let now = registry.get(second.id()).expect("in flight");
        assert_eq!(now.object, ObjectKey::cluster("b"));
        assert!(!now.cancel_requested);
        assert!(registry.request_cancel(second.id()));
        assert!(
            registry
                .get(second.id())
                .expect("in flight")
                .cancel_requested
        );
        second.finish(Outcome::Cancelled);

        // The cancel request ended with its reconcile.
        let third = handle.register(ObjectKey::cluster("c"));
        assert_eq!(key_of(third.id()), key_of(first_id));
        assert!(
            !registry
                .get(third.id())
                .expect("in flight")
                .cancel_requested
        );
        assert_eq!(registry.snapshot().len(), 1);
        drop(third);
        assert!(registry.is_empty());
    }

    #[test]
    fn a_reused_entry_is_judged_by_its_own_reconciles_start() {
        let deadline = Duration::from_secs(10);
        let registry = Registry::new(deadline);
        let handle = registry.controller("web", "Widget");
        let first = handle.register(ObjectKey::cluster("a"));
        let first_started = registry.get(first.id()).expect("in flight").started;
        drop(first);
        std::thread::sleep(Duration::from_millis(5));
        let second = handle.register(ObjectKey::cluster("b"));
        let id = second.id();
        let started = registry.get(id).expect("in flight").started;
        assert!(started > first_started);

        // Past the deadline of the slot's start, the first reconcile's, not of this one:
        // on time, counted, not marked.
        let (mut out, mut counts) = (Vec::new(), Vec::new());
        registry.scan_into(started + deadline, false, &mut out, &mut counts);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(counts, vec![(Arc::from("web"), 1)]);
        // Past its own: overdue, and marked, so its end is queued.
        registry.scan_into(
            started + deadline + Duration::from_millis(1),
            false,
            &mut out,
            &mut counts,
        );
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].id, id);
        assert_eq!(out[0].object, ObjectKey::cluster("b"));
        second.finish(Outcome::Ok);
        let ended = registry.take_ended();
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].reconcile.id, id);

        // An entry reported hung is not reused (a reader may still be copying it).
        let third = handle.register(ObjectKey::cluster("c"));
        assert_ne!(key_of(third.id()), key_of(id));
        drop(third);
        assert!(registry.is_empty());
        assert_eq!(registry.shared.in_flight.len(), 1);
    }

    #[test]
    fn an_entry_still_held_at_its_end_leaves_the_map() {
        let registry = Registry::new(Duration::from_secs(60));
        let handle = registry.controller("web", "Widget");
        let guard = handle.register(ObjectKey::cluster("a"));
        // As a waker clone the reconcile kept would hold it.
        let held = guard.lend();
        drop(guard);
        assert_eq!(registry.shared.in_flight.len(), 0);
        drop(held);

        // A spare per controller: reconciles of two, in turn, each reuse their own.
        let other = registry.controller("db", "Widget");
        let (web, db) = (
            handle.register(ObjectKey::cluster("b")),
            other.register(ObjectKey::cluster("c")),
        );
        let keys = (key_of(web.id()), key_of(db.id()));
        drop((web, db));
        assert_eq!(registry.shared.in_flight.len(), 2);
        for _ in 0..3 {
            let web = handle.register(ObjectKey::cluster("b"));
            let db = other.register(ObjectKey::cluster("c"));
            assert_eq!((key_of(web.id()), key_of(db.id())), keys);
        }
        // Two of one controller at once: the second to end leaves the map.
        let (first, second) = (
            handle.register(ObjectKey::cluster("d")),
            handle.register(ObjectKey::cluster("e")),
        );
        drop((first, second));
        assert_eq!(registry.shared.in_flight.len(), 2);
        assert!(registry.is_empty());

        // A thread that moves on to other controllers lets the old ones' spares go.
        let others: Vec<_> = (0..SPARES_PER_THREAD)
            .map(|i| registry.controller(&format!("other-{i}"), "Widget"))
            .collect();
        for other in &others {
            drop(other.register(ObjectKey::cluster("f")));
        }
        assert_eq!(registry.shared.in_flight.len(), SPARES_PER_THREAD);
        let names: Vec<_> = registry
            .shared
            .in_flight
            .iter()
            .map(|slot| slot.entry.controller.name.to_string())
            .collect();
        assert!(!names.contains(&"web".to_owned()), "{names:?}");
        assert!(registry.is_empty());
    }

    #[test]
    fn keys_wrap_past_those_in_use() {
        let registry = Registry::new(Duration::from_secs(60));
        let handle = registry.controller("web", "Widget");
        let first = handle.register(ObjectKey::cluster("a"));
        assert_eq!(key_of(first.id()), 1);
        registry.shared.next_id.store(KEY_MASK, Ordering::Relaxed);
        let last = handle.register(ObjectKey::cluster("b"));
        assert_eq!(last.id(), KEY_MASK);
        // Past the last key: 0 is never one, and 1 is in use.
        let wrapped = handle.register(ObjectKey::cluster("c"));
        assert_eq!(wrapped.id(), 2);
        for guard in [&first, &last, &wrapped] {
            assert_eq!(registry.get(guard.id()).map(|r| r.id), Some(guard.id()));
        }
        assert!(registry.request_cancel(last.id()));
        drop((first, last, wrapped));
        assert!(registry.is_empty());
    }

    /// Two threads run reconciles back to back (reusing their spares) while a third
    /// scans with every reconcile overdue and cancels what it saw: a report names the
    /// object its reconcile was registered with, every reconcile reported hung queues its
    /// end once, and a cancel lands only on the reconcile it named.
    #[test]
    fn marks_and_cancels_never_land_on_a_reused_entrys_next_reconcile() {
        use std::collections::{HashMap, HashSet};
        use std::sync::atomic::AtomicBool;

        let registry = Registry::new(Duration::from_secs(60));
        let handle = registry.controller("web", "Widget");
        let done = AtomicBool::new(false);
        let (registered, (reported, cancelled)) = std::thread::scope(|s| {
            let runners: Vec<_> = (0..2)
                .map(|t| {
                    let (handle, registry, done) = (handle.clone(), &registry, &done);
                    s.spawn(move || {
                        let mut seen = Vec::new();
                        let mut i = 0;
                        while !done.load(Ordering::Relaxed) {
                            i += 1;
                            let object = ObjectKey::cluster(&format!("{t}-{i}"));
                            let guard = handle.register(object.clone());
                            // Running long enough for the scanner to meet it now and then.
                            std::thread::yield_now();
                            let cancel_seen =
                                registry.get(guard.id()).is_some_and(|r| r.cancel_requested);
                            seen.push((guard.id(), object, cancel_seen));
                        }
                        seen
                    })
                })
                .collect();
            let scanner = s.spawn(|| {
                let (mut out, mut counts) = (Vec::new(), Vec::new());
                let mut reported: HashMap<u64, ObjectKey> = HashMap::new();
                let mut cancelled = HashSet::new();
                let give_up = Instant::now() + Duration::from_secs(20);
                // Enough scans that land on running reconciles, within a bound.
                while cancelled.len() < 500 && Instant::now() < give_up {
                    let now = Instant::now() + Duration::from_secs(3600);
                    registry.scan_into(now, false, &mut out, &mut counts);
                    for r in &out {
                        if let Some(before) = reported.insert(r.id, r.object.clone()) {
                            assert_eq!(before, r.object, "reconcile {}", r.id);
                        }
                        if registry.request_cancel(r.id) {
                            cancelled.insert(r.id);
                        }
                    }
                }
                done.store(true, Ordering::Relaxed);
                (reported, cancelled)
            });
            let scanned = scanner.join().expect("no panic");
            let registered: Vec<_> = runners
                .into_iter()
                .flat_map(|r| r.join().expect("no panic"))
                .collect();
            (registered, scanned)
        });
        assert!(
            cancelled.len() >= 500,
            "{} cancels in 20 s",
            cancelled.len()
        );
        let reused = registered
            .iter()
            .filter(|(id, _, _)| *id >> super::super::state::KEY_BITS > 0)
            .count();
        assert!(reused > 0, "no entry was reused");

        let objects: HashMap<u64, ObjectKey> = registered
            .iter()
            .map(|(id, object, _)| (*id, object.clone()))
            .collect();
        assert_eq!(objects.len(), registered.len(), "ids are unique");
        for (id, object) in &reported {
            assert_eq!(objects.get(id), Some(object), "reconcile {id}");
        }
        for (id, _, cancel_seen) in &registered {
            assert!(!cancel_seen || cancelled.contains(id), "reconcile {id}");
        }
        let ended: Vec<u64> = registry
            .take_ended()
            .iter()
            .map(|e| e.reconcile.id)
            .collect();
        let ended_set: HashSet<u64> = ended.iter().copied().collect();
        assert_eq!(ended.len(), ended_set.len(), "each end queued once");
        assert_eq!(
            ended_set,
            reported.keys().copied().collect::<HashSet<_>>(),
            "the ends queued are those of the reconciles reported hung"
        );
        assert!(registry.is_empty());
    }

    #[test]
    fn a_threads_spare_leaves_the_map_with_the_thread() {
        let registry = Registry::new(Duration::from_secs(60));
        let handle = registry.controller("web", "Widget");
        std::thread::spawn(move || drop(handle.register(ObjectKey::cluster("a"))))
            .join()
            .expect("no panic");
        assert_eq!(registry.shared.in_flight.len(), 0);
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
