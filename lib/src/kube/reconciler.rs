//! The reconciler adapter: a user's reconcile under the guard, for their own
//! `Controller::run`.

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt;
use kube_rs::runtime::controller::Action;
use kube_rs::{Resource, ResourceExt};

use crate::guard::{self, ControllerHandle, Guarded, ObjectKey, Registry};

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
/// yours. [`Controllers`](super::Controllers) is built on it.
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

/// The handle of controller `name` in `registry`, its objects called by `K`'s kind (as
/// [`Controllers::add`](super::Controllers::add) calls them): what [`guarded`] takes.
/// For a kind known only at run time, name it yourself:
/// `registry.controller(name, &api_resource.kind)`.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use reconcile_watchdog::guard::Registry;
///
/// let registry = Registry::new(std::time::Duration::from_secs(300));
/// let handle = reconcile_watchdog::kube::controller_handle::<ConfigMap>(&registry, "configmaps");
/// assert!(format!("{handle:?}").contains(r#"kind: "ConfigMap""#));
/// ```
pub fn controller_handle<K>(registry: &Registry, name: &str) -> ControllerHandle
where
    K: Resource,
    K::DynamicType: Default,
{
    registry.controller(name, &K::kind(&K::DynamicType::default()))
}

/// The guard's key of a Kubernetes object: `namespace/name`, or `name` when
/// cluster-scoped.
pub fn object_key<K: Resource>(object: &K) -> ObjectKey {
    ObjectKey::new(object.namespace().as_deref(), &object.name_any())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s::api::core::v1::{ConfigMap, Namespace};
    use kube_rs::api::{ApiResource, DynamicObject, GroupVersionKind};

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
