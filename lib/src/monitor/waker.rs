//! The monitor's waker thread: wakes what the monitor must not wait on.
//!
//! Waking an idle worker of the watched runtime is a spawn, which takes the runtime's
//! inject-queue lock and allocates; cancelling a reconcile wakes its task, whose waker
//! takes the same lock (tokio's) or runs whatever the executor's waker does. The monitor
//! hands both to this thread with an atomic flag or a channel send and an unpark (a
//! futex wake when the thread sleeps), and never waits on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use tokio::runtime::Handle;

use crate::guard::Registry;

/// The waker thread, or, if it could not be started, the monitor doing the wakes itself.
#[derive(Debug)]
pub(super) struct Waker {
    shared: Arc<Shared>,
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    Thread {
        cancels: mpsc::Sender<u64>,
        thread: Option<JoinHandle<()>>,
    },
    /// The thread failed to start: the monitor wakes on its own thread, as it must.
    Inline {
        registry: Registry,
        runtime: Option<Handle>,
    },
}

#[derive(Debug, Default)]
struct Shared {
    /// An idle worker's wake is asked for (one spawn serves any number asked meanwhile).
    worker: AtomicBool,
    stop: AtomicBool,
}

impl Waker {
    /// Starts the thread, which cancels reconciles of `registry` and wakes idle workers
    /// of `runtime`, if one is watched.
    pub(super) fn start(registry: &Registry, runtime: Option<&Handle>) -> Self {
        let shared = Arc::new(Shared::default());
        let (cancels, requested) = mpsc::channel::<u64>();
        let spawned = {
            let (shared, registry, runtime) =
                (Arc::clone(&shared), registry.clone(), runtime.cloned());
            std::thread::Builder::new()
                .name("reconcile-watchdog-waker".into())
                .spawn(move || {
                    let cancel_requested = || {
                        while let Ok(id) = requested.try_recv() {
                            registry.request_cancel(id);
                        }
                    };
                    loop {
                        cancel_requested();
                        if shared.worker.swap(false, Ordering::Acquire) {
                            if let Some(runtime) = &runtime {
                                // With no more work, the woken worker parks on the free
                                // driver.
                                drop(runtime.spawn(async {}));
                            }
                        } else if shared.stop.load(Ordering::Acquire) {
                            // Cancels sent before the stop are seen now.
                            cancel_requested();
                            return;
                        } else {
                            std::thread::park();
                        }
                    }
                })
        };
        let mode = match spawned {
            Ok(thread) => Mode::Thread {
                cancels,
                thread: Some(thread),
            },
            Err(error) => {
                tracing::error!(
                    target: super::report::TARGET,
                    %error,
                    "failed to start the watchdog's waker thread; the monitor wakes cancelled reconciles and idle runtime workers itself"
                );
                Mode::Inline {
                    registry: registry.clone(),
                    runtime: runtime.cloned(),
                }
            }
        };
        Self { shared, mode }
    }

    /// Asks for an idle worker of the watched runtime to be woken; returns at once.
    pub(super) fn wake_worker(&self) {
        match &self.mode {
            Mode::Thread { thread, .. } => {
                self.shared.worker.store(true, Ordering::Release);
                unpark(thread.as_ref());
            }
            Mode::Inline { runtime, .. } => {
                if let Some(runtime) = runtime {
                    drop(runtime.spawn(async {}));
                }
            }
        }
    }

    /// Asks reconcile `id` to stop at its next poll, and wakes it; returns at once.
    pub(super) fn cancel(&self, id: u64) {
        match &self.mode {
            Mode::Thread { cancels, thread } => {
                // The receiver lives as long as the thread, and the thread as long as
                // `self`: the send cannot fail.
                let _ = cancels.send(id);
                unpark(thread.as_ref());
            }
            Mode::Inline { registry, .. } => {
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
        if let Mode::Thread { thread, .. } = &mut self.mode
            && let Some(thread) = thread.take()
        {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}
