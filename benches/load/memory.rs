//! Memory: bytes per in-flight guard, computed and measured, and resident memory across a million reconciles.

use std::mem::size_of;
use std::time::Duration;

use reconcile_watchdog::guard::{Guard, Guarded, ObjectKey, Registry};

use crate::support::{DEADLINE, FloorEntry, FloorSlot, NoOp};

/// What was computed and measured.
pub struct Memory {
    /// `size_of::<Guarded<NoOp>>()`: the wrapper, stored inline in the reconcile's task.
    pub guarded_inline: usize,
    /// Of which the guard itself.
    pub guard_inline: usize,
    /// The registry entry on the heap: its fields plus the `Arc`'s two counters.
    pub entry_heap: usize,
    /// The map's slot: key and `Arc` pointer, before the table's spare capacity.
    pub map_slot: usize,
    /// Reconciles held in flight for the measurement.
    pub in_flight: usize,
    /// Resident growth per in-flight guard (heap only: entry and map).
    pub measured_heap_per_guard: f64,
    /// Reconciles completed between the two resident readings.
    pub completed: usize,
    /// Resident bytes after warm-up.
    pub rss_start: u64,
    /// Resident bytes after `completed` more reconciles.
    pub rss_end: u64,
}

/// Resident set size of this process, from `/proc/self/status` (`VmRSS`, in kB).
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kb = status_field(&status, "VmRSS").expect("VmRSS in /proc/self/status");
    kb * 1024
}

/// The number in field `name` of a `/proc/.../status` text (without its `kB` unit).
pub fn status_field(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// First the leak check: `completed` guarded reconciles on a two-worker runtime,
/// spawned in batches of 1,000 tasks, between two resident readings taken after a
/// warm-up of `completed / 100`. Then `in_flight` guards held at once, with their keys
/// and the vector holding them allocated before the first reading, so the growth is
/// the registry's alone.
pub fn run(completed: usize, in_flight: usize) -> Memory {
    let (rss_start, rss_end) = leak_check(completed);

    let registry = Registry::new(DEADLINE);
    let handle = registry.controller("memory", "ConfigMap");
    let objects: Vec<_> = (0..in_flight)
        .map(|i| ObjectKey::namespaced("default", &format!("object-{i}")))
        .collect();
    let mut guards: Vec<Guard> = Vec::with_capacity(in_flight);
    let before = rss_bytes();
    guards.extend(objects.iter().map(|o| handle.register(o.clone())));
    let after = rss_bytes();
    assert_eq!(registry.len(), in_flight);
    drop(guards);
    assert!(registry.is_empty());

    #[allow(clippy::cast_precision_loss)]
    let measured_heap_per_guard = after.saturating_sub(before) as f64 / in_flight as f64;
    Memory {
        guarded_inline: size_of::<Guarded<NoOp>>(),
        guard_inline: size_of::<Guard>(),
        entry_heap: size_of::<FloorEntry>() + 2 * size_of::<usize>(),
        map_slot: size_of::<(u64, FloorSlot)>(),
        in_flight,
        measured_heap_per_guard,
        completed,
        rss_start,
        rss_end,
    }
}

fn leak_check(completed: usize) -> (u64, u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the reconciles");
    let registry = Registry::new(DEADLINE);
    let handle = registry.controller("memory", "ConfigMap");
    let run_batches = |count: usize| {
        runtime.block_on(async {
            for batch in 0..count.div_ceil(1000) {
                let tasks: Vec<_> = (0..1000.min(count - batch * 1000))
                    .map(|i| {
                        let object = ObjectKey::namespaced("default", &format!("object-{i}"));
                        tokio::spawn(handle.guard(object, async {
                            tokio::task::yield_now().await;
                            Ok::<_, ()>(())
                        }))
                    })
                    .collect();
                for task in tasks {
                    let result = task.await.expect("a reconcile task");
                    assert!(matches!(result, Ok(Ok(()))));
                }
            }
        });
    };
    run_batches(completed / 100);
    std::thread::sleep(Duration::from_millis(50));
    let start = rss_bytes();
    run_batches(completed);
    std::thread::sleep(Duration::from_millis(50));
    let end = rss_bytes();
    assert!(registry.is_empty(), "every reconcile left the registry");
    (start, end)
}
