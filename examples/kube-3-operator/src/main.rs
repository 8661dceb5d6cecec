//! A ConfigMap operator on kube 3 that keeps its own prometheus-client, every reconcile
//! under the watchdog, and the watchdog's series on its own `/metrics`.
//!
//! The library's metrics are made with its own prometheus-client (0.26); this operator's
//! registry is of another version (0.24), so it cannot take them as series. It takes
//! them as text instead: the watchdog's OpenMetrics exposition appended to its own.
//! docs/embedding.md quotes the blocks between `// docs: begin NAME` and
//! `// docs: end NAME`.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use reconcile_watchdog::Watchdog;
use reconcile_watchdog::kube::{controller_handle, guarded};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// A reconcile that panicked, or that the watchdog cancelled.
    #[error(transparent)]
    Watchdog(#[from] reconcile_watchdog::guard::Error),
}

struct Context {
    reconciled: Counter,
}

async fn reconcile(_: Arc<ConfigMap>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.reconciled.inc();
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(_: Arc<ConfigMap>, _: &Error, _: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

// docs: begin exposition
/// The body of this operator's `/metrics`: its own series, then the watchdog's.
fn exposition(registry: &Registry, watchdog: &Watchdog) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, registry);
    // Each exposition ends with `# EOF`; the joined one ends with the watchdog's.
    let mut text = text.replace("# EOF\n", "");
    if let Some(metrics) = watchdog.metrics() {
        text.push_str(&metrics.encode());
    }
    text
}
// docs: end exposition

/// A `/metrics` endpoint as small as can be: every request gets the exposition.
async fn serve_metrics(registry: Arc<Registry>, watchdog: Arc<Watchdog>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
    loop {
        let (mut connection, _) = listener.accept().await?;
        let body = exposition(&registry, &watchdog);
        let mut request = [0; 1024];
        let _ = connection.read(&mut request).await?;
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        connection.write_all(head.as_bytes()).await?;
        connection.write_all(body.as_bytes()).await?;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // docs: begin watchdog
    // The watchdog serves no `/metrics` of its own (its port stays free for yours), and
    // collects its series for `exposition`.
    let watchdog = Watchdog::builder()
        .deadlines(Duration::from_secs(300))
        .probe_address("0.0.0.0:8081".parse()?)
        .collect_metrics()
        .watch_runtime(tokio::runtime::Handle::current())
        .start()?;
    // docs: end watchdog
    let handle = controller_handle::<ConfigMap>(watchdog.registry(), "configmaps");

    let mut registry = Registry::default();
    let reconciled = Counter::default();
    registry.register(
        "myop_reconciled",
        "ConfigMaps reconciled",
        reconciled.clone(),
    );
    let metrics = tokio::spawn(serve_metrics(Arc::new(registry), Arc::new(watchdog)));

    let client = Client::try_default().await?;
    Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
        .shutdown_on_signal()
        .run(
            guarded(handle, reconcile),
            error_policy,
            Arc::new(Context { reconciled }),
        )
        .for_each(|_| async {})
        .await;
    metrics.abort();
    Ok(())
}
