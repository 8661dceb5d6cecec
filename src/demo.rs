//! The synthetic workload of `demo`: a few controllers reconciling many objects under
//! the real watchdog, one of whose reconciles hangs on purpose.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use rand::Rng;

use reconcile_watchdog::guard::{ControllerHandle, ObjectKey};
use reconcile_watchdog::{Builder, watchdog};

/// Errors of the demo.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The demo's runtime did not start.
    #[error("failed to start the demo runtime")]
    Runtime(#[source] std::io::Error),
    /// The watchdog did not start.
    #[error(transparent)]
    Watchdog(#[from] watchdog::Error),
}

/// How the demo's hanging reconcile hangs.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum HangKind {
    /// Awaits a future that is never woken, in an await labelled
    /// "waiting for the cert issuer".
    Await,
    /// Wakes from a short sleep, then blocks inside its poll on a std mutex another
    /// thread holds.
    Block,
    /// Wakes from a short sleep, then spins inside its poll without yielding.
    Spin,
    /// Blocks every worker of the runtime at once.
    Wedge,
    /// Does not hang (for load tests).
    None,
}

impl HangKind {
    /// The flag value naming this kind.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Await => "await",
            Self::Block => "block",
            Self::Spin => "spin",
            Self::Wedge => "wedge",
            Self::None => "none",
        }
    }
}

/// What `demo` runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// When the hang begins.
    pub hang_after: Duration,
    /// How it hangs.
    pub hang_kind: HangKind,
    /// When it is released (never by default).
    pub hang_for: Option<Duration>,
    /// How many times it hangs, one after another (each `hang_after` the previous
    /// release); more than once only with `hang_for`.
    pub hang_times: u32,
    /// How long the demo runs (until stopped by default).
    pub duration: Option<Duration>,
    /// Objects per controller.
    pub objects: u32,
    /// Every this many reconciles of `deployment-scaler`, one runs 85 % of its deadline:
    /// a near miss (0: never).
    pub near_miss_every: u32,
}

/// The controller whose reconciles `near_miss_every` slows down.
const SLOW_CONTROLLER: usize = 1;

/// The synthetic controllers: name, kind, object name prefix.
const CONTROLLERS: [(&str, &str, &str); 3] = [
    ("configmap-sync", "ConfigMap", "config"),
    ("deployment-scaler", "Deployment", "web"),
    ("cert-renewer", "Certificate", "cert"),
];
/// The controller and object index whose reconcile hangs.
const HUNG_CONTROLLER: usize = 2;
const HUNG_OBJECT: u32 = 7;
const NAMESPACE: &str = "demo";
const WORKERS: usize = 4;
/// Reconciles in flight per controller at once.
const CONCURRENCY: usize = 4;

/// Runs the demo until `wait` returns (a signal, or the end of `--duration`).
pub fn run(builder: Builder, options: &DemoOptions, wait: impl FnOnce()) -> Result<(), Error> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .thread_name("demo-worker")
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    let watchdog = builder.watch_runtime(runtime.handle().clone()).start()?;
    let probe = watchdog.probe_address().map(loopback);
    let metrics = watchdog.metrics_address().map(loopback);
    let debug = watchdog.debug_address().map(loopback);

    let hung = &CONTROLLERS[HUNG_CONTROLLER];
    println!(
        "reconcile-watchdog demo: {} controllers x {} objects; {} {NAMESPACE}/{}-{HUNG_OBJECT} hangs ({}) after {}",
        CONTROLLERS.len(),
        options.objects,
        hung.0,
        hung.2,
        options.hang_kind.as_str(),
        humantime::format_duration(options.hang_after),
    );
    if let Some(addr) = probe {
        println!("probes: http://{addr}/healthz?verbose http://{addr}/readyz?verbose");
    }
    match debug {
        Some(addr) => {
            println!("debug: http://{addr}/debug/reconciles");
            println!(
                "deadlines: http://{addr}/debug/deadlines (reconcile-watchdog deadlines --from http://{addr})"
            );
        }
        None => println!("debug: off"),
    }
    match metrics {
        Some(addr) => println!("metrics: http://{addr}/metrics"),
        None => println!("metrics: off"),
    }

    let handles: Vec<ControllerHandle> = CONTROLLERS
        .iter()
        .map(|(name, kind, _)| watchdog.registry().controller(name, kind))
        .collect();
    let counters: Arc<Vec<AtomicU64>> =
        Arc::new(CONTROLLERS.iter().map(|_| AtomicU64::new(0)).collect());
    let hanging = Arc::new(AtomicBool::new(false));
    for (index, handle) in handles.iter().enumerate() {
        runtime.spawn(controller_loop(
            handle.clone(),
            index,
            options.objects,
            Arc::clone(&counters),
            Arc::clone(&hanging),
            if index == SLOW_CONTROLLER {
                options.near_miss_every
            } else {
                0
            },
        ));
    }
    runtime.spawn(progress(Arc::clone(&counters)));
    if options.hang_kind != HangKind::None {
        let handle = handles[HUNG_CONTROLLER].clone();
        let (kind, after, hang_for) = (options.hang_kind, options.hang_after, options.hang_for);
        let times = if hang_for.is_some() {
            options.hang_times
        } else {
            1
        };
        let spawner = runtime.handle().clone();
        runtime.spawn(async move {
            for _ in 0..times {
                tokio::time::sleep(after).await;
                hanging.store(true, Ordering::SeqCst);
                inject_hang(&spawner, &handle, kind, hang_for);
                // Released by then (a wedged runtime sleeps longer: that is its point).
                tokio::time::sleep(hang_for.unwrap_or_default()).await;
            }
        });
    }

    wait();
    watchdog.health().shutdown.begin();
    // The watchdog first: it writes the termination message if liveness fails.
    drop(watchdog);
    runtime.shutdown_background(); // hung tasks never finish: not waited for
    Ok(())
}

/// `0.0.0.0` and `::` are where the server listens, not where a user can browse.
fn loopback(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

fn object(index: usize, n: u32) -> ObjectKey {
    ObjectKey::namespaced(NAMESPACE, &format!("{}-{n}", CONTROLLERS[index].2))
}

/// Reconciles every object in turn, `CONCURRENCY` at a time, each on a task of its own
/// (as a kube-runtime controller would), forever.
async fn controller_loop(
    handle: ControllerHandle,
    index: usize,
    objects: u32,
    counters: Arc<Vec<AtomicU64>>,
    hanging: Arc<AtomicBool>,
    near_miss_every: u32,
) {
    let mut in_flight = tokio::task::JoinSet::new();
    // 85 % of the deadline: past the default near-miss threshold, short of a hang.
    let near_miss = handle.deadline().mul_f64(0.85);
    let mut started = 0_u32;
    for n in (0..objects).cycle() {
        // The hung object is not reconciled again while its reconcile hangs, just as
        // kube-runtime never runs two reconciles of one object at once.
        if index == HUNG_CONTROLLER && n == HUNG_OBJECT && hanging.load(Ordering::Relaxed) {
            tokio::task::yield_now().await;
            continue;
        }
        while in_flight.len() >= CONCURRENCY {
            in_flight.join_next().await;
        }
        started = started.wrapping_add(1);
        let slow =
            (near_miss_every > 0 && started.is_multiple_of(near_miss_every)).then_some(near_miss);
        let reconcile = handle.guard(object(index, n), synthetic_reconcile(slow));
        let counters = Arc::clone(&counters);
        in_flight.spawn(async move {
            if let Ok(_result) = reconcile.await {
                counters[index].fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

/// A few milliseconds of pretend API calls (or `slow`, when given); one in twenty fails.
async fn synthetic_reconcile(slow: Option<Duration>) -> Result<(), String> {
    let (millis, fail) = {
        let mut rng = rand::rng();
        (rng.random_range(5..50), rng.random_ratio(1, 20))
    };
    tokio::time::sleep(slow.unwrap_or(Duration::from_millis(millis))).await;
    if fail {
        Err("synthetic conflict".into())
    } else {
        Ok(())
    }
}

/// Logs how many reconciles each controller has completed, every two seconds.
async fn progress(counters: Arc<Vec<AtomicU64>>) {
    let mut ticks = tokio::time::interval(Duration::from_secs(2));
    loop {
        ticks.tick().await;
        for (index, (name, _, _)) in CONTROLLERS.iter().enumerate() {
            tracing::info!(
                target: "reconcile_watchdog::demo",
                controller = name,
                completed = counters[index].load(Ordering::Relaxed),
                "progress"
            );
        }
    }
}

/// What holds a hang: released by a plain thread after `hang_for`, never without it.
struct Release {
    released: AtomicBool,
    notify: tokio::sync::Notify,
    lock: Mutex<()>,
}

fn inject_hang(
    spawner: &tokio::runtime::Handle,
    handle: &ControllerHandle,
    kind: HangKind,
    hang_for: Option<Duration>,
) {
    let release = Arc::new(Release {
        released: AtomicBool::new(false),
        notify: tokio::sync::Notify::new(),
        lock: Mutex::new(()),
    });
    // The lock holder: takes the lock now, lets go (and releases everything) later.
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    {
        let release = Arc::clone(&release);
        let spawned = std::thread::Builder::new()
            .name("demo-lock-holder".into())
            .spawn(move || {
                let held = release.lock.lock().unwrap_or_else(|p| p.into_inner());
                let _ = locked_tx.send(());
                match hang_for {
                    Some(d) => std::thread::sleep(d),
                    None => loop {
                        std::thread::park();
                    },
                }
                release.released.store(true, Ordering::SeqCst);
                drop(held);
                release.notify.notify_waiters();
            });
        if spawned.is_err() {
            tracing::error!("demo: could not start the lock holder; no hang injected");
            return;
        }
    }
    let _ = locked_rx.recv();

    let victims = if kind == HangKind::Wedge {
        WORKERS as u32
    } else {
        1
    };
    for v in 0..victims {
        let key = object(HUNG_CONTROLLER, HUNG_OBJECT + v);
        tracing::warn!(
            target: "reconcile_watchdog::demo",
            controller = handle.name(),
            object = %key,
            hang_kind = kind.as_str(),
            "injecting a hang"
        );
        let release = Arc::clone(&release);
        let hang = async move {
            match kind {
                // Named, as an operator's author names the awaits worth naming: the
                // hang report says which one it waits in.
                HangKind::Await => {
                    reconcile_watchdog::label(AWAIT_LABEL, await_forever(&release)).await;
                }
                // Woken by tokio's time driver first, as a reconcile is woken by its
                // API response through the I/O driver: the worker that ran the driver
                // runs the reconcile and blocks, and nobody else drives timers and
                // I/O unless the watchdog wakes an idle worker.
                HangKind::Block => {
                    tokio::time::sleep(DRIVER_WAKE).await;
                    take_config_lock(&release);
                }
                HangKind::Spin => {
                    tokio::time::sleep(DRIVER_WAKE).await;
                    spin_until_released(&release);
                }
                HangKind::Wedge => take_config_lock(&release),
                HangKind::None => {}
            }
            Ok::<(), String>(())
        };
        spawner.spawn(handle.guard(key, hang));
    }
}

/// The short sleep a `block` or `spin` hang awaits before it blocks its worker.
const DRIVER_WAKE: Duration = Duration::from_millis(10);

/// The label of the `await` hang's await.
pub const AWAIT_LABEL: &str = "waiting for the cert issuer";

async fn await_forever(release: &Release) {
    let notified = release.notify.notified();
    if !release.released.load(Ordering::SeqCst) {
        notified.await;
    }
}

/// Blocks the worker thread in the kernel, as a reconcile that takes a std lock held
/// elsewhere would.
#[inline(never)]
fn take_config_lock(release: &Release) {
    drop(release.lock.lock().unwrap_or_else(|p| p.into_inner()));
}

/// Burns the worker thread without ever yielding, as a runaway loop would.
#[inline(never)]
fn spin_until_released(release: &Release) {
    let started = Instant::now();
    let mut spins = 0_u64;
    while !release.released.load(Ordering::Relaxed) {
        spins = spins.wrapping_add(1);
        std::hint::spin_loop();
    }
    tracing::debug!(spins, elapsed = ?started.elapsed(), "spin released");
}
