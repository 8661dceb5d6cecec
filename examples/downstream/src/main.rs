//! A ConfigMap operator with its own `Controller::run`, every reconcile under the watchdog.
//!
//! What an operator author adds is marked `feature = "watchdog"`: the watchdog started
//! beside the runtime, the API server check, an error variant for the guard's errors and
//! `guarded` around the reconcile. Without the feature this is a plain kube-runtime
//! operator, which docs/embedding.md compares it with.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

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
    let config = kube::Config::infer().await?;

    #[cfg(feature = "watchdog")]
    let (_watchdog, reconcile) = {
        use reconcile_watchdog::Watchdog;
        use reconcile_watchdog::kube::{ApiServerCheck, guarded};

        let api_server = ApiServerCheck::every(Duration::from_secs(5));
        let watchdog = Watchdog::builder()
            .deadlines(Duration::from_secs(300))
            .probe_address("0.0.0.0:8081".parse()?)
            .watch_runtime(tokio::runtime::Handle::current())
            .api_server(api_server.clone())
            .start()?;
        api_server.watch(config.clone())?;
        let handle = watchdog.registry().controller("configmaps", "ConfigMap");
        // Kept until main returns: the probes answer as long as the watchdog lives.
        (watchdog, guarded(handle, reconcile))
    };

    let client = Client::try_from(config)?;
    Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, Arc::new(()))
        .for_each(|_| async {})
        .await;
    Ok(())
}
