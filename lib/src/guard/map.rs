//! The registry's map: a slot per entry under a key from a counter, sharded so that a
//! scan holds up few registrations, and what every clone of the registry shares.

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use dashmap::DashMap;

use super::deadlines::Deadlines;
use super::entry::{Entry, Epoch, KEY_MASK};
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
