//! The Lease API calls of the election: read the Lease, create it, and write it back
//! with the resourceVersion read, so that of two candidates writing at once one gets
//! 409 Conflict (client-go's `LeaseLock`, as a merge patch that carries the
//! resourceVersion precondition).

use std::time::{Duration, Instant};

use k8s::api::coordination::v1::{Lease, LeaseSpec};
use k8s::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s::jiff::Timestamp;
use kube_rs::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube_rs::{Api, Client};
use serde_json::json;

use super::decision::{Next, Observed, decide};

/// What one attempt found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// This candidate holds the lease now (acquired or renewed).
    Holding,
    /// Another candidate holds it, or won a race for it (holder then unknown).
    Following {
        /// The holder, when read.
        holder: Option<String>,
    },
}

/// One Lease, seen by one candidate.
#[derive(Clone)]
pub(crate) struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
}

impl LeaseLock {
    pub(crate) fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        lease_duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration,
        }
    }

    /// `leaseDurationSeconds`: whole seconds, rounded up, at least one.
    fn lease_seconds(&self) -> i32 {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
    }

    /// client-go's `tryAcquireOrRenew`: read the Lease (create it when missing), then
    /// renew it if held, take it if free or expired by this candidate's clock, or
    /// follow its holder.
    pub(crate) async fn try_acquire_or_renew(
        &self,
        observed: &mut Observed,
    ) -> Result<Attempt, kube_rs::Error> {
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            return self.create().await;
        };
        let spec = lease.spec.unwrap_or_default();
        let version = lease.metadata.resource_version;
        let changed_at = observed.saw(version.as_deref(), Instant::now());
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.lease_duration, Duration::from_secs);
        let now = MicroTime(Timestamp::now());
        let next = decide(
            &self.identity,
            spec.holder_identity.as_deref(),
            duration,
            changed_at,
            Instant::now(),
        );
        let written = match next {
            Next::Follow { holder } => {
                return Ok(Attempt::Following {
                    holder: Some(holder),
                });
            }
            Next::Renew => LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.lease_seconds()),
                renew_time: Some(now),
                ..LeaseSpec::default()
            },
            Next::Acquire => LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.lease_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(spec.lease_transitions.unwrap_or(0).saturating_add(1)),
                ..LeaseSpec::default()
            },
        };
        self.write(version, &written).await
    }

    async fn create(&self) -> Result<Attempt, kube_rs::Error> {
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.lease_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Attempt::Holding),
            // Another candidate created it first.
            Err(kube_rs::Error::Api(status)) if status.code == 409 => {
                Ok(Attempt::Following { holder: None })
            }
            Err(error) => Err(error),
        }
    }

    /// Writes `spec` over the Lease as it was at `version`; a 409 means another
    /// candidate wrote first.
    async fn write(
        &self,
        version: Option<String>,
        spec: &LeaseSpec,
    ) -> Result<Attempt, kube_rs::Error> {
        // Without a version read there is no precondition to give: a real server
        // always returns one, so this is a create racing a delete at worst.
        let patch = match version {
            Some(version) => json!({ "metadata": { "resourceVersion": version }, "spec": spec }),
            None => json!({ "spec": spec }),
        };
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(Attempt::Holding),
            Err(kube_rs::Error::Api(status)) if status.is_conflict() => {
                Ok(Attempt::Following { holder: None })
            }
            Err(error) => Err(error),
        }
    }

    /// Gives the lease up, if this candidate still holds it: an empty holder and a
    /// one-second duration, so that a follower takes it at its next retry.
    pub(crate) async fn release(&self) -> Result<bool, kube_rs::Error> {
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(false);
        }
        let now = MicroTime(Timestamp::now());
        let released = LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..LeaseSpec::default()
        };
        Ok(self
            .write(lease.metadata.resource_version, &released)
            .await?
            == Attempt::Holding)
    }

    /// The holder the Lease names now, if any.
    pub(crate) async fn holder(&self) -> Result<Option<String>, kube_rs::Error> {
        Ok(self
            .api
            .get_opt(&self.name)
            .await?
            .and_then(|lease| lease.spec)
            .and_then(|spec| spec.holder_identity)
            .filter(|holder| !holder.is_empty()))
    }
}
