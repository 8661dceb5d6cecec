//! The `task_trace` of an awaiting hang's report, end to end through the public API: a
//! watchdog watching a multi-thread runtime, a guarded reconcile parked in an `async fn`
//! of its own, and the hang report that the monitor writes to the log.
//!
//! With the `task-dump` feature and `--cfg tokio_unstable` (`.ci/test` builds it so) the
//! report names the function awaiting, leaves out the guard's own frames and stays
//! within 2 KiB; without them it carries no trace at all.

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::{Duration, Instant};

    use reconcile_watchdog::Watchdog;
    use reconcile_watchdog::guard::ObjectKey;
    use reconcile_watchdog::monitor::HangPolicy;
    use tracing::field::{Field, Visit};
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::{Context, SubscriberExt};

    /// The hang reports' log target.
    const HANG: &str = "reconcile_watchdog::hang";

    /// Every hang report written so far: its fields, the message among them.
    static REPORTS: Mutex<Vec<BTreeMap<String, String>>> = Mutex::new(Vec::new());

    struct Capture;

    struct Fields<'a>(&'a mut BTreeMap<String, String>);

    impl Visit for Fields<'_> {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_owned(), value.to_owned());
        }

        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.insert(field.name().to_owned(), format!("{value:?}"));
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for Capture {
        fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
            if event.metadata().target() == HANG {
                let mut fields = BTreeMap::new();
                event.record(&mut Fields(&mut fields));
                REPORTS.lock().unwrap().push(fields);
            }
        }
    }

    /// The monitor logs from its own thread: the capture is the global subscriber.
    fn capture() {
        static INSTALLED: OnceLock<()> = OnceLock::new();
        INSTALLED.get_or_init(|| {
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
                .expect("the only global subscriber of this test binary");
        });
    }

    #[inline(never)]
    async fn waits_for_the_issuer(issuer: tokio::sync::oneshot::Receiver<()>) {
        let _ = issuer.await;
    }

    #[test]
    fn an_awaiting_hang_reports_its_task_trace_with_the_feature_and_none_without() {
        capture();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let watchdog = Watchdog::builder()
            .deadlines(Duration::from_millis(300))
            .interval(Duration::from_millis(50))
            .on_hang(HangPolicy::Report)
            .probe_address(([127, 0, 0, 1], 0).into())
            .debug_address(None)
            .watch_runtime(runtime.handle().clone())
            .start()
            .expect("the watchdog starts");
        let (_issuer, issued) = tokio::sync::oneshot::channel();
        let reconcile = runtime.spawn(
            watchdog
                .registry()
                .controller("cert-renewer", "Certificate")
                .guard(ObjectKey::namespaced("demo", "cert-7"), async move {
                    waits_for_the_issuer(issued).await;
                    Ok::<(), ()>(())
                }),
        );

        let started = Instant::now();
        let report = loop {
            let hung = REPORTS
                .lock()
                .unwrap()
                .iter()
                .find(|r| {
                    r["message"].starts_with("reconcile hung:") && r["object"] == "demo/cert-7"
                })
                .cloned();
            if let Some(report) = hung {
                break report;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no hang report within 30 s: {:?}",
                REPORTS.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(report["state"], "awaiting", "{report:?}");

        if cfg!(all(
            feature = "task-dump",
            tokio_unstable,
            target_os = "linux"
        )) {
            let trace = report.get("task_trace").expect("a task_trace field");
            assert!(trace.contains("waits_for_the_issuer"), "{trace}");
            // The reconcile's frames, not the guard's around them.
            assert!(!trace.contains("catch_unwind"), "{trace}");
            assert!(!trace.contains("Guarded"), "{trace}");
            assert!(trace.len() <= 2048, "{}", trace.len());
        } else {
            assert_eq!(report.get("task_trace"), None, "{report:?}");
        }
        reconcile.abort();
    }
}
