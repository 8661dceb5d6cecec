//! A ConfigMap operator with its own `Controller::run`, every reconcile under the watchdog.
//!
//! What an operator author adds is marked `feature = "watchdog"`: the watchdog's flags in
//! the operator's own command line, the watchdog started from them beside the runtime,
//! the API server check, an error variant for the guard's errors and `guarded` around
//! the reconcile. Without the feature this is a plain kube-runtime operator, which
//! docs/embedding.md compares it with.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
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

    /// The watchdog's flags: --reconcile-deadline-for NAME=DURATION and the others.
    #[cfg(feature = "watchdog")]
    #[command(flatten)]
    watchdog: reconcile_watchdog::WatchdogArgs,
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

async fn reconcile(configmap: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, Error> {
    let keys = configmap.data.as_ref().map_or(0, |data| data.len());
    println!("reconciled {} ({keys} keys)", configmap.name_any());
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(_: Arc<ConfigMap>, error: &Error, _: Arc<()>) -> Action {
    eprintln!("reconcile failed: {error}");
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A malformed flag exits 2 here, naming it, before anything starts.
    let cli = Cli::parse();
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
