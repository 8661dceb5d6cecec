//! The monitor's waker threads: wake what the monitor must not wait on.
//!
//! Waking an idle worker of the watched runtime is a spawn, which takes the runtime's
//! inject-queue lock and allocates; cancelling a reconcile wakes its task, whose waker
//! takes the same lock (tokio's) or runs whatever the executor's waker does. The monitor
//! hands both off with an atomic flag or a channel send and an unpark (a futex wake when
//! the thread sleeps), and never waits on them. Each has a thread of its own: a cancelled
//! reconcile whose task waker blocks holds up later cancels, never a rescue.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use tokio::runtime::Handle;

use crate::guard::Registry;

/// The waker threads, or, for one that could not be started, the monitor doing its
/// wakes itself.
#[derive(Debug)]
pub(super) struct Waker {
    shared: Arc<Shared>,
    cancels: Cancels,
    workers: Workers,
}

#[derive(Debug)]
enum Cancels {
    Thread {
        requests: mpsc::Sender<u64>,
        thread: Option<JoinHandle<()>>,
    },
    /// No thread (none asked for, or it failed to start): the monitor cancels itself.
    Inline(Registry),
}

#[derive(Debug)]
enum Workers {
    Thread(Option<JoinHandle<()>>),
    /// No thread (none asked for, or it failed to start): the monitor spawns itself.
    Inline(Option<Handle>),
}

#[derive(Debug, Default)]
struct Shared {
    /// An idle worker's wake is asked for (one spawn serves any number asked meanwhile).
    worker: AtomicBool,
    stop: AtomicBool,
}

/// Runs `serve` on a thread named `name` whenever it is unparked, until `shared.stop`;
/// `serve` returns whether it did anything (then it runs again before parking).
fn spawn(
    name: &str,
    shared: &Arc<Shared>,
    mut serve: impl FnMut() -> bool + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            loop {
                if serve() {
                    continue;
                }
                if shared.stop.load(Ordering::Acquire) {
                    // What was asked before the stop is served now.
                    serve();
                    return;
                }
                std::thread::park();
            }
        })
}

fn failed(error: &std::io::Error, what: &str) {
    tracing::error!(
        target: super::report::TARGET,
        %error,
        "failed to start a watchdog waker thread; the monitor {what} itself"
    );
}

impl Waker {
    /// Starts a thread that cancels reconciles of `registry` when `cancels` (the cancel
    /// policy is on), and one that wakes idle workers of `runtime`, if one is given.
    pub(super) fn start(registry: &Registry, cancels: bool, runtime: Option<&Handle>) -> Self {
        let shared = Arc::new(Shared::default());
        let cancels = if cancels {
            let (requests, requested) = mpsc::channel::<u64>();
            let registry_ = registry.clone();
            let serve = move || {
                let mut any = false;
                while let Ok(id) = requested.try_recv() {
                    registry_.request_cancel(id);
                    any = true;
                }
                any
            };
            match spawn("reconcile-watchdog-waker", &shared, serve) {
                Ok(thread) => Cancels::Thread {
                    requests,
                    thread: Some(thread),
                },
                Err(error) => {
                    failed(&error, "wakes cancelled reconciles");
                    Cancels::Inline(registry.clone())
                }
            }
        } else {
            Cancels::Inline(registry.clone())
        };
        let workers = match runtime {
            Some(runtime) => {
                let (asked, handle) = (Arc::clone(&shared), runtime.clone());
                let serve = move || {
                    let wake = asked.worker.swap(false, Ordering::Acquire);
                    if wake {
                        // With no more work, the woken worker parks on the free driver.
                        drop(handle.spawn(async {}));
                    }
                    wake
                };
                match spawn("reconcile-watchdog-rescue", &shared, serve) {
                    Ok(thread) => Workers::Thread(Some(thread)),
                    Err(error) => {
                        failed(&error, "wakes idle runtime workers");
                        Workers::Inline(Some(runtime.clone()))
                    }
                }
            }
            None => Workers::Inline(None),
        };
        Self {
            shared,
            cancels,
            workers,
        }
    }

    /// Asks for an idle worker of the watched runtime to be woken; returns at once.
    pub(super) fn wake_worker(&self) {
        match &self.workers {
            Workers::Thread(thread) => {
                self.shared.worker.store(true, Ordering::Release);
                unpark(thread.as_ref());
            }
            Workers::Inline(runtime) => {
                if let Some(runtime) = runtime {
                    drop(runtime.spawn(async {}));
                }
            }
        }
    }

    /// Asks reconcile `id` to stop at its next poll, and wakes it; returns at once.
    pub(super) fn cancel(&self, id: u64) {
        match &self.cancels {
            Cancels::Thread { requests, thread } => {
                // The receiver lives as long as the thread, and the thread as long as
                // `self`: the send cannot fail.
                let _ = requests.send(id);
                unpark(thread.as_ref());
            }
            Cancels::Inline(registry) => {
                registry.request_cancel(id);
            }
        }
    }
}

fn unpark(thread: Option<&JoinHandle<()>>) {
    if let Some(thread) = thread {
        thread.thread().unpark();
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        // The monitor stops: waiting for a wake in progress is no stall then.
        self.shared.stop.store(true, Ordering::Release);
        let cancels = match &mut self.cancels {
            Cancels::Thread { thread, .. } => thread.take(),
            Cancels::Inline(_) => None,
        };
        let workers = match &mut self.workers {
            Workers::Thread(thread) => thread.take(),
            Workers::Inline(_) => None,
        };
        for thread in [workers, cancels].into_iter().flatten() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
