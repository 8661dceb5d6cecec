//! Logs what a controller's output stream yields: reconcile errors at WARN with the
//! object, watch failures at ERROR.

use std::borrow::Borrow;

use crate::guard::ObjectKey;
use kube_rs::api::DynamicObject;
use kube_rs::runtime::controller::{self, Action};
use kube_rs::runtime::reflector::ObjectRef;
use kube_rs::runtime::watcher;

/// An error and its sources, joined by `: ` (as `anyhow` prints `{:#}`). A source
/// whose text its error already repeats (kube's errors do) is not repeated again.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

fn namespaced_name<K: kube_rs::Resource>(object: &ObjectRef<K>) -> ObjectKey {
    ObjectKey::new(object.namespace.as_deref(), &object.name)
}

/// The object a controller error names: boxed since kube 4, bare in kube 3.
fn erased_name(object: &impl Borrow<ObjectRef<DynamicObject>>) -> ObjectKey {
    namespaced_name(object.borrow())
}

pub(super) fn outcome<K, E>(
    controller: &str,
    kind: &str,
    item: Result<(ObjectRef<K>, Action), controller::Error<E, watcher::Error>>,
) where
    K: kube_rs::Resource,
    E: std::error::Error + 'static,
{
    match item {
        Ok((object, action)) => tracing::debug!(
            controller,
            kind,
            object = %namespaced_name(&object),
            ?action,
            "reconciled"
        ),
        Err(controller::Error::ReconcilerFailed(error, object)) => tracing::warn!(
            controller,
            kind,
            object = %erased_name(&object),
            error = %error_chain(&error),
            "reconcile failed"
        ),
        Err(controller::Error::ObjectNotFound(object)) => tracing::debug!(
            controller,
            kind,
            object = %erased_name(&object),
            "object gone before its reconcile"
        ),
        Err(controller::Error::QueueError(error)) => tracing::error!(
            controller,
            kind,
            error = %error_chain(&error),
            "watch failed; retrying with backoff"
        ),
        Err(error @ controller::Error::RunnerError(_)) => tracing::error!(
            controller,
            kind,
            error = %error_chain(&error),
            "controller runner failed"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle: {0}")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn chains_sources_without_repeating_them() {
        let error = Outer(Middle(std::io::Error::other("refused")));
        assert_eq!(error_chain(&error), "outer: middle: refused");
    }
}
