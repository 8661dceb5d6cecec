//! A ConfigMap operator with its own `Controller::run`, every reconcile under the watchdog.
//!
//! What an operator author adds is marked `feature = "watchdog"`: the watchdog's flags in
//! the operator's own command line, the watchdog started from them beside the runtime,
//! the API server check, watch freshness, the `requests` layer on the reconciles' client,
//! an error variant for the guard's errors and `guarded` around the reconcile. Without
//! the feature this is a plain kube-runtime operator, which docs/performance.md compares
//! it with. The rest is what a production operator does with or without the watchdog,
//! and the watchdog relies on: logs through a writer that never blocks the thread that
//! writes, and a read timeout on the client the reconciles use. docs/embedding.md
//! quotes the blocks between `// docs: begin NAME` and `// docs: end NAME` markers, and
//! a test checks that it shows this code.
//!
//! Each reconcile records the ConfigMap's key count in its annotation
//! `downstream.example/keys` (a merge patch, only when it changed). A ConfigMap
//! annotated `downstream.example/block-for: DURATION` stands for a dependency that keeps
//! timing out: its reconcile blocks its worker thread that long in a synchronous call,
//! then comes back as long after. The watchdog reports it with the blocked thread's
//! stack (the release-binary tests measure that capture's memory).

use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::client::ClientBuilder;
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

/// What every reconcile gets: the client with a read timeout.
struct Context {
    client: Client,
}

/// The annotation whose duration a reconcile blocks its thread for.
const BLOCK_FOR: &str = "downstream.example/block-for";
/// The annotation a reconcile records the ConfigMap's key count in.
const KEYS: &str = "downstream.example/keys";

async fn reconcile(configmap: Arc<ConfigMap>, ctx: Arc<Context>) -> Result<Action, Error> {
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
    let keys = configmap
        .data
        .as_ref()
        .map_or(0, |data| data.len())
        .to_string();
    if configmap.annotations().get(KEYS) != Some(&keys) {
        let namespace = configmap.namespace().unwrap_or_default();
        let patch = serde_json::json!({ "metadata": { "annotations": { KEYS: keys } } });
        Api::<ConfigMap>::namespaced(ctx.client.clone(), &namespace)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    tracing::info!(configmap = %name, keys = %keys, "reconciled");
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

fn error_policy(_: Arc<ConfigMap>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!("reconcile failed: {error}");
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A malformed flag exits 2 here, naming it, before anything starts.
    let cli = Cli::parse();
    // docs: begin logs
    // The watchdog writes its hang reports from its own thread through this writer: a
    // writer that blocks while standard output's reader lags would stall the watchdog
    // with it. This one queues lines to a thread of its own and drops (and counts) what
    // does not fit, about 4 MB of the largest reports; the guard flushes it at exit.
    let (writer, _flushed_at_exit) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(1_000)
        .lossy(true)
        .finish(std::io::stdout());
    let logs = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        );
    match cli.log_format {
        LogFormat::Text => logs.init(),
        // One object per event, its fields beside the message (a report's stack is one).
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    // docs: end logs
    let config = kube::Config::infer().await?;

    // docs: begin clients
    // Two clients from one config. The watches' has no read timeout: kube-runtime's
    // watcher bounds its watches itself, and a quiet watch reads nothing for minutes.
    let watch_client = ClientBuilder::try_from(config.clone())?;
    // The reconciles': a request with no response for 30 s fails, and the error policy
    // requeues the object (kube 5; on kube 3 and 4, see docs/embedding.md).
    let mut reconcile_config = config.clone();
    reconcile_config.read_timeout = Some(Duration::from_secs(30));
    reconcile_config.reset_reader_on_write = true;
    let reconcile_client = ClientBuilder::try_from(reconcile_config)?;
    // docs: end clients

    #[cfg(feature = "watchdog")]
    // docs: begin watchdog
    let (_watchdog, reconcile, watch_client, reconcile_client) = {
        use reconcile_watchdog::kube::watches::{self, Watches};
        use reconcile_watchdog::kube::{ApiServerCheck, controller_handle, guarded, requests};

        // `--watch-stall-threshold` (3m; `off`): a watch silent that long fails readiness.
        let watches = Watches::new(cli.watchdog.watch_stall_threshold());
        let mut builder = cli
            .watchdog
            .builder()
            .watch_runtime(tokio::runtime::Handle::current())
            .watches(watches.clone());
        // `--api-server-check-interval` (5s; `off`): an API outage fails readiness, and
        // does not restart the pod.
        let api_server = cli
            .watchdog
            .api_server_check_interval()
            .map(ApiServerCheck::every);
        if let Some(check) = &api_server {
            builder = builder.api_server(check.clone());
            check.watch(config.clone())?;
        }
        let watchdog = builder.start()?;
        // Each resource the controller watches, named as its API path names it.
        watches.expect("configmaps", &watches::resource::<ConfigMap>(&()));
        // The kind comes from the type: reports call the objects ConfigMaps.
        let handle = controller_handle::<ConfigMap>(watchdog.registry(), "configmaps");
        (
            // Kept until main returns: the probes answer as long as the watchdog lives.
            watchdog,
            guarded(handle, reconcile),
            // The watches' signs of life are dated on their client's responses...
            watch_client.with_layer(&watches.layer()),
            // ...and a hung reconcile's report names the API request it waits on.
            reconcile_client.with_layer(&requests::layer()),
        )
    };
    // docs: end watchdog

    let configmaps = match &cli.namespace {
        Some(namespace) => Api::<ConfigMap>::namespaced(watch_client.build(), namespace),
        None => Api::<ConfigMap>::all(watch_client.build()),
    };
    let ctx = Arc::new(Context {
        client: reconcile_client.build(),
    });
    Controller::new(configmaps, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
    Ok(())
}
