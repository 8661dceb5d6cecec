//! What the guard's cheaper hot path must still do: wake a reconcile cancelled while it was being polled, and date each poll when it began.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use reconcile_watchdog::guard::{self, ObjectKey, PollState, Registry};
use reconcile_watchdog::internals::RegistryInternals;

/// Asks the watchdog to cancel its own reconcile from inside its first poll, then
/// returns `Pending` without arranging any wake-up: only the guard can wake it.
struct CancelsItselfMidPoll {
    registry: Registry,
}

impl Future for CancelsItselfMidPoll {
    type Output = Result<(), ()>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        let id = self.registry.snapshot()[0].id;
        assert!(self.registry.request_cancel(id));
        Poll::Pending
    }
}

#[tokio::test]
async fn a_cancel_request_made_during_a_poll_still_wakes_the_reconcile() {
    let registry = Registry::new(Duration::from_secs(60));
    let reconcile = CancelsItselfMidPoll {
        registry: registry.clone(),
    };
    let guarded = registry
        .controller("web", "Widget")
        .guard(ObjectKey::cluster("a"), reconcile);
    let result = tokio::time::timeout(Duration::from_secs(10), tokio::spawn(guarded))
        .await
        .expect("the cancelled reconcile was woken and ended")
        .expect("the task did not panic");
    assert!(
        matches!(result, Err(guard::Error::Cancelled { .. })),
        "{result:?}"
    );
    assert!(registry.is_empty());
}

/// Sleeps in its first poll, notes the time, wakes itself and returns `Pending`; then
/// returns the registry's view of itself from inside its second poll, and when that
/// poll began at the latest.
struct LooksAtItself {
    registry: Registry,
    second_poll_after: Option<Instant>,
}

/// How long the first poll lasts: far longer than a coarse clock tick (1 to 10 ms), so
/// that a second poll dated by the start, or by the first poll, is seen as wrong.
const FIRST_POLL: Duration = Duration::from_millis(200);
/// How far a coarse stamp may be from the precise clock, either way, generously.
const COARSE_LAG: Duration = Duration::from_millis(50);

impl Future for LooksAtItself {
    type Output = Result<(Vec<guard::InFlight>, Instant, Instant), ()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(after) = self.second_poll_after {
            let inside = Instant::now();
            return Poll::Ready(Ok((self.registry.snapshot(), after, inside)));
        }
        std::thread::sleep(FIRST_POLL);
        self.second_poll_after = Some(Instant::now());
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[tokio::test]
async fn a_later_poll_is_dated_when_it_began() {
    for _ in 0..5 {
        let registry = Registry::new(Duration::from_secs(60));
        let reconcile = LooksAtItself {
            registry: registry.clone(),
            second_poll_after: None,
        };
        let (seen, after_first, inside_second) = registry
            .controller("web", "Widget")
            .guard(ObjectKey::cluster("a"), reconcile)
            .await
            .expect("not cancelled")
            .expect("ok");
        let me = &seen[0];
        assert_eq!(me.polls, 2);
        let PollState::InPoll { since } = me.poll else {
            panic!("seen from inside a poll: {:?}", me.poll);
        };
        assert_eq!(me.last_poll_began, Some(since));
        // Begun after the first poll ended, which was FIRST_POLL after the start, and
        // not after the look from inside it, each within the coarse clock's tick.
        assert!(
            since + COARSE_LAG >= after_first,
            "dated {:?} before the first poll ended",
            after_first - since
        );
        assert!(
            since >= me.started + FIRST_POLL - COARSE_LAG,
            "dated by the start"
        );
        assert!(
            since <= inside_second + COARSE_LAG,
            "dated {:?} after it was looked at",
            since - inside_second
        );
    }
}

/// How long a reconcile waits between its registration and its first poll, as kube's
/// runner and `tokio::spawn` queue it: far longer than a coarse clock tick.
const QUEUED: Duration = Duration::from_millis(200);

#[tokio::test]
async fn a_first_poll_is_dated_by_its_own_start_not_the_registration() {
    let registry = Registry::new(Duration::from_secs(60));
    let stuck = registry.controller("web", "Widget").guard(
        ObjectKey::cluster("a"),
        std::future::pending::<Result<(), ()>>(),
    );
    let mut stuck = Box::pin(stuck);
    std::thread::sleep(QUEUED);
    let before_poll = Instant::now();
    assert!(futures::poll!(stuck.as_mut()).is_pending());
    let after_poll = Instant::now();
    let seen = registry.snapshot();
    assert_eq!(seen[0].polls, 1);
    assert_eq!(seen[0].poll, PollState::Awaiting);
    let began = seen[0].last_poll_began.expect("polled once");
    // Within the coarse clock's lag of the poll itself, however long the machine took
    // to get there: not at the registration, QUEUED earlier.
    assert!(
        began + COARSE_LAG >= before_poll,
        "dated {:?} before the poll",
        before_poll - began
    );
    // (The epoch's coarse reading may trail its precise one by a tick, either way here.)
    assert!(began <= after_poll + COARSE_LAG, "dated after the poll");
    assert!(
        began >= seen[0].started + QUEUED - COARSE_LAG,
        "dated by the registration"
    );
}
