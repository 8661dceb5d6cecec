//! Workloads shared by the criterion benches and the load program: one reconcile done four ways, and a registry with many reconciles in flight.

use std::future::Future;
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures::task::AtomicWaker;
use reconcile_watchdog::guard::{
    ControllerHandle, Deadlines, Fanout, Guarded, InFlight, ObjectKey, Observer, Registry,
};
use reconcile_watchdog::health::Health;
use reconcile_watchdog::internals::deadlines::Advisor;
use reconcile_watchdog::internals::{
    BuildIdHasher, Config, MetricsInternals, NEAR_MISS_SHARE, RegistryInternals, Verdict,
};
use reconcile_watchdog::metrics::Metrics;

/// The deadline every benchmarked reconcile gets: far away, so none is ever overdue.
pub const DEADLINE: Duration = Duration::from_secs(300);

/// The registry's shard count (`guard::map::SHARDS`, private to the crate).
const REGISTRY_SHARDS: usize = 256;

/// How one reconcile is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The future alone: the cost of the reconcile itself.
    Unguarded,
    /// Under the watchdog's guard (`ControllerHandle::guard`), with what `run` installs:
    /// the deadline advisor and the metrics as the registry's observers, near misses on,
    /// and a request layer, so that each guard publishes its reconcile to the thread
    /// while it polls. The guard as it ships. (A request layer turns that on for the
    /// whole process: the load program's `count` makes one for this variant alone.)
    Guarded,
    /// The shipped guard without a request layer (an operator that does not add one).
    GuardedNoRequests,
    /// The guard with the advisor but no metrics (`run --metrics-bind-address 0`).
    GuardedNoMetrics,
    /// The guard with the metrics but no advisor (no setting does this: it shows the
    /// advisor's own cost).
    GuardedNoAdvisor,
    /// The guard on a registry that tells no observer (`Registry::new`).
    GuardedBare,
    /// The future plus a bare DashMap insert and remove of an entry like the guard's:
    /// the least any registry of in-flight reconciles can cost.
    Floor,
    /// Under `tokio::time::timeout`: a timer per reconcile.
    Timeout,
}

impl Variant {
    /// The four ways compared in every table, in table order.
    pub const ALL: [Self; 4] = [Self::Unguarded, Self::Guarded, Self::Floor, Self::Timeout];

    /// The guard with one diagnostic or another off, to show what each costs.
    pub const PARTS_OFF: [Self; 4] = [
        Self::GuardedNoRequests,
        Self::GuardedNoMetrics,
        Self::GuardedNoAdvisor,
        Self::GuardedBare,
    ];

    /// Every variant, by name.
    #[allow(dead_code)] // The load program's, not the criterion benches'.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain(Self::PARTS_OFF)
            .find(|v| v.name() == name)
    }

    /// The name used in bench ids and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unguarded => "unguarded",
            Self::Guarded => "guarded",
            Self::GuardedNoRequests => "guarded_no_requests",
            Self::GuardedNoMetrics => "guarded_no_metrics",
            Self::GuardedNoAdvisor => "guarded_no_advisor",
            Self::GuardedBare => "guarded_bare",
            Self::Floor => "floor",
            Self::Timeout => "timeout",
        }
    }
}

/// What the no-op reconcile does before it returns `Ok(())`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// Returns on its first poll.
    Ready,
    /// Returns `Pending` once, then `Ok(())`: a reconcile that awaits once. This is the
    /// shape that makes `timeout` arm its timer, as every real reconcile would.
    YieldOnce,
}

impl Shape {
    /// Both shapes.
    pub const ALL: [Self; 2] = [Self::Ready, Self::YieldOnce];

    /// The name used in bench ids and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::YieldOnce => "yield_once",
        }
    }
}

/// The no-op reconcile.
#[derive(Debug)]
pub struct NoOp {
    pending: bool,
}

impl NoOp {
    /// A no-op of `shape`.
    pub fn new(shape: Shape) -> Self {
        Self {
            pending: shape == Shape::YieldOnce,
        }
    }
}

impl Future for NoOp {
    type Output = Result<(), ()>;

    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        if std::mem::take(&mut self.pending) {
            // The driver below polls again at once, so no wake-up is arranged.
            Poll::Pending
        } else {
            Poll::Ready(Ok(()))
        }
    }
}

/// Polls `future` with a no-op waker until it is ready: the same driver for every
/// variant, with no executor cost on top.
pub fn drive<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
    }
}

/// What the floor's entries share per controller, as the registry's entries share one
/// `guard::registry::Controller`; only its deadline is read (by the floor's scan).
#[allow(dead_code)] // Only cloned into entries.
pub struct FloorController {
    name: Arc<str>,
    kind: Arc<str>,
    deadline: Duration,
}

/// The floor's entry: the same fields as the guard's registry entry (`guard::entry::Entry`,
/// private to the crate; keep the two in step), so the allocation has the same size and
/// the same two `Arc`s (controller and object) are cloned into it and the same start
/// time is read, but nothing is recorded per poll. It goes into a map configured like
/// the registry's (same key, hasher and shard count, a value of the same size).
#[allow(dead_code)] // Only built, inserted and removed: that is the point.
pub struct FloorEntry {
    id: u64,
    controller: Arc<FloorController>,
    object: ObjectKey,
    started: Instant,
    /// The registry's epoch on the precise and the coarse clock.
    epoch: (Instant, u64),
    counters: [AtomicU64; 5],
    flags: [AtomicBool; 2],
    waker: AtomicWaker,
}

/// The floor's map value: the same size as the registry's (`guard::registry::Slot`:
/// when the reconcile started, its controller's address, the entry).
#[allow(dead_code)] // Only inserted and removed.
pub struct FloorSlot {
    started: Instant,
    controller: usize,
    entry: Arc<FloorEntry>,
}

impl FloorSlot {
    fn new(entry: FloorEntry) -> Self {
        Self {
            started: entry.started,
            controller: Arc::as_ptr(&entry.controller) as usize,
            entry: Arc::new(entry),
        }
    }
}

/// The least a scan can do: `len` entries like the registry's in a map like the
/// registry's, and a pass over them that only asks each whether it is overdue, copying
/// nothing. The reference for the monitor's scan.
pub struct FloorScan {
    map: DashMap<u64, FloorSlot, BuildIdHasher>,
}

impl FloorScan {
    /// `len` entries of distinct objects.
    pub fn new(len: usize) -> Self {
        let ops = Ops::new();
        let map = DashMap::with_hasher_and_shard_amount(BuildIdHasher::default(), REGISTRY_SHARDS);
        for id in 0..len as u64 {
            let mut entry = ops.floor_entry(id);
            entry.object = ObjectKey::namespaced("default", &format!("object-{id}"));
            entry.started = Instant::now();
            map.insert(id, FloorSlot::new(entry));
        }
        Self { map }
    }

    /// How many entries are overdue at `now`.
    pub fn count_overdue(&self, now: Instant) -> usize {
        self.map
            .iter()
            .filter(|e| {
                let entry = &e.entry;
                now.saturating_duration_since(entry.started) > entry.controller.deadline
            })
            .count()
    }
}

/// One reconcile, run any of the four ways, again and again.
pub struct Ops {
    /// The shipped guard's controller, then each with a part off (see [`Variant`]).
    handle: ControllerHandle,
    no_metrics: ControllerHandle,
    no_advisor: ControllerHandle,
    bare: ControllerHandle,
    controller: Arc<FloorController>,
    object: ObjectKey,
    floor: DashMap<u64, FloorSlot, BuildIdHasher>,
    next_floor_id: AtomicU64,
    epoch: Instant,
    runtime: tokio::runtime::Runtime,
}

impl Ops {
    /// A fresh registry, floor map and runtime (two workers, as a small operator has).
    pub fn new() -> Self {
        let advisor = || Advisor::new() as Arc<dyn Observer>;
        let metrics = || Metrics::new(Arc::new(Health::new())) as Arc<dyn Observer>;
        // As `Watchdog::start` builds it: near misses on, advisor first.
        let registry = |observers: Fanout| {
            Registry::with_observers(
                Deadlines::new(DEADLINE).near_miss_share(Some(NEAR_MISS_SHARE)),
                observers,
            )
            .controller("bench", "ConfigMap")
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .expect("a tokio runtime for the timeout variant");
        Self {
            handle: registry(Fanout::new().with(advisor()).with(metrics())),
            no_metrics: registry(Fanout::new().with(advisor())),
            no_advisor: registry(Fanout::new().with(metrics())),
            bare: Registry::new(DEADLINE).controller("bench", "ConfigMap"),
            controller: Arc::new(FloorController {
                name: "bench".into(),
                kind: "ConfigMap".into(),
                deadline: DEADLINE,
            }),
            object: ObjectKey::namespaced("default", "bench-object"),
            floor: DashMap::with_hasher_and_shard_amount(BuildIdHasher::default(), REGISTRY_SHARDS),
            next_floor_id: AtomicU64::new(1),
            epoch: Instant::now(),
            runtime,
        }
    }

    /// Enters the runtime on this thread, as a reconcile's task would be; the timeout
    /// variant needs it. Held across many runs so that entering is not measured.
    pub fn enter(&self) -> tokio::runtime::EnterGuard<'_> {
        self.runtime.enter()
    }

    /// Runs one reconcile of `shape` the `variant` way. Panics on an unexpected result,
    /// so a broken variant cannot pass for a fast one.
    pub fn run(&self, variant: Variant, shape: Shape) {
        let ok = match variant {
            Variant::Unguarded => drive(NoOp::new(shape)).is_ok(),
            Variant::Guarded
            | Variant::GuardedNoRequests
            | Variant::GuardedNoMetrics
            | Variant::GuardedNoAdvisor
            | Variant::GuardedBare => matches!(
                drive(
                    self.handle_of(variant)
                        .guard(self.object.clone(), NoOp::new(shape))
                ),
                Ok(Ok(()))
            ),
            Variant::Floor => {
                let id = self.next_floor_id.fetch_add(1, Ordering::Relaxed);
                self.floor.insert(id, FloorSlot::new(self.floor_entry(id)));
                let result = drive(NoOp::new(shape));
                self.floor.remove(&id);
                result.is_ok()
            }
            Variant::Timeout => matches!(
                drive(tokio::time::timeout(DEADLINE, NoOp::new(shape))),
                Ok(Ok(()))
            ),
        };
        assert!(ok, "{} {} did not return Ok", variant.name(), shape.name());
    }

    fn handle_of(&self, variant: Variant) -> &ControllerHandle {
        match variant {
            Variant::GuardedNoMetrics => &self.no_metrics,
            Variant::GuardedNoAdvisor => &self.no_advisor,
            Variant::GuardedBare => &self.bare,
            _ => &self.handle,
        }
    }

    fn floor_entry(&self, id: u64) -> FloorEntry {
        FloorEntry {
            id,
            controller: Arc::clone(&self.controller),
            object: self.object.clone(),
            // The entry records when its reconcile started, as the registry's does: that
            // clock read is part of any registry of reconciles with deadlines.
            started: Instant::now(),
            epoch: (self.epoch, 0),
            counters: Default::default(),
            flags: Default::default(),
            waker: AtomicWaker::new(),
        }
    }

    /// Whether every reconcile has left the registries and the floor map.
    pub fn is_idle(&self) -> bool {
        [&self.handle, &self.no_metrics, &self.no_advisor, &self.bare]
            .iter()
            .all(|h| h.registry().is_empty())
            && self.floor.is_empty()
    }
}

/// The reconcile that never finishes, as the in-flight set holds it.
pub type Stuck = Guarded<std::future::Pending<Result<(), ()>>>;

/// A registry with `len` reconciles in flight, each polled once (so each has a thread
/// and a poll count, as real ones do), and the monitor's scan over it.
pub struct InFlightSet {
    /// The registry they are in.
    pub registry: Registry,
    /// Held, never read: dropping one would end it.
    #[allow(dead_code)]
    reconciles: Vec<Stuck>,
    snapshot: Vec<InFlight>,
    counts: reconcile_watchdog::internals::ControllerCounts,
    verdict: Verdict,
}

impl InFlightSet {
    /// `len` reconciles of distinct objects across four controllers.
    pub fn new(len: usize) -> Self {
        let registry = Registry::new(DEADLINE);
        let handles: Vec<_> = (0..4)
            .map(|c| registry.controller(&format!("controller-{c}"), "ConfigMap"))
            .collect();
        let mut cx = Context::from_waker(Waker::noop());
        let reconciles = (0..len)
            .map(|i| {
                let object = ObjectKey::namespaced("default", &format!("object-{i}"));
                let mut reconcile =
                    handles[i % handles.len()].guard(object, std::future::pending());
                assert!(Pin::new(&mut reconcile).poll(&mut cx).is_pending());
                reconcile
            })
            .collect();
        assert_eq!(registry.len(), len);
        Self {
            registry,
            reconciles,
            snapshot: Vec::with_capacity(len),
            counts: Vec::new(),
            verdict: Verdict::new(Config::default()),
        }
    }

    /// What a runtime rescue copies: the reconciles inside a poll (none here: each
    /// awaits). Returns how many it copied.
    #[allow(dead_code)] // The criterion benches', not the load program's.
    pub fn in_poll(&mut self) -> usize {
        self.registry
            .in_poll_into(Instant::now(), Duration::ZERO, &mut self.snapshot);
        self.snapshot.len()
    }

    /// One monitor scan: the snapshot and the verdict, as the monitor thread does them.
    /// Returns how many reconciles it saw.
    pub fn scan(&mut self) -> usize {
        let now = Instant::now();
        self.registry
            .scan_into(now, false, &mut self.snapshot, &mut self.counts);
        let decision = self
            .verdict
            .step(&self.snapshot, self.registry.take_ended(), None, now);
        assert!(decision.overdue.is_empty(), "nothing is overdue");
        self.counts.iter().map(|(_, n)| n).sum()
    }
}

/// Whether the bench binary runs for real (`cargo bench`) rather than once each as a
/// test (`cargo test --all-targets`), which must stay quick.
pub fn benchmarking() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test")
}

/// Runs `iters` reconciles on each of `threads` threads started together, each pinned
/// to a core of its own; the slowest thread's time is the sample, so contention shows
/// as a longer time per reconcile, and two threads never share one core.
pub fn run_on_threads(
    ops: &Ops,
    threads: usize,
    iters: u64,
    variant: Variant,
    shape: Shape,
) -> Duration {
    let start_together = Barrier::new(threads);
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    assert!(
        cores.len() >= threads,
        "{threads} threads need as many cores; this machine offers {}",
        cores.len()
    );
    std::thread::scope(|s| {
        let workers: Vec<_> = cores[..threads]
            .iter()
            .map(|&core| {
                let start_together = &start_together;
                s.spawn(move || {
                    assert!(core_affinity::set_for_current(core), "pinning to {core:?}");
                    let _runtime = ops.enter();
                    // One unmeasured run: a new thread's first guarded poll records its name.
                    ops.run(variant, shape);
                    start_together.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        ops.run(black_box(variant), black_box(shape));
                    }
                    start.elapsed()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a bench thread panicked"))
            .max()
            .unwrap_or_default()
    })
}
