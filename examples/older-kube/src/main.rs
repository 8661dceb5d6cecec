//! A ConfigMap operator on kube 2 whose reconciles run under the watchdog's guard
//! (src/lib.rs), with the probes on :8081.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{Controller, controller::Action, watcher};
use kube::{Api, Client};
use older_kube_operator::{guarded, start_watchdog};

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// A reconcile that panicked, or that the watchdog cancelled.
    #[error(transparent)]
    Watchdog(#[from] reconcile_watchdog::guard::Error),
}

async fn reconcile(_cm: Arc<ConfigMap>, _ctx: Arc<()>) -> Result<Action, Error> {
    Ok(Action::await_change())
}

fn error_policy(_: Arc<ConfigMap>, _: &Error, _: Arc<()>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let watchdog = start_watchdog(Duration::from_secs(300), "0.0.0.0:8081".parse()?)?;
    // The name is what the hang reports and the probes call the controller.
    let configmaps = watchdog.registry().controller("configmaps", "ConfigMap");
    let client = Client::try_default().await?;
    Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
        .shutdown_on_signal()
        .run(
            move |cm, ctx| {
                let (configmaps, object) = (configmaps.clone(), Arc::clone(&cm));
                async move { guarded(&configmaps, &*object, reconcile(cm, ctx)).await }
            },
            error_policy,
            Arc::new(()),
        )
        .for_each(|_| async {})
        .await;
    Ok(())
}
