//! What the guard's cheaper hot path must still do: wake a reconcile cancelled while it was being polled, and date polls no earlier than the start nor later than now.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use reconcile_watchdog::guard::{self, ObjectKey, PollState, Registry};

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

/// Pending on the first poll after waking itself, then returns the registry's view of
/// itself as seen from inside its second poll.
struct LooksAtItself {
    registry: Registry,
    polled: bool,
}

impl Future for LooksAtItself {
    type Output = Result<Vec<guard::InFlight>, ()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.polled {
            return Poll::Ready(Ok(self.registry.snapshot()));
        }
        self.polled = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[tokio::test]
async fn poll_times_are_never_before_the_start_nor_after_now() {
    for _ in 0..100 {
        let registry = Registry::new(Duration::from_secs(60));
        let reconcile = LooksAtItself {
            registry: registry.clone(),
            polled: false,
        };
        let seen = registry
            .controller("web", "Widget")
            .guard(ObjectKey::cluster("a"), reconcile)
            .await
            .expect("not cancelled")
            .expect("ok");
        let now = Instant::now();
        let me = &seen[0];
        assert_eq!(me.polls, 2);
        let PollState::InPoll { since } = me.poll else {
            panic!("seen from inside a poll: {:?}", me.poll);
        };
        assert_eq!(me.last_poll_began, Some(since));
        assert!(since >= me.started, "a poll time before the start");
        assert!(since <= now, "a poll time in the future");
    }
}

#[tokio::test]
async fn the_first_poll_is_dated_by_the_start() {
    let registry = Registry::new(Duration::from_secs(60));
    let stuck = registry.controller("web", "Widget").guard(
        ObjectKey::cluster("a"),
        std::future::pending::<Result<(), ()>>(),
    );
    let mut stuck = Box::pin(stuck);
    assert!(futures::poll!(stuck.as_mut()).is_pending());
    let seen = registry.snapshot();
    assert_eq!(seen[0].polls, 1);
    assert_eq!(seen[0].poll, PollState::Awaiting);
    assert_eq!(seen[0].last_poll_began, Some(seen[0].started));
}
