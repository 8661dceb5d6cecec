//! The reference operator of `run`: ConfigTemplates that each own a ConfigMap.

pub mod crd;
pub mod fault;
mod reconcile;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client};

pub use crd::{ConfigTemplate, crd_yaml};
pub use reconcile::{error_policy, reconcile};
use reconcile_watchdog::guard;
use reconcile_watchdog::kube::Controllers;

/// The controller's name: in hang reports, probes and `--reconcile-deadline-for`.
pub const CONTROLLER: &str = "configtemplates";

/// The label on every ConfigMap the operator makes, so it watches only those.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "reconcile-watchdog");

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("failed to {action}")]
    Kube {
        /// What the call was for.
        action: &'static str,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
    /// The reconcile panicked or the watchdog cancelled it.
    #[error(transparent)]
    Watchdog(#[from] guard::Error),
    /// A ConfigTemplate without a namespace (the CRD is namespaced, so a server bug).
    #[error("the ConfigTemplate has no namespace")]
    MissingNamespace,
    /// A ConfigTemplate without a uid cannot own its ConfigMap.
    #[error("the ConfigTemplate has no uid to own its ConfigMap by")]
    MissingUid,
}

impl Error {
    fn kube(action: &'static str) -> impl FnOnce(kube::Error) -> Self {
        move |source| Self::Kube { action, source }
    }
}

/// What every reconcile shares.
#[derive(Clone)]
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Whether the fault annotation is honoured (`--enable-fault-injection`).
    pub fault_injection: bool,
}

/// Tells `watches` what the ConfigTemplate controller watches: its ConfigTemplates and
/// the ConfigMaps it owns. Call it when the controller starts.
pub fn expect_watches(watches: &reconcile_watchdog::kube::watches::Watches) {
    use reconcile_watchdog::kube::watches::resource;
    watches.expect(CONTROLLER, &resource::<ConfigTemplate>(&()));
    watches.expect(CONTROLLER, &resource::<ConfigMap>(&()));
}

/// Adds the ConfigTemplate controller, watching `namespace` or every namespace, to
/// `controllers`.
pub fn add_to(controllers: Controllers, ctx: Context, namespace: Option<&str>) -> Controllers {
    let client = ctx.client.clone();
    let (templates, configmaps) = match namespace {
        Some(ns) => (
            Api::<ConfigTemplate>::namespaced(client.clone(), ns),
            Api::<ConfigMap>::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    let (key, value) = MANAGED_BY;
    let controller = Controller::new(templates, watcher::Config::default()).owns(
        configmaps,
        watcher::Config::default().labels(&format!("{key}={value}")),
    );
    controllers.add(
        CONTROLLER,
        controller,
        reconcile,
        error_policy,
        std::sync::Arc::new(ctx),
    )
}
