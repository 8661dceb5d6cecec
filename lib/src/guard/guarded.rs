//! The future wrapper that records every poll of a reconcile and honours cancellation.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;

use super::entry::Entry;
use super::reconcile_guard::Guard;
use super::{current, reconcile::Outcome, thread};

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
        // While a client layer attributes requests: a second reference to the entry,
        // lent to the thread during each poll. Dropped before the guard, so that the
        // guard finds its entry unshared and keeps it for the thread's next reconcile.
        lent: Option<Arc<Entry>>,
        guard: Option<Guard>,
        // Whether `lent` is lent during each poll.
        publish: bool,
        // The label last written to the entry, so that a poll writes only a change.
        label: Option<&'static str>,
    }
}

impl<F> Guarded<F> {
    /// Runs `reconcile` under `guard`.
    pub fn new(guard: Guard, reconcile: F) -> Self {
        let publish = current::attributing();
        Self {
            lent: publish.then(|| guard.lend()),
            publish,
            label: None,
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
            let after = entry.elapsed();
            finish(this.lent, this.guard, Outcome::Cancelled);
            return Poll::Ready(Err(Error::Cancelled { after }));
        }
        let Some(reconcile) = this.reconcile.as_mut().as_pin_mut() else {
            unreachable!("the reconcile is only taken together with the guard");
        };

        // The guard's waker, which dates wakes, borrowed from the guard's reference: no
        // count changes unless the reconcile keeps a clone.
        let waker = futures::task::waker_ref(entry);
        let mut dated = Context::from_waker(&waker);
        // Where this frame is, so that a capture can check that its walk went through
        // it; recorded before the poll is published (see `Entry::poll_begins`).
        let outer_frame = thread::enter_poll_frame((&raw const dated).addr());
        entry.poll_begins();
        if *this.publish {
            current::swap_current(this.lent);
        }
        let outer_label = thread::swap_label(None);
        let polled = catch_unwind(AssertUnwindSafe(|| reconcile.poll(&mut dated)));
        let label = thread::swap_label(outer_label);
        if *this.publish {
            current::swap_current(this.lent);
        }
        entry.poll_ends();
        thread::leave_poll_frame(outer_frame);

        match polled {
            Ok(Poll::Pending) => {
                if !same_label(label, *this.label) {
                    entry.facts.set_label(label);
                    *this.label = label;
                }
                // The task's waker is registered only now, when there is a wait to
                // wake it from (a reconcile that returns at once never pays for it).
                // A wake of the guard's waker (or a cancel request) that came before
                // this registration may have found no waker, or an older one; each
                // left its mark first, seen here, and the task is woken for it. One
                // that comes after finds the waker.
                entry.register_waker(cx.waker());
                if entry.woken_since_poll_began() || entry.cancel_requested() {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
            Ok(Poll::Ready(result)) => {
                finish(
                    this.lent,
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
                finish(this.lent, this.guard, Outcome::Panic);
                Poll::Ready(Err(Error::Panicked {
                    message: panic_message(payload.as_ref()),
                }))
            }
        }
    }
}

/// The same label, told by address: labels are static strings, and comparing their
/// text on every poll would cost what the label saves.
fn same_label(a: Option<&'static str>, b: Option<&'static str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => std::ptr::eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Ends the guard with `outcome`, letting go of the lent reference first (see `lent`).
#[inline]
fn finish(lent: &mut Option<Arc<Entry>>, guard: &mut Option<Guard>, outcome: Outcome) {
    *lent = None;
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use crate::guard::{ObjectKey, PollState, Registry};

    /// A reconcile that hands out its waker and waits until told to finish.
    #[test]
    fn a_wake_is_dated_until_the_next_poll() {
        let registry = Registry::new(Duration::from_secs(60));
        let handed: Arc<Mutex<Option<Waker>>> = Arc::default();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reconcile = {
            let (handed, done) = (Arc::clone(&handed), Arc::clone(&done));
            std::future::poll_fn(move |cx: &mut Context<'_>| {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    return Poll::Ready(Ok::<(), ()>(()));
                }
                *handed.lock().unwrap() = Some(cx.waker().clone());
                Poll::Pending
            })
        };
        let mut guarded = std::pin::pin!(
            registry
                .controller("web", "Widget")
                .guard(ObjectKey::cluster("a"), reconcile)
        );
        let task = Arc::new(CountingWaker::default());
        let task_waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&task_waker);
        assert!(guarded.as_mut().poll(&mut cx).is_pending());
        assert_eq!(registry.snapshot()[0].poll, PollState::Awaiting);

        // Woken from another thread; the executor has not polled it yet.
        let waker = handed.lock().unwrap().take().unwrap();
        std::thread::spawn(move || waker.wake()).join().unwrap();
        assert_eq!(task.wakes(), 1, "the wake reaches the task");
        assert!(
            matches!(registry.snapshot()[0].poll, PollState::Woken { .. }),
            "{:?}",
            registry.snapshot()[0].poll
        );

        // Polled again: no longer woken-not-polled.
        assert!(guarded.as_mut().poll(&mut cx).is_pending());
        assert_eq!(registry.snapshot()[0].poll, PollState::Awaiting);

        // A cancel request still reaches the task through the registered waker.
        let id = registry.snapshot()[0].id;
        assert!(registry.request_cancel(id));
        assert_eq!(task.wakes(), 2);
        assert!(matches!(
            guarded.as_mut().poll(&mut cx),
            Poll::Ready(Err(crate::guard::Error::Cancelled { .. }))
        ));
        assert!(registry.is_empty());
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The task's waker is registered after the poll: a wake during the first poll
    /// (before any registration) and one from another thread between the poll's end
    /// and the registration must still reach the task.
    #[test]
    fn a_wake_before_the_waker_is_registered_reaches_the_task() {
        let registry = Registry::new(Duration::from_secs(60));
        let handle = registry.controller("web", "Widget");
        let task = Arc::new(CountingWaker::default());
        let task_waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&task_waker);

        // Woken during its own first poll, as `yield_now` does.
        let mut polls = 0;
        let mut yields = std::pin::pin!(handle.guard(
            ObjectKey::cluster("a"),
            std::future::poll_fn(move |cx: &mut Context<'_>| {
                polls += 1;
                if polls == 1 {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Ready(Ok::<(), ()>(()))
            })
        ));
        assert!(yields.as_mut().poll(&mut cx).is_pending());
        assert_eq!(
            task.wakes(),
            1,
            "the wake during the first poll is passed on"
        );
        assert!(yields.as_mut().poll(&mut cx).is_ready());

        // Woken from another thread while its first poll runs, before it registers its
        // task's waker: the wake leaves its mark, which the poll checks.
        let (entered, go) = (
            Arc::new(std::sync::Barrier::new(2)),
            Arc::new(std::sync::Barrier::new(2)),
        );
        let handed: Arc<Mutex<Option<Waker>>> = Arc::default();
        let waking = {
            let (entered, go, handed) =
                (Arc::clone(&entered), Arc::clone(&go), Arc::clone(&handed));
            std::thread::spawn(move || {
                entered.wait();
                handed.lock().unwrap().take().unwrap().wake();
                go.wait();
            })
        };
        let mut first = true;
        let mut woken_elsewhere = std::pin::pin!(handle.guard(
            ObjectKey::cluster("b"),
            std::future::poll_fn(move |cx: &mut Context<'_>| {
                if std::mem::take(&mut first) {
                    *handed.lock().unwrap() = Some(cx.waker().clone());
                    entered.wait();
                    go.wait();
                    return Poll::Pending;
                }
                Poll::Ready(Ok::<(), ()>(()))
            })
        ));
        // Polled by another task than the first: the entry the first reconcile left
        // still holds that task's waker, so the wake finds only the older task (woken
        // spuriously) and its mark; this task is woken for the mark.
        let other = Arc::new(CountingWaker::default());
        let other_waker = Waker::from(Arc::clone(&other));
        let mut other_cx = Context::from_waker(&other_waker);
        assert!(woken_elsewhere.as_mut().poll(&mut other_cx).is_pending());
        waking.join().unwrap();
        assert_eq!(
            other.wakes(),
            1,
            "the wake from the other thread is passed on"
        );
        assert!(woken_elsewhere.as_mut().poll(&mut other_cx).is_ready());
        assert!(registry.is_empty());
    }

    #[derive(Default)]
    struct CountingWaker(std::sync::atomic::AtomicUsize);

    impl CountingWaker {
        fn wakes(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
