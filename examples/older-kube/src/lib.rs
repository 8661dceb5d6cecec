//! A kube 2 operator's wiring of the watchdog's core: no `kube` feature, so each
//! reconcile goes through its controller's guard by hand. The code between the markers
//! is what docs/older-kube.md shows (the repository's `tests/it/docs.rs` checks that
//! they are the same).

// docs: begin wiring
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use kube::Resource;
use reconcile_watchdog::guard::{self, ControllerHandle, ObjectKey};
use reconcile_watchdog::{Watchdog, watchdog};

/// Starts the watchdog: the probes on `probe_address`, and the heartbeat of the runtime
/// this is called on (the `runtime` liveness check). Call it inside your runtime.
pub fn start_watchdog(
    deadline: Duration,
    probe_address: SocketAddr,
) -> Result<Watchdog, watchdog::Error> {
    Watchdog::builder()
        .deadlines(deadline)
        .probe_address(probe_address)
        .watch_runtime(tokio::runtime::Handle::current())
        .start()
}

/// Runs one reconcile of `object` under `controller`'s guard, keyed `namespace/name`: past
/// its deadline it fails liveness and gets a hang report; a panic, or a cancellation by
/// the watchdog, comes back as your error.
pub async fn guarded<K, T, E>(
    controller: &ControllerHandle,
    object: &K,
    reconcile: impl Future<Output = Result<T, E>>,
) -> Result<T, E>
where
    K: Resource,
    E: From<guard::Error>,
{
    let meta = object.meta();
    let key = ObjectKey::new(
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or(""),
    );
    match controller.guard(key, reconcile).await {
        Ok(result) => result,
        Err(error) => Err(E::from(error)),
    }
}
// docs: end wiring
