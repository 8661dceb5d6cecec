//! The quarantine in Kubernetes: its ledger in a ConfigMap of the operator's namespace,
//! and the gate that skips the reconcile of a quarantined object.
//!
//! [`ConfigMapStore`] keeps the quarantine's ledger as one JSON value
//! of a ConfigMap (`reconcile-watchdog-quarantine` by default), written with optimistic
//! concurrency (a merge patch that names the `resourceVersion` it read), from the
//! quarantine's own thread, runtime and client, each call within a timeout. It needs
//! `get`, `create` and `patch` on ConfigMaps in that namespace alone (a Role).
//!
//! With the [`Keeper`] plugged into the watchdog
//! ([`Builder::quarantine`](crate::Builder::quarantine)), [`Controllers`](super::Controllers)
//! ask it before each reconcile: a quarantined object's reconcile is not called; it is
//! requeued for when the quarantine ends, with a Warning Event `ReconcileQuarantined`
//! on it (through the hang Events, when they are on), one WARN and the metrics.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use reconcile_watchdog::Watchdog;
//! use reconcile_watchdog::kube::quarantine::ConfigMapStore;
//! use reconcile_watchdog::quarantine::{Keeper, Quarantine};
//!
//! let keeper = Keeper::new(Quarantine::new(2, Duration::from_secs(3600)));
//! let watchdog = Watchdog::builder().quarantine(keeper.clone()).start()?;
//! let config = kube::Config::infer().await?;
//! keeper.start(ConfigMapStore::new(config, "operators", "reconcile-watchdog-quarantine"))?;
//! // Controllers::new(&watchdog, shutdown) now skips quarantined objects.
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s::api::core::v1::ConfigMap;
use k8s::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_rs::api::{Api, Patch, PatchParams, PostParams};
use kube_rs::runtime::controller::Action;
use kube_rs::{Resource, ResourceExt};

use super::events::HangEvents;
use crate::guard::ObjectKey;
use crate::quarantine::{Admission, Keeper, LIFT_ANNOTATION, Store, StoreError, Stored, Subject};

/// The ConfigMap's key that holds the ledger.
const KEY: &str = "ledger.json";

/// The longest one read or write may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Where a pod's service account names its namespace.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The operator's own namespace: `POD_NAMESPACE` (from the downward API), else its
/// service account's; `None` outside a cluster without either.
#[must_use]
pub fn own_namespace() -> Option<String> {
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok())
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
}

/// The ledger in a ConfigMap; see the [module](self).
pub struct ConfigMapStore {
    config: kube_rs::Config,
    namespace: String,
    name: String,
    /// Made on the quarantine's thread at its first call: a runtime cannot be driven
    /// from inside another.
    connected: Option<(tokio::runtime::Runtime, Api<ConfigMap>)>,
}

impl std::fmt::Debug for ConfigMapStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigMapStore")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ConfigMapStore {
    /// The ConfigMap `name` in `namespace` of the API server of `config`.
    #[must_use]
    pub fn new(config: kube_rs::Config, namespace: &str, name: &str) -> Self {
        Self {
            config,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            connected: None,
        }
    }

    fn connected(&mut self) -> Result<&(tokio::runtime::Runtime, Api<ConfigMap>), StoreError> {
        if self.connected.is_none() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| StoreError::Failed(Box::new(e)))?;
            let mut config = self.config.clone();
            config.connect_timeout = Some(CALL_TIMEOUT);
            config.read_timeout = Some(CALL_TIMEOUT);
            config.write_timeout = Some(CALL_TIMEOUT);
            // Built inside the runtime: the client's buffer spawns its worker there.
            let client = runtime
                .block_on(async { kube_rs::Client::try_from(config) })
                .map_err(|e| StoreError::Failed(Box::new(e)))?;
            let api = Api::namespaced(client, &self.namespace);
            self.connected = Some((runtime, api));
        }
        Ok(self.connected.as_ref().expect("connected above"))
    }
}

/// A read's error as the store's.
fn read_error(error: kube_rs::Error) -> StoreError {
    match &error {
        kube_rs::Error::Api(status) if status.code == 403 || status.code == 401 => {
            StoreError::Forbidden(Box::new(error))
        }
        _ => StoreError::Failed(Box::new(error)),
    }
}

/// A write's error as the store's: another writer came first (409), or deleted the
/// ConfigMap (404), is a conflict: read again.
fn write_error(error: kube_rs::Error) -> StoreError {
    match &error {
        kube_rs::Error::Api(status) if status.code == 409 || status.code == 404 => {
            StoreError::Conflict
        }
        _ => read_error(error),
    }
}

/// No answer within [`CALL_TIMEOUT`].
#[derive(Debug, thiserror::Error)]
#[error("no answer within {0:?}")]
struct TimedOut(Duration);

impl Store for ConfigMapStore {
    fn read(&mut self) -> Result<Stored, StoreError> {
        let name = self.name.clone();
        let (runtime, api) = self.connected()?;
        let got = runtime
            .block_on(async { tokio::time::timeout(CALL_TIMEOUT, api.get_opt(&name)).await })
            .map_err(|_| StoreError::Failed(Box::new(TimedOut(CALL_TIMEOUT))))?;
        let Some(configmap) = got.map_err(read_error)? else {
            return Ok(Stored::default());
        };
        let version = configmap.resource_version();
        let bytes = configmap
            .data
            .and_then(|mut data| data.remove(KEY))
            .map(String::into_bytes);
        Ok(Stored { bytes, version })
    }

    fn write(&mut self, bytes: &[u8], version: Option<&str>) -> Result<(), StoreError> {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let (name, namespace) = (self.name.clone(), self.namespace.clone());
        let (runtime, api) = self.connected()?;
        let call = async {
            match version {
                None => {
                    let configmap = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(name),
                            namespace: Some(namespace),
                            labels: Some(BTreeMap::from([
                                (
                                    "app.kubernetes.io/part-of".to_owned(),
                                    "reconcile-watchdog".to_owned(),
                                ),
                                (
                                    "app.kubernetes.io/component".to_owned(),
                                    "quarantine".to_owned(),
                                ),
                            ])),
                            ..ObjectMeta::default()
                        },
                        data: Some(BTreeMap::from([(KEY.to_owned(), text)])),
                        ..ConfigMap::default()
                    };
                    api.create(&PostParams::default(), &configmap)
                        .await
                        .map(drop)
                }
                Some(version) => {
                    // The resourceVersion in a patch is a precondition: 409 if another
                    // writer came first.
                    let patch = serde_json::json!({
                        "metadata": {"resourceVersion": version},
                        "data": {KEY: text},
                    });
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map(drop)
                }
            }
        };
        runtime
            .block_on(async { tokio::time::timeout(CALL_TIMEOUT, call).await })
            .map_err(|_| StoreError::Failed(Box::new(TimedOut(CALL_TIMEOUT))))?
            .map_err(write_error)
    }
}

/// What the gate reads of an object before its reconcile takes it.
pub(crate) struct Candidate {
    object: ObjectKey,
    uid: Option<String>,
    generation: Option<i64>,
    lift_asked: bool,
}

impl Candidate {
    pub(crate) fn of<K: Resource>(object: &K) -> Self {
        let meta = object.meta();
        Self {
            object: super::object_key(object),
            uid: meta.uid.clone(),
            generation: meta.generation,
            lift_asked: meta
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(LIFT_ANNOTATION)),
        }
    }
}

/// Asks the keeper before each reconcile of one controller.
#[derive(Clone)]
pub(crate) struct Gate {
    pub(crate) keeper: Arc<Keeper>,
    pub(crate) controller: Arc<str>,
    pub(crate) kind: Arc<str>,
    pub(crate) events: Option<Arc<HangEvents>>,
}

impl Gate {
    /// `None` to reconcile `candidate`; the action to return instead when it is
    /// quarantined.
    pub(crate) async fn admit(&self, candidate: Candidate) -> Option<Action> {
        self.keeper.loaded().await;
        let subject = Subject {
            controller: &self.controller,
            object: candidate.object.as_str(),
            uid: candidate.uid.as_deref(),
            generation: candidate.generation,
            lift_asked: candidate.lift_asked,
        };
        match self.keeper.admit(&subject, &self.kind, SystemTime::now()) {
            Admission::Reconcile { lifted } => {
                if let (Some(lifted), Some(events)) = (lifted, &self.events) {
                    events.announce(&self.controller, &candidate.object, &lifted);
                }
                None
            }
            Admission::Skip { requeue, announced } => {
                if let (Some(announced), Some(events)) = (announced, &self.events) {
                    events.announce(&self.controller, &candidate.object, &announced);
                }
                // At least a second: a requeue of nothing at the very end is a busy loop.
                Some(Action::requeue(requeue.max(Duration::from_secs(1))))
            }
        }
    }
}
