//! A ConfigMap operator with its own `Controller::run`, every reconcile under the watchdog.
//!
//! What an operator author adds is marked `feature = "watchdog"`: the watchdog's flags in
//! the operator's own command line, the watchdog started from them beside the runtime,
//! the API server check, an error variant for the guard's errors and `guarded` around
//! the reconcile. Without the feature this is a plain kube-runtime operator, which
//! docs/embedding.md compares it with. Logs go through `tracing`: the watchdog's hang
//! reports are log events, and without a subscriber nobody reads them.
//!
//! A ConfigMap annotated `downstream.example/block-for: DURATION` stands for a
//! dependency that keeps timing out: its reconcile blocks its worker thread that long
//! in a synchronous call, then comes back as long after. The watchdog reports it with
//! the blocked thread's stack (the release-binary tests measure that capture's memory).

use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

/// A ConfigMap operator.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// Watch ConfigMaps in this namespace only (default: every namespace)
    #[arg(long, env = "DOWNSTREAM_NAMESPACE")]
    namespace: Option<String>,

    /// Log lines as text or one JSON object each
    #[arg(long, env = "DOWNSTREAM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    /// The watchdog's flags: --reconcile-deadline-for NAME=DURATION and the others.
    #[cfg(feature = "watchdog")]
    #[command(flatten)]
    watchdog: reconcile_watchdog::WatchdogArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("kubernetes api: {0}")]
    Kube(#[from] kube::Error),
    /// A reconcile that panicked, or that the watchdog cancelled.
    #[cfg(feature = "watchdog")]
    #[error("reconcile: {0}")]
    Watchdog(#[from] reconcile_watchdog::guard::Error),
}

/// The annotation whose duration a reconcile blocks its thread for.
const BLOCK_FOR: &str = "downstream.example/block-for";

async fn reconcile(configmap: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, Error> {
    let name = configmap.name_any();
    if let Some(block) = configmap.annotations().get(BLOCK_FOR) {
        let Ok(duration) = humantime::parse_duration(block) else {
            tracing::warn!(configmap = %name, "{BLOCK_FOR}: not a duration: {block:?}");
            return Ok(Action::await_change());
        };
        let took = call_synchronous_dependency(duration);
        tracing::info!(configmap = %name, took = ?took, "the synchronous call returned");
        return Ok(Action::requeue(duration));
    }
    let keys = configmap.data.as_ref().map_or(0, |data| data.len());
    tracing::info!(configmap = %name, keys, "reconciled");
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// A synchronous call that does not return for `duration`: a blocking client, a
/// `std::sync::Mutex` held elsewhere. Not inlined: its frame is named even where only
/// the symbol table is left.
#[inline(never)]
fn call_synchronous_dependency(duration: Duration) -> Duration {
    let start = std::time::Instant::now();
    std::thread::sleep(duration);
    start.elapsed()
}

fn error_policy(_: Arc<ConfigMap>, error: &Error, _: Arc<()>) -> Action {
    tracing::warn!("reconcile failed: {error}");
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A malformed flag exits 2 here, naming it, before anything starts.
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt().with_env_filter(
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
    );
    match cli.log_format {
        LogFormat::Text => logs.init(),
        // One object per event, its fields beside the message (a report's stack is one).
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    let config = kube::Config::infer().await?;

    #[cfg(feature = "watchdog")]
    let (_watchdog, reconcile) = {
        use reconcile_watchdog::kube::{ApiServerCheck, controller_handle, guarded};

        let mut builder = cli
            .watchdog
            .builder()
            .watch_runtime(tokio::runtime::Handle::current());
        let api_server = cli
            .watchdog
            .api_server_check_interval()
            .map(ApiServerCheck::every);
        if let Some(check) = &api_server {
            builder = builder.api_server(check.clone());
            check.watch(config.clone())?;
        }
        let watchdog = builder.start()?;
        // The kind comes from the type: reports call the objects ConfigMaps.
        let handle = controller_handle::<ConfigMap>(watchdog.registry(), "configmaps");
        // Kept until main returns: the probes answer as long as the watchdog lives.
        (watchdog, guarded(handle, reconcile))
    };

    let client = Client::try_from(config)?;
    let configmaps = match &cli.namespace {
        Some(namespace) => Api::<ConfigMap>::namespaced(client, namespace),
        None => Api::<ConfigMap>::all(client),
    };
    Controller::new(configmaps, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::new(()))
        .for_each(|_| async {})
        .await;
    Ok(())
}
