//! Timed guards around reconciles, and the registry of those in flight.
//!
//! Registering a reconcile puts one entry into a [`Registry`]; the [`Guard`] that
//! registration returns ends it on every exit path (completion, error, panic, or the
//! future being dropped). [`Guarded`] wraps a reconcile future and records, per poll,
//! what the monitor needs to tell an await that never woke from a poll that never
//! returned. The hot path is a few atomics per reconcile and per poll: no timer, no lock
//! held across an await, no allocation and no map insertion or removal (an entry that
//! ended unshared stays in the map, idle, for its thread's next reconcile of its
//! controller).

pub(crate) mod clock;
mod controller;
mod current;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod deadlines;
mod entry;
mod fanout;
mod guarded;
mod handle;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod map;
mod observer;
mod reconcile;
mod reconcile_guard;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
pub(crate) mod registry;
mod spares;
mod state;
mod sync;
#[cfg(test)]
mod tests;
mod thread;
mod waits;

pub use deadlines::Deadlines;
// The default near-miss share, a scan's counts and the registry's hasher: the crate's
// own; this repository's benchmarks reach them through `crate::internals`.
pub(crate) use deadlines::NEAR_MISS_SHARE;
#[cfg(feature = "_kube")]
pub(crate) use entry::Entry;
pub use fanout::Fanout;
pub use guarded::{Error, Guarded};
pub use handle::ControllerHandle;
pub(crate) use map::BuildIdHasher;
pub use observer::{ControllerObserver, Ended, LateEnd, Observer};
pub use reconcile::{InFlight, ObjectKey, Outcome, PollState};
pub use reconcile_guard::Guard;
#[cfg_attr(not(test), allow(unused_imports))]
pub(crate) use registry::ControllerCounts;
pub use registry::Registry;
pub use thread::ThreadInfo;
#[cfg(test)]
pub(crate) use thread::kernel_tid;
pub(crate) use thread::offer_label;
#[cfg(all(feature = "task-dump", tokio_unstable, target_os = "linux"))]
pub(crate) use thread::task_id_number;
pub(crate) use thread::tids_of_runtime;
// What the kube integration's request layer uses.
#[cfg(feature = "_kube")]
pub(crate) use current::{attribute_requests, current_entry};
#[cfg(feature = "_kube")]
pub(crate) use waits::Outgoing;
pub use waits::{RequestWait, Waiting};
