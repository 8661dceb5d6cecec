//! [`Controllers`]: kube-runtime controllers run under the guard, with the
//! `informer-sync` latch, their output streams consumed, and a drain on shutdown.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures::future::{self, BoxFuture};
use futures::{FutureExt, StreamExt};
use kube_rs::Resource;
use kube_rs::runtime::Controller;
use kube_rs::runtime::controller::Action;
use kube_rs::runtime::reflector::ObjectRef;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::events::HangEvents;
use super::leader::Leadership;
use super::log;
use super::quarantine::{Candidate, Gate};
use super::reconciler::guarded;
use crate::guard::{self, ObjectKey, Registry};
use crate::health::{Health, Latch};
use crate::quarantine::Keeper;
use crate::watchdog::Watchdog;

/// The name of the readiness check that waits for every controller's store.
pub const INFORMER_SYNC: &str = "informer-sync";

/// The controllers of one process, run under the watchdog.
#[must_use = "controllers do nothing until `run` is awaited"]
pub struct Controllers {
    registry: Registry,
    latch: Arc<Latch>,
    shutdown: CancellationToken,
    leadership: Option<Leadership>,
    hang_events: Option<Arc<HangEvents>>,
    quarantine: Option<Arc<Keeper>>,
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
    /// With the watchdog's [quarantine](crate::Builder::quarantine), if it has one, the
    /// reconciles of quarantined objects are skipped.
    pub fn new(watchdog: &Watchdog, shutdown: CancellationToken) -> Self {
        let controllers =
            Self::with_parts(watchdog.registry().clone(), watchdog.health(), shutdown);
        match watchdog.quarantine() {
            Some(keeper) => controllers.quarantine(Arc::clone(keeper)),
            None => controllers,
        }
    }

    /// Like [`new`](Self::new), from a registry and health sets of your own.
    pub fn with_parts(registry: Registry, health: &Health, shutdown: CancellationToken) -> Self {
        Self {
            registry,
            latch: health
                .readiness_latch(INFORMER_SYNC, "the controllers' stores have not synced yet"),
            shutdown,
            leadership: None,
            hang_events: None,
            quarantine: None,
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

    /// Publishes the hang reports of the controllers added from now on as Events on
    /// their objects, through `events` (which the watchdog's builder took with
    /// [`hang_reports`](crate::Builder::hang_reports)): each controller tells it its
    /// objects' API version and kind, and its cache, for their uid. Call it before
    /// [`add`](Self::add).
    pub fn hang_events(mut self, events: Arc<HangEvents>) -> Self {
        self.hang_events = Some(events);
        self
    }

    /// Asks `keeper` before each reconcile of the controllers added from now on: a
    /// quarantined object's reconcile is not called, and it is requeued for when its
    /// quarantine ends ([`crate::quarantine`]); with [`hang_events`](Self::hang_events)
    /// it gets a `ReconcileQuarantined` Event, and `ReconcileQuarantineLifted` when
    /// that ends. [`new`](Self::new) takes the watchdog's own. Call it before
    /// [`add`](Self::add).
    pub fn quarantine(mut self, keeper: Arc<Keeper>) -> Self {
        self.quarantine = Some(keeper);
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
        self.add_with(
            name,
            &K::DynamicType::default(),
            controller,
            reconcile,
            error_policy,
            context,
        )
    }

    /// Like [`add`](Self::add), for a resource whose type is known at run time: a
    /// `DynamicObject` with its `ApiResource` as `dyntype`, say. Reports and metrics
    /// call it by its kind, and its Events name its API version and kind.
    pub fn add_with<K, Ctx, R, Fut, E, P>(
        mut self,
        name: &str,
        dyntype: &K::DynamicType,
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
        let kind = K::kind(dyntype).into_owned();
        let handle = self.registry.controller(name, &kind);
        let store = controller.store();
        if let Some(events) = &self.hang_events {
            events.controller(name, dyntype, Some(store.clone()));
        }
        let shutdown = self.shutdown.clone();
        let leadership = self.leadership.clone();
        let gate = self.quarantine.as_ref().map(|keeper| {
            let (store, dyntype) = (store.clone(), dyntype.clone());
            keeper.identify(name, move |key: &ObjectKey| {
                let (namespace, object) = match key.as_str().split_once('/') {
                    Some((namespace, object)) => (Some(namespace), object),
                    None => (None, key.as_str()),
                };
                let key = ObjectRef::<K>::new_with(object, dyntype.clone());
                let key = match namespace {
                    Some(namespace) => key.within(namespace),
                    None => key,
                };
                store
                    .get(&key)
                    .map(|object| (object.meta().uid.clone(), object.meta().generation))
            });
            Gate {
                keeper: Arc::clone(keeper),
                controller: name.into(),
                kind: kind.as_str().into(),
                events: self.hang_events.clone(),
            }
        });
        // The lease and quarantine gates run inside the guard, so a reconcile refused
        // for want of the lease, or skipped in quarantine, is as visible as any other.
        let gated = move |object: Arc<K>, context: Arc<Ctx>| {
            let led = leadership.as_ref().is_none_or(Leadership::is_held);
            let admission = gate
                .clone()
                .map(|gate| (gate, Candidate::of(object.as_ref())));
            let reconcile = reconcile(object, context);
            async move {
                if !led {
                    tracing::debug!("not reconciling: the lease is no longer held");
                    return Ok(Action::await_change());
                }
                if let Some((gate, candidate)) = admission
                    && let Some(action) = gate.admit(candidate).await
                {
                    return Ok(action);
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
            quarantine,
            ..
        } = self;
        // A new leader's controllers honour what the old one recorded.
        if let Some(keeper) = &quarantine {
            keeper.reload();
        }
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
