//! What every reconcile of one controller shares: its name, kind and deadline, its
//! observers, its in-flight count, and the registry's map its entries leave.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::time::Duration;

use super::fanout::Both;
use super::map::{OwnLine, Shared};
use super::observer::ControllerObserver;

/// What every reconcile of one controller shares, fixed when its handle is made.
///
/// Entries hold it and it holds the registry's map, so a guard reaches the map through
/// its entry. That is a reference cycle (map, entry, controller) only while the entry is
/// in the map, and the guard's drop takes it out.
///
/// Aligned to a cache line so that its fields, read by every reconcile, do not share
/// one with the `Arc`'s reference counts, which every reconcile writes: on two cores
/// that sharing made each read a miss.
#[repr(align(64))]
pub(crate) struct Controller {
    /// The map of the registry that made it.
    pub(super) map: Arc<Shared>,
    pub(crate) name: Arc<str>,
    pub(crate) kind: Arc<str>,
    pub(crate) deadline: Duration,
    /// An end after this many nanoseconds is told to the observer as late (near miss or
    /// worse).
    pub(super) late_after: u64,
    /// What the registry's observers resolved for this controller: the first, and the
    /// second (the others told after it, in pairs). The usual two (the advisor and the
    /// metrics) are told with one call each; behind one `Fanout` observer they took three.
    pub(super) observers: [Option<Arc<dyn ControllerObserver>>; 2],
    /// Its reconciles in flight: what a scan counts. The map cannot tell, as it also
    /// holds idle spare entries. Written by every reconcile, so on a line of its own.
    pub(super) in_flight: OwnLine<AtomicUsize>,
    /// An observer of its ends has panicked (logged once).
    pub(super) observer_panicked: AtomicBool,
    /// A handle was asked for with another kind (logged once).
    pub(super) other_kind_logged: AtomicBool,
}

impl Controller {
    pub(super) fn new(
        map: &Arc<Shared>,
        name: Arc<str>,
        kind: Arc<str>,
        deadline: Duration,
    ) -> Self {
        let mut resolved = map
            .observers
            .iter()
            .filter_map(|observer| observer.controller(&name, &kind));
        let first = resolved.next();
        let second = resolved.reduce(|first, then| Arc::new(Both(first, then)));
        Self {
            observers: [first, second],
            in_flight: OwnLine(AtomicUsize::new(0)),
            observer_panicked: AtomicBool::new(false),
            other_kind_logged: AtomicBool::new(false),
            map: Arc::clone(map),
            name,
            kind,
            deadline,
            late_after: u64::try_from(map.deadlines.late_after(deadline).as_nanos())
                .unwrap_or(u64::MAX),
        }
    }
}
