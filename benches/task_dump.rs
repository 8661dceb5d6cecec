//! Criterion bench of a task dump (feature `task-dump`): what the monitor's
//! `Handle::dump` of the watched runtime costs with 1,000 tasks alive, each parked a
//! few `async fn`s deep, as reconciles awaiting the API server are. The runtime's
//! workers are paused for the length of a dump, so this is also the bound on how long
//! one awaiting hang's report holds the runtime up. Needs
//! `RUSTFLAGS="--cfg tokio_unstable"`; without it, it measures nothing.

#[cfg(all(feature = "task-dump", tokio_unstable, target_os = "linux"))]
mod dump {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::{Duration, Instant};

    use criterion::Criterion;

    /// Tasks alive during the dump.
    pub const TASKS: usize = 1_000;

    #[inline(never)]
    async fn get_configmap(rx: tokio::sync::oneshot::Receiver<()>) {
        let _ = rx.await;
    }

    #[inline(never)]
    async fn reconcile(rx: tokio::sync::oneshot::Receiver<()>) {
        get_configmap(rx).await;
    }

    fn block_on<F: Future>(future: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut future = std::pin::pin!(future);
        loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                return output;
            }
            std::thread::park();
        }
    }

    pub fn task_dump(c: &mut Criterion) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let mut senders = Vec::with_capacity(TASKS);
        for _ in 0..TASKS {
            let (tx, rx) = tokio::sync::oneshot::channel();
            senders.push(tx);
            runtime.spawn(reconcile(rx));
        }
        while runtime.metrics().num_alive_tasks() < TASKS {
            std::thread::sleep(Duration::from_millis(1));
        }
        let handle = runtime.handle().clone();
        let mut group = c.benchmark_group("task_dump");
        group.sample_size(20);
        group.bench_function("1000_tasks", |b| {
            b.iter(|| {
                let dump = block_on(handle.dump());
                assert!(dump.tasks().iter().count() >= TASKS);
            });
        });
        group.finish();
        // The heartbeat's view: how late a 1 ms tick gets while dumps run back to back.
        let (late_tx, late_rx) = std::sync::mpsc::channel();
        let ticker = runtime.spawn(async move {
            let mut worst = Duration::ZERO;
            let mut last = Instant::now();
            for _ in 0..2_000 {
                tokio::time::sleep(Duration::from_millis(1)).await;
                worst = worst.max(last.elapsed());
                last = Instant::now();
            }
            let _ = late_tx.send(worst);
        });
        while !ticker.is_finished() {
            let _ = block_on(handle.dump());
        }
        if let Ok(worst) = late_rx.recv() {
            eprintln!("task_dump: the longest gap between 1 ms ticks during dumps: {worst:?}");
        }
        drop(senders);
    }
}

#[cfg(all(feature = "task-dump", tokio_unstable, target_os = "linux"))]
criterion::criterion_group!(benches, dump::task_dump);
#[cfg(all(feature = "task-dump", tokio_unstable, target_os = "linux"))]
criterion::criterion_main!(benches);

#[cfg(not(all(feature = "task-dump", tokio_unstable, target_os = "linux")))]
fn main() {
    eprintln!(
        "task_dump: build with --features task-dump and RUSTFLAGS=\"--cfg tokio_unstable\" to measure"
    );
}
