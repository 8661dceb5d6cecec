//! Named awaits: a label on an await inside a reconcile, named by a hang report that
//! finds the reconcile waiting in it.
//!
//! ```
//! # async fn issue_certificate() -> Result<(), ()> { Ok(()) }
//! # async fn reconcile() -> Result<(), ()> {
//! reconcile_watchdog::label("waiting for the cert issuer", issue_certificate()).await?;
//! # Ok(()) }
//! ```
//!
//! A reconcile that waits past its deadline inside that await is reported as
//! `waiting in the await labelled "waiting for the cert issuer"`; with several labels
//! pending, one inside another, the innermost is named. A label costs its await a
//! thread-local read after each pending poll, and the reconcile one lock when the
//! innermost pending label changes between its polls (`docs/performance.md`). Labels
//! are static strings so that naming one never allocates.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

/// Names `future` for the hang report of the guarded reconcile that awaits it.
pub fn label<F: Future>(label: &'static str, future: F) -> Labelled<F> {
    Labelled {
        inner: future,
        label,
    }
}

pin_project! {
    /// A future with a label: see [`label`](label()).
    #[must_use = "futures do nothing unless polled"]
    pub struct Labelled<F> {
        #[pin]
        inner: F,
        label: &'static str,
    }
}

impl<F: Future> Future for Labelled<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let polled = this.inner.poll(cx);
        if polled.is_pending() {
            // Any label inside this await was offered first, during the inner poll.
            crate::guard::offer_label(this.label);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use super::*;
    use crate::guard::{ObjectKey, Registry, Waiting};

    #[test]
    fn the_innermost_pending_label_is_named_until_it_completes() {
        let registry = Registry::new(Duration::from_secs(60));
        let (tx, rx) = futures::channel::oneshot::channel::<()>();
        let (_never, after) = futures::channel::oneshot::channel::<()>();
        let reconcile = async move {
            label("outer", async move {
                label("ready at once", async {}).await;
                label("the cert issuer", rx).await.ok();
                label("after it", after).await.ok();
            })
            .await;
            Ok::<(), ()>(())
        };
        let mut guarded = pin!(
            registry
                .controller("certs", "Certificate")
                .guard(ObjectKey::cluster("a"), reconcile)
        );
        let mut cx = Context::from_waker(Waker::noop());
        assert!(guarded.as_mut().poll(&mut cx).is_pending());
        let seen = registry.snapshot().remove(0);
        assert_eq!(seen.label, Some("the cert issuer"));
        assert_eq!(
            seen.waiting().map(|w| w.to_string()).as_deref(),
            Some("waiting in the await labelled \"the cert issuer\"")
        );

        tx.send(()).unwrap();
        assert!(guarded.as_mut().poll(&mut cx).is_pending());
        assert_eq!(registry.snapshot()[0].label, Some("after it"));
        assert!(matches!(
            registry.snapshot()[0].waiting(),
            Some(Waiting::Label("after it"))
        ));
    }

    #[test]
    fn a_label_outside_a_guard_names_nothing_inside_one() {
        let registry = Registry::new(Duration::from_secs(60));
        let mut cx = Context::from_waker(Waker::noop());
        // Polled bare on this thread first: its label must not leak into a guard.
        let mut bare = pin!(label("bare", std::future::pending::<()>()));
        assert_eq!(bare.as_mut().poll(&mut cx), Poll::Pending);
        let mut guarded = pin!(registry.controller("c", "K").guard(
            ObjectKey::cluster("a"),
            std::future::pending::<Result<(), ()>>()
        ));
        assert!(guarded.as_mut().poll(&mut cx).is_pending());
        assert_eq!(registry.snapshot()[0].label, None);
    }
}
