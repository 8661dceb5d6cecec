//! The registry, its handles, guards and spares together: registrations, ends, reuse,
//! scans and cancels, and what an observer's panic cannot break.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::entry::{KEY_MASK, key_of};
use super::observer::{ControllerObserver, Ended, Observer};
use super::reconcile::{ObjectKey, Outcome};
use super::registry::Registry;
use super::spares::SPARES_PER_THREAD;
use super::state::KEY_BITS;

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
        .filter(|(id, _, _)| *id >> KEY_BITS > 0)
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
