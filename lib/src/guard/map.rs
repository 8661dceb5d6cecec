//! The registry's map: a slot per entry under a key from a counter, sharded so that a
//! scan holds up few registrations, and what every clone of the registry shares.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::time::Duration;

use dashmap::DashMap;

use super::controller::Controller;
use super::deadlines::Deadlines;
use super::entry::{Entry, Epoch, KEY_MASK};
use super::handle::Registration;
use super::observer::{Ended, Observer};

/// Shards of the in-flight map. A scan read-locks one shard at a time, which a
/// registration passes over (see `Shared::insert`) and a guard's removal waits for: with
/// 256 shards, 1/256 of a scan (DashMap's default on a 2-core machine is 8).
/// Registration costs the same with any count; the spare shards cost 32 KiB.
const SHARDS: usize = 256;

/// One map value: what a scan needs to pass over an on-time reconcile, kept inline so
/// that it does not follow the pointer to the entry (a cache miss per reconcile).
pub(super) struct Slot {
    /// When the entry's running reconcile started ([`clock`](super::clock)), or earlier:
    /// the start of its first reconcile, or of a later one a scan copied in. A later
    /// reconcile of the same entry starts later, so a slot that is on time by it is on
    /// time; the scan looks at the entry only past this (and then copies its start in).
    pub(super) started: AtomicU64,
    /// The address of the entry's `Controller`: compared to count per controller, never
    /// dereferenced (a clone of the `Arc` would cost two atomics per reconcile).
    pub(super) controller: usize,
    pub(super) entry: Arc<Entry>,
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

/// What every clone of the registry shares: the map, and what its guards and the
/// monitor need of the registry.
pub(super) struct Shared {
    pub(super) epoch: Epoch,
    pub(super) observers: Vec<Arc<dyn Observer>>,
    /// Written by every registration; on a cache line of its own (see `Controller`).
    pub(super) next_id: OwnLine<AtomicU64>,
    pub(super) in_flight: DashMap<u64, Slot, BuildIdHasher>,
    pub(super) deadlines: Deadlines,
    /// The ends of reconciles reported hung, queued by their guards for the monitor.
    /// std's unbounded channel is a lock-free list: a guard's send never waits for the
    /// monitor, and the monitor's receive waits for no send (but one caught between
    /// claiming its slot and writing it, a few instructions).
    pub(super) ended: mpsc::Sender<Ended>,
    /// Only the monitor takes ends; the lock is only ever tried (see `take_ended`).
    pub(super) ended_taken: Mutex<mpsc::Receiver<Ended>>,
    /// The controllers by name, one per deadline: what a handle asked for again is found
    /// here. Taken when a handle is asked for or its controller's last one dropped, and
    /// when the last `Registry` value drops; never by a reconcile, a scan, a scrape or
    /// a `Registry`'s clone (the monitor's).
    pub(super) named: Mutex<Named>,
    /// The `Registry` values alive: with none and no handle, no controller is kept.
    pub(super) registries: AtomicUsize,
}

/// How many controllers whose last handle was dropped a registry keeps, the latest
/// dropped: asked for again, one is the same controller (same series, same spares), so
/// a handle asked for per reconcile and dropped after it costs no new controller. The
/// oldest beyond this are forgotten, and their observers told.
pub(super) const RETIRED_KEPT: usize = 16;

/// The controllers of a registry by name.
#[derive(Default)]
pub(super) struct Named {
    /// Per name, a place per deadline.
    pub(super) places: HashMap<Arc<str>, Vec<Place>>,
    /// The places whose controller has no handle, oldest first: at most [`RETIRED_KEPT`].
    pub(super) retired: VecDeque<(Arc<str>, Duration)>,
}

/// One controller's place in the table.
pub(super) struct Place {
    pub(super) deadline: Duration,
    /// Kept here too, so that a controller outlives its handles while retired. (The
    /// controller holds the map: the table is emptied when nothing else holds it.)
    pub(super) controller: Arc<Controller>,
    /// Its handles' registration; dead while retired (or while its last handle drops).
    pub(super) live: Weak<Registration>,
}

impl Named {
    /// Whether a handle of any controller lives.
    pub(super) fn any_live(&self) -> bool {
        self.places
            .values()
            .flatten()
            .any(|place| place.live.strong_count() > 0)
    }

    /// Takes the place of `name` with `deadline` out of the table.
    pub(super) fn take(&mut self, name: &str, deadline: Duration) -> Option<Place> {
        let places = self.places.get_mut(name)?;
        let i = places.iter().position(|p| p.deadline == deadline)?;
        let place = places.swap_remove(i);
        if places.is_empty() {
            self.places.remove(name);
        }
        Some(place)
    }

    /// Takes every place out: what nothing can ask for any more.
    pub(super) fn take_all(&mut self) -> Vec<Place> {
        self.retired.clear();
        self.places.drain().flat_map(|(_, places)| places).collect()
    }
}

/// A value alone on its cache line.
#[repr(align(64))]
pub(super) struct OwnLine<T>(pub(super) T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// How many busy shards a registration passes over before it waits for one.
const BUSY_SHARDS_SKIPPED: usize = 4;

impl Shared {
    /// An empty map.
    pub(super) fn new(deadlines: Deadlines, observers: Vec<Arc<dyn Observer>>) -> Self {
        let (ended, ended_taken) = mpsc::channel();
        Self {
            epoch: Epoch::now(),
            observers,
            next_id: OwnLine(AtomicU64::new(1)),
            in_flight: DashMap::with_hasher_and_shard_amount(BuildIdHasher::default(), SHARDS),
            deadlines,
            ended,
            ended_taken: Mutex::new(ended_taken),
            named: Mutex::new(Named::default()),
            registries: AtomicUsize::new(0),
        }
    }

    /// Inserts `slot` under a fresh key, and returns the key.
    ///
    /// A scan read-locks one shard at a time; a registration that lands on that shard
    /// waits, and if the kernel has switched the scanner out meanwhile, for as long as
    /// another thread runs in its place (a time slice, milliseconds). The key is ours to
    /// choose, so a registration that finds its shard locked takes the next key instead,
    /// which hashes to another shard; only after several busy shards in a row does it wait.
    pub(super) fn insert(&self, slot: Slot) -> u64 {
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
