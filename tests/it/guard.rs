//! The guard leaves the registry on every exit path, and records what the monitor reads.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use reconcile_watchdog::guard::{
    self, ControllerObserver, ObjectKey, Observer, Outcome, PollState, Registry,
};
use reconcile_watchdog::internals::RegistryInternals;

/// Pending on the first poll (after waking itself), then `Ok` — a one-await reconcile.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

#[derive(Default)]
struct Counts([AtomicUsize; 5]);

/// Counts the ends of every controller.
struct Counting(Arc<Counts>);

impl Observer for Counting {
    fn controller(&self, _: &str, _: &str) -> Option<Arc<dyn ControllerObserver>> {
        Some(Arc::clone(&self.0) as Arc<dyn ControllerObserver>)
    }
}

impl ControllerObserver for Counts {
    fn finished(&self, outcome: Outcome, _: Duration) {
        let i = match outcome {
            Outcome::Ok => 0,
            Outcome::Error => 1,
            Outcome::Panic => 2,
            Outcome::Cancelled => 3,
            Outcome::Dropped => 4,
        };
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// The message of the panics the test below plans.
const PLANNED: &str = "planned panic of reconcile ";

fn is_planned_panic(info: &std::panic::PanicHookInfo<'_>) -> bool {
    let payload = info.payload();
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .is_some_and(|message| message.starts_with(PLANNED))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_reconciles_leave_the_registry_empty() {
    // The guard catches these panics; keep their 25,000 messages out of the output, and
    // only theirs: any other panic (another test's, or an assertion) still reports.
    let previous = Arc::new(std::panic::take_hook());
    {
        let previous = Arc::clone(&previous);
        std::panic::set_hook(Box::new(move |info| {
            if !is_planned_panic(info) {
                previous(info);
            }
        }));
    }
    let counts = Arc::new(Counts::default());
    let registry =
        Registry::with_observer(Duration::from_secs(60), Arc::new(Counting(counts.clone())));
    let web = registry.controller("web", "Widget");
    const N: usize = 100_000;

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..N {
        let key = ObjectKey::namespaced("ns", &format!("obj-{}", i % 1000));
        let guarded = web.guard(key, async move {
            YieldOnce(false).await;
            match i % 4 {
                0 => Ok(()),
                1 => Err("conflict"),
                2 => panic!("{PLANNED}{i}"),
                _ => std::future::pending().await,
            }
        });
        if i % 4 == 3 {
            // Dropped mid-flight: polled once (registered, pending), then abandoned.
            tasks.spawn(async move {
                let mut guarded = Box::pin(guarded);
                assert!((&mut guarded).now_or_never().is_none());
                drop(guarded);
            });
        } else {
            tasks.spawn(async move {
                match (i % 4, guarded.await) {
                    (0, Ok(Ok(()))) | (1, Ok(Err("conflict"))) => {}
                    (2, Err(guard::Error::Panicked { message })) => {
                        assert_eq!(message, format!("{PLANNED}{i}"));
                    }
                    (kind, other) => panic!("reconcile {i} of kind {kind} ended {other:?}"),
                }
            });
        }
        if tasks.len() >= 1000 {
            tasks.join_next().await.unwrap().unwrap();
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap();
    }
    // Back to the hook the test found (taking ours drops its clone of it).
    let _ = std::panic::take_hook();
    if let Ok(previous) = Arc::try_unwrap(previous) {
        std::panic::set_hook(previous);
    }

    assert!(registry.is_empty(), "{} entries leaked", registry.len());
    let seen: Vec<usize> = counts.0.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    assert_eq!(seen, vec![N / 4, N / 4, N / 4, 0, N / 4]);
}

#[tokio::test]
async fn a_future_dropped_before_its_first_poll_leaves_no_entry() {
    let registry = Registry::new(Duration::from_secs(60));
    let guarded = registry
        .controller("web", "Widget")
        .guard(ObjectKey::cluster("a"), async { Ok::<_, ()>(()) });
    assert_eq!(registry.len(), 1);
    drop(guarded);
    assert!(registry.is_empty());
}

#[tokio::test]
async fn a_cancel_request_ends_the_reconcile_at_its_next_poll() {
    let registry = Registry::new(Duration::from_secs(60));
    let guarded = registry.controller("web", "Widget").guard(
        ObjectKey::cluster("a"),
        std::future::pending::<Result<(), ()>>(),
    );
    let task = tokio::spawn(guarded);
    while registry.snapshot().first().is_none_or(|r| r.polls == 0) {
        tokio::task::yield_now().await;
    }
    let id = registry.snapshot()[0].id;
    assert!(registry.request_cancel(id));
    // The stored waker is woken, so the pending future is polled again and stops.
    let result = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(result, Err(guard::Error::Cancelled { .. })),
        "{result:?}"
    );
    assert!(registry.is_empty());
    assert!(!registry.request_cancel(id), "already gone");
}

#[tokio::test]
async fn polls_record_state_thread_and_task() {
    let registry = Registry::new(Duration::from_secs(60));
    let probe = registry.clone();
    let guarded =
        registry
            .controller("web", "Widget")
            .guard(ObjectKey::namespaced("ns", "a"), async move {
                // Inside a poll, the registry shows this reconcile as in-poll.
                let inside = probe.snapshot();
                YieldOnce(false).await;
                Ok::<_, ()>(inside)
            });
    let inside = tokio::spawn(guarded).await.unwrap().unwrap().unwrap();
    let seen = &inside[0];
    assert_eq!(seen.object.as_str(), "ns/a");
    assert!(matches!(seen.poll, PollState::InPoll { .. }));
    assert_eq!(seen.polls, 1);
    assert!(seen.task_id.is_some());
    assert!(seen.thread.is_some());
    assert!(registry.is_empty());
}

#[test]
fn a_scan_copies_only_what_the_verdict_acts_on_and_counts_the_rest() {
    let registry = Registry::new(Duration::from_secs(3600));
    let (web, db) = (
        registry.controller("web", "Widget"),
        registry.controller("db", "Widget"),
    );
    let _on_time: Vec<_> = (0..3)
        .map(|i| web.register(ObjectKey::cluster(&format!("w{i}"))))
        .collect();
    let _db = db.register(ObjectKey::cluster("d"));
    let late = registry
        .controller("late", "Widget")
        .with_deadline(Duration::ZERO)
        .register(ObjectKey::cluster("l"));
    let (mut out, mut counts) = (Vec::new(), Vec::new());
    registry.scan_into(
        std::time::Instant::now() + Duration::from_millis(1),
        false,
        &mut out,
        &mut counts,
    );
    assert_eq!(
        out.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![late.id()]
    );
    let mut counts: Vec<(String, usize)> =
        counts.iter().map(|(c, n)| (c.to_string(), *n)).collect();
    counts.sort();
    assert_eq!(
        counts,
        vec![("db".into(), 1), ("late".into(), 1), ("web".into(), 3)]
    );
}
