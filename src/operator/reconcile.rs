//! One reconcile of a ConfigTemplate: its ConfigMap built from the spec, then its status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use super::crd::{ConfigTemplate, ConfigTemplateStatus};
use super::fault::{ANNOTATION, Fault};
use super::{Context, Error, MANAGED_BY};

/// How often a ConfigTemplate is reconciled without a change, to repair drift.
const RESYNC: Duration = Duration::from_secs(600);
/// When a failed reconcile is retried.
const RETRY: Duration = Duration::from_secs(5);

/// Makes the ConfigMap of `template` match its spec, then records that in its status.
pub async fn reconcile(template: Arc<ConfigTemplate>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = template.namespace().ok_or(Error::MissingNamespace)?;
    let name = template.name_any();
    if let Some(value) = template.annotations().get(ANNOTATION) {
        inject_fault(&ctx, &namespace, &name, value).await;
    }

    let owner = template
        .controller_owner_ref(&())
        .ok_or(Error::MissingUid)?;
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    let current = configmaps
        .get_opt(&name)
        .await
        .map_err(Error::kube("get the ConfigMap"))?;
    match current {
        None => {
            let configmap = desired(&template, &namespace, owner);
            configmaps
                .create(&PostParams::default(), &configmap)
                .await
                .map_err(Error::kube("create the ConfigMap"))?;
            tracing::info!(object = %format!("{namespace}/{name}"), "created the ConfigMap");
        }
        Some(current) => {
            if let Some(patch) = repair(&template, &current, owner) {
                configmaps
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .map_err(Error::kube("patch the ConfigMap"))?;
                tracing::info!(object = %format!("{namespace}/{name}"), "updated the ConfigMap");
            }
        }
    }

    let templates: Api<ConfigTemplate> = Api::namespaced(ctx.client.clone(), &namespace);
    if let Some(status) = next_status(&template, Timestamp::now()) {
        templates
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .map_err(Error::kube("patch the ConfigTemplate's status"))?;
    }
    Ok(Action::requeue(RESYNC))
}

/// Every failed reconcile, panics and watchdog cancellations included, is retried soon.
pub fn error_policy(_template: Arc<ConfigTemplate>, _error: &Error, _ctx: Arc<Context>) -> Action {
    Action::requeue(RETRY)
}

async fn inject_fault(ctx: &Context, namespace: &str, name: &str, value: &str) {
    let object = format!("{namespace}/{name}");
    match value.parse::<Fault>() {
        Ok(fault) if ctx.fault_injection => {
            tracing::warn!(%object, ?fault, "committing the fault the {ANNOTATION} annotation asks for");
            fault.commit().await;
        }
        Ok(_) => tracing::warn!(
            %object,
            "ignoring the {ANNOTATION} annotation: the operator runs without --enable-fault-injection"
        ),
        Err(error) => tracing::warn!(%object, %error, "ignoring the {ANNOTATION} annotation"),
    }
}

fn labels() -> BTreeMap<String, String> {
    let (key, value) = MANAGED_BY;
    BTreeMap::from([(key.to_owned(), value.to_owned())])
}

fn desired(template: &ConfigTemplate, namespace: &str, owner: OwnerReference) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(template.name_any()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels()),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(template.spec.data.clone()),
        ..ConfigMap::default()
    }
}

/// The merge patch that brings `current` back to the spec, if it has drifted.
fn repair(template: &ConfigTemplate, current: &ConfigMap, owner: OwnerReference) -> Option<Value> {
    let empty = BTreeMap::new();
    let data = current.data.as_ref().unwrap_or(&empty);
    let owned = current
        .owner_references()
        .iter()
        .any(|o| o.uid == owner.uid && o.controller == Some(true));
    let labelled = labels()
        .iter()
        .all(|(k, v)| current.labels().get(k) == Some(v));
    if *data == template.spec.data && owned && labelled {
        return None;
    }
    // A merge patch keeps keys it does not mention: null the ones the spec dropped.
    let mut patch_data: serde_json::Map<String, Value> = data
        .keys()
        .filter(|k| !template.spec.data.contains_key(*k))
        .map(|k| (k.clone(), Value::Null))
        .collect();
    for (k, v) in &template.spec.data {
        patch_data.insert(k.clone(), Value::String(v.clone()));
    }
    Some(json!({
        "metadata": { "labels": labels(), "ownerReferences": [owner] },
        "data": patch_data,
    }))
}

/// The status after a successful reconcile, if it differs from the current one.
fn next_status(template: &ConfigTemplate, now: Timestamp) -> Option<ConfigTemplateStatus> {
    let generation = template.meta().generation;
    let current = template.status.clone().unwrap_or_default();
    let ready = current.conditions.iter().find(|c| c.type_ == "Ready");
    let up_to_date = current.observed_generation == generation
        && ready.is_some_and(|c| c.status == "True" && c.observed_generation == generation);
    if up_to_date {
        return None;
    }
    let since = ready
        .filter(|c| c.status == "True")
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Some(ConfigTemplateStatus {
        observed_generation: generation,
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "ConfigMapUpToDate".into(),
            message: "the ConfigMap matches the spec".into(),
            observed_generation: generation,
            last_transition_time: since,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::crd::ConfigTemplateSpec;

    fn template(data: &[(&str, &str)], generation: i64) -> ConfigTemplate {
        let mut t = ConfigTemplate::new(
            "app",
            ConfigTemplateSpec {
                data: data
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            },
        );
        t.metadata.namespace = Some("ns".into());
        t.metadata.uid = Some("uid-1".into());
        t.metadata.generation = Some(generation);
        t
    }

    #[test]
    fn repair_nulls_dropped_keys_and_leaves_a_matching_configmap_alone() {
        let t = template(&[("a", "1")], 1);
        let owner = t.controller_owner_ref(&()).unwrap();
        let mut cm = desired(&t, "ns", owner.clone());
        assert_eq!(repair(&t, &cm, owner.clone()), None);
        cm.data = Some(BTreeMap::from([("old".into(), "x".into())]));
        let patch = repair(&t, &cm, owner).unwrap();
        assert_eq!(patch["data"], json!({"a": "1", "old": null}));
    }

    #[test]
    fn status_changes_only_with_the_generation() {
        let mut t = template(&[], 3);
        let now = Timestamp::now();
        let status = next_status(&t, now).unwrap();
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.conditions[0].status, "True");
        t.status = Some(status);
        assert_eq!(next_status(&t, now), None);
        t.metadata.generation = Some(4);
        let next = next_status(&t, now).unwrap();
        assert_eq!(next.observed_generation, Some(4));
    }
}
