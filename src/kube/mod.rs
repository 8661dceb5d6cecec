//! Runs kube-runtime controllers with every reconcile under the watchdog's guard.
//!
//! [`Controllers`] takes each [`Controller`] with its reconcile, error policy and
//! context, as `Controller::run` would, and:
//! - wraps every reconcile in the guard of its controller (the object as
//!   `namespace/name`, the resource's kind), so a hang is seen, reported and probed;
//! - turns a panic or a watchdog cancellation into an error of the user's own type
//!   (`E: From<guard::Error>`), which the untouched error policy then sees;
//! - consumes the output stream, logging reconcile errors at WARN with the object;
//! - releases the `informer-sync` readiness latch once every controller's store has
//!   synced;
//! - stops taking new work when the shutdown token is cancelled, and returns once the
//!   reconciles in flight have finished (the caller bounds that wait);
//! - under [`leader`] election, reconciles only while the lease is held
//!   ([`Controllers::only_while`]).
//!
//! [`guarded`] is the primitive under it, for an operator that runs its own
//! `Controller::run` pipeline. `docs/embedding.md` shows both ways, with a shutdown on
//! SIGTERM supervised from a plain thread ([`crate::shutdown`]); its examples compile as
//! doc tests.

pub mod apiserver;
pub mod leader;
mod log;
pub mod watches;

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use ::kube::runtime::Controller;
use ::kube::runtime::controller::Action;
use ::kube::{Resource, ResourceExt};
use futures::future::{self, BoxFuture};
use futures::{FutureExt, StreamExt};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::guard::{self, ControllerHandle, Guarded, ObjectKey, Registry};
use crate::health::{Health, Latch};
use crate::watchdog::Watchdog;
use leader::Leadership;

pub use log::error_chain;

/// The name of the readiness check that waits for every controller's store.
pub const INFORMER_SYNC: &str = "informer-sync";

/// The controllers of one process, run under the watchdog.
#[must_use = "controllers do nothing until `run` is awaited"]
pub struct Controllers {
    registry: Registry,
    latch: Arc<Latch>,
    shutdown: CancellationToken,
    leadership: Option<Leadership>,
    names: Vec<String>,
    runs: Vec<BoxFuture<'static, ()>>,
    synced: Vec<BoxFuture<'static, bool>>,
}

impl Debug for Controllers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controllers")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl Controllers {
    /// Controllers guarded by `watchdog`'s registry, with an `informer-sync` latch in
    /// its readiness set; they stop taking new work once `shutdown` is cancelled.
    pub fn new(watchdog: &Watchdog, shutdown: CancellationToken) -> Self {
        Self::with_parts(watchdog.registry().clone(), watchdog.health(), shutdown)
    }

    /// Like [`new`](Self::new), from a registry and health sets of your own.
    pub fn with_parts(registry: Registry, health: &Health, shutdown: CancellationToken) -> Self {
        Self {
            registry,
            latch: health
                .readiness_latch(INFORMER_SYNC, "the controllers' stores have not synced yet"),
            shutdown,
            leadership: None,
            names: Vec::new(),
            runs: Vec::new(),
            synced: Vec::new(),
        }
    }

    /// Reconciles only while `leadership` holds the lease: a reconcile that starts after
    /// the lease's renew deadline passed unrenewed (the leader lost it, or was frozen)
    /// writes nothing and ends at once, while the election stops the controllers. Call
    /// it before [`add`](Self::add).
    pub fn only_while(mut self, leadership: Leadership) -> Self {
        self.leadership = Some(leadership);
        self
    }

    /// Adds `controller`, called `name` (the name deadlines and hang reports use), to
    /// run `reconcile` under the guard and `error_policy` unchanged.
    ///
    /// A reconcile that panics or that the watchdog cancels resolves to
    /// `E::from(guard::Error)`, so the error policy sees it like any other error.
    /// (`P: Sync` because kube shares the error policy between the controller's tasks,
    /// and the controllers run as one `Send` future; [`guarded`] alone asks neither.)
    pub fn add<K, Ctx, R, Fut, E, P>(
        self,
        name: &str,
        controller: Controller<K>,
        reconcile: R,
        error_policy: P,
        context: Arc<Ctx>,
    ) -> Self
    where
        K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Debug + Unpin + Send + Sync,
        Ctx: Send + Sync + 'static,
        R: FnMut(Arc<K>, Arc<Ctx>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::error::Error + From<guard::Error> + Send + 'static,
        P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
    {
        let kind = K::kind(&K::DynamicType::default()).into_owned();
        self.add_with(name, &kind, controller, reconcile, error_policy, context)
    }

    /// Like [`add`](Self::add), for a resource whose kind is known at run time (a
    /// `DynamicObject` with its `ApiResource`, say): `kind` is what reports and metrics
    /// call it, for instance `api_resource.kind`.
    pub fn add_with<K, Ctx, R, Fut, E, P>(
        mut self,
        name: &str,
        kind: &str,
        controller: Controller<K>,
        mut reconcile: R,
        error_policy: P,
        context: Arc<Ctx>,
    ) -> Self
    where
        K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Debug + Unpin + Send + Sync,
        Ctx: Send + Sync + 'static,
        R: FnMut(Arc<K>, Arc<Ctx>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::error::Error + From<guard::Error> + Send + 'static,
        P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
    {
        let kind = kind.to_owned();
        let handle = self.registry.controller(name, &kind);
        let store = controller.store();
        let shutdown = self.shutdown.clone();
        let leadership = self.leadership.clone();
        // The lease gate runs inside the guard, so a reconcile refused for want of the
        // lease is as visible as any other.
        let gated = move |object: Arc<K>, context: Arc<Ctx>| {
            let led = leadership.as_ref().is_none_or(Leadership::is_held);
            let reconcile = reconcile(object, context);
            async move {
                if !led {
                    tracing::debug!("not reconciling: the lease is no longer held");
                    return Ok(Action::await_change());
                }
                reconcile.await
            }
        };
        let guarded = guarded(handle, gated);
        let stream = controller
            .graceful_shutdown_on(shutdown.cancelled_owned())
            .run(guarded, error_policy, context);
        let name_owned = name.to_owned();
        self.runs.push(
            async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(item) = stream.next().await {
                    log::outcome(&name_owned, &kind, item);
                }
                tracing::info!(controller = %name_owned, "controller stopped");
            }
            .boxed(),
        );
        self.synced
            .push(async move { store.wait_until_ready().await.is_ok() }.boxed());
        self.names.push(name.to_owned());
        self
    }

    /// Runs every controller until the shutdown token is cancelled and their
    /// in-flight reconciles have finished.
    pub async fn run(self) {
        let Self {
            latch,
            names,
            runs,
            synced,
            ..
        } = self;
        let sync = async move {
            let all = future::join_all(synced).await;
            if !all.is_empty() && all.into_iter().all(|ready| ready) {
                latch.release();
                tracing::info!(controllers = %names.join(","), "every controller's store has synced; ready");
            }
        };
        let runs = future::join_all(runs);
        futures::pin_mut!(runs, sync);
        if let future::Either::Right(((), runs)) = future::select(runs, sync).await {
            runs.await;
        }
    }
}

/// The future of one guarded reconcile: the user's reconcile under its guard, with a
/// panic or a cancellation by the watchdog turned into the user's error type.
pub type GuardedReconcile<Fut, E> = futures::future::Map<
    Guarded<Fut>,
    fn(Result<Result<Action, E>, guard::Error>) -> Result<Action, E>,
>;

/// Wraps `reconcile` for `Controller::run`: every call runs under a guard of `handle`
/// (the object as `namespace/name`), and a reconcile that panics or that the watchdog
/// cancels resolves to `E::from(guard::Error)`, which the error policy then sees.
///
/// The smallest way in: the controller, its streams, its shutdown and its output stay
/// yours. [`Controllers`] is built on it.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use k8s_openapi::api::core::v1::ConfigMap;
/// # use kube::runtime::{Controller, controller::Action, watcher};
/// # use futures::StreamExt;
/// # #[derive(Debug, thiserror::Error)]
/// # enum Error { #[error(transparent)] Watchdog(#[from] reconcile_watchdog::guard::Error) }
/// # async fn reconcile(_: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, Error> { Ok(Action::await_change()) }
/// # fn error_policy(_: Arc<ConfigMap>, _: &Error, _: Arc<()>) -> Action { Action::await_change() }
/// # async fn example(watchdog: reconcile_watchdog::Watchdog, client: kube::Client) {
/// let handle = watchdog.registry().controller("configmaps", "ConfigMap");
/// Controller::new(kube::Api::<ConfigMap>::all(client), watcher::Config::default())
///     .shutdown_on_signal()
///     .run(reconcile_watchdog::kube::guarded(handle, reconcile), error_policy, Arc::new(()))
///     .for_each(|_| async {})
///     .await;
/// # }
/// ```
pub fn guarded<K, Ctx, R, Fut, E>(
    handle: ControllerHandle,
    mut reconcile: R,
) -> impl FnMut(Arc<K>, Arc<Ctx>) -> GuardedReconcile<Fut, E>
where
    K: Resource,
    R: FnMut(Arc<K>, Arc<Ctx>) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    E: From<guard::Error>,
{
    move |object: Arc<K>, context: Arc<Ctx>| {
        let key = object_key(object.as_ref());
        handle
            .guard(key, reconcile(object, context))
            .map(into_user_error as fn(_) -> _)
    }
}

fn into_user_error<E: From<guard::Error>>(
    result: Result<Result<Action, E>, guard::Error>,
) -> Result<Action, E> {
    result.unwrap_or_else(|error| Err(E::from(error)))
}

/// The guard's key of a Kubernetes object: `namespace/name`, or `name` when
/// cluster-scoped.
pub fn object_key<K: Resource>(object: &K) -> ObjectKey {
    ObjectKey::new(object.namespace().as_deref(), &object.name_any())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ::kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};

    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum TestError {
        #[error(transparent)]
        Watchdog(#[from] guard::Error),
    }

    #[tokio::test]
    async fn guarded_runs_dynamic_objects_under_the_guard_and_turns_panics_into_errors() {
        // A kind known only at run time: no `DynamicType: Default` needed.
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"));
        let registry = Registry::new(Duration::from_secs(60));
        let mut reconcile = guarded(
            registry.controller("widgets", &resource.kind),
            |object: Arc<DynamicObject>, _: Arc<()>| async move {
                tokio::task::yield_now().await;
                assert!(object.name_any() != "boom", "a panic on purpose");
                Ok::<_, TestError>(Action::await_change())
            },
        );

        let widget = DynamicObject::new("app", &resource).within("prod");
        let mut running = Box::pin(reconcile(Arc::new(widget), Arc::new(())));
        assert!(futures::poll!(running.as_mut()).is_pending());
        let in_flight = registry.snapshot();
        assert_eq!(in_flight.len(), 1);
        assert_eq!(in_flight[0].object.as_str(), "prod/app");
        assert_eq!(&*in_flight[0].kind, "Widget");
        assert_eq!(&*in_flight[0].controller, "widgets");
        assert!(running.await.is_ok());
        assert!(registry.is_empty());

        let boom = DynamicObject::new("boom", &resource).within("prod");
        let result = reconcile(Arc::new(boom), Arc::new(())).await;
        assert!(
            matches!(
                result,
                Err(TestError::Watchdog(guard::Error::Panicked { .. }))
            ),
            "{result:?}"
        );
        assert!(registry.is_empty());
    }

    #[test]
    fn object_keys_are_namespace_slash_name() {
        let mut configmap = ConfigMap::default();
        configmap.metadata.name = Some("app".into());
        configmap.metadata.namespace = Some("prod".into());
        assert_eq!(object_key(&configmap).as_str(), "prod/app");
        let mut namespace = Namespace::default();
        namespace.metadata.name = Some("prod".into());
        assert_eq!(object_key(&namespace).as_str(), "prod");
    }
}
