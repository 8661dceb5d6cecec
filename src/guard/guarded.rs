//! The future wrapper that records every poll of a reconcile and honours cancellation.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use pin_project_lite::pin_project;

use super::entry::Outcome;
use super::registry::Guard;

/// Why a guarded reconcile produced no result of its own.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// The watchdog cancelled it after it outlived its deadline (`--on-hang cancel`);
    /// the reconcile future was dropped at its next poll.
    #[error("reconcile cancelled by the watchdog after {}", humantime::format_duration(*.after))]
    Cancelled {
        /// How long it had run.
        after: Duration,
    },
    /// The reconcile panicked; the panic was caught so the controller lives on.
    #[error("reconcile panicked: {message}")]
    Panicked {
        /// The panic's message, when it was a string.
        message: String,
    },
}

pin_project! {
    /// A reconcile future running under a [`Guard`].
    ///
    /// Resolves to `Ok(output)` with the reconcile's own result, or to an [`Error`]
    /// when it was cancelled by the watchdog or panicked. The guard leaves the registry
    /// when this resolves or is dropped.
    #[must_use = "futures do nothing unless polled"]
    pub struct Guarded<F> {
        // Declared first so that the reconcile is dropped before its guard.
        #[pin]
        reconcile: Option<F>,
        guard: Option<Guard>,
        // The guard's waker, which dates wakes: made once, handed to every poll.
        waker: Waker,
    }
}

impl<F> Guarded<F> {
    /// Runs `reconcile` under `guard`.
    pub fn new(guard: Guard, reconcile: F) -> Self {
        Self {
            waker: guard.waker(),
            reconcile: Some(reconcile),
            guard: Some(guard),
        }
    }
}

impl<F, T, E> Future for Guarded<F>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<Result<T, E>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(guard) = this.guard.as_ref() else {
            panic!("`Guarded` polled after it resolved");
        };
        let entry = guard.entry();
        if entry.cancel_requested() {
            this.reconcile.set(None);
            let after = entry.started.elapsed();
            finish(this.guard, Outcome::Cancelled);
            return Poll::Ready(Err(Error::Cancelled { after }));
        }
        let Some(reconcile) = this.reconcile.as_mut().as_pin_mut() else {
            unreachable!("the reconcile is only taken together with the guard");
        };

        // The task's waker is known before the poll, so that a wake during it (or a
        // cancel request) reaches the task through the guard's waker.
        entry.register_waker(cx.waker());
        entry.poll_begins();
        let mut dated = Context::from_waker(this.waker);
        let polled = catch_unwind(AssertUnwindSafe(|| reconcile.poll(&mut dated)));
        entry.poll_ends();

        match polled {
            Ok(Poll::Pending) => {
                // A cancel request that came after the flag was read is seen here, or
                // its wake reached the task.
                if entry.cancel_requested() {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
            Ok(Poll::Ready(result)) => {
                finish(
                    this.guard,
                    if result.is_ok() {
                        Outcome::Ok
                    } else {
                        Outcome::Error
                    },
                );
                this.reconcile.set(None);
                Poll::Ready(Ok(result))
            }
            Err(payload) => {
                this.reconcile.set(None);
                finish(this.guard, Outcome::Panic);
                Poll::Ready(Err(Error::Panicked {
                    message: panic_message(payload.as_ref()),
                }))
            }
        }
    }
}

fn finish(guard: &mut Option<Guard>, outcome: Outcome) {
    if let Some(guard) = guard.take() {
        guard.finish(outcome);
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
