//! The reference operator's custom resource, `ConfigTemplate`, and its CRD as YAML.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the reference operator.
pub const GROUP: &str = "watchdog.example.com";

/// A template for one ConfigMap of the same name and namespace, which it owns.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "watchdog.example.com",
    version = "v1",
    kind = "ConfigTemplate",
    plural = "configtemplates",
    shortname = "ct",
    doc = "A template for one ConfigMap of the same name and namespace, which it owns (deleting it deletes the ConfigMap).",
    namespaced,
    status = "ConfigTemplateStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct ConfigTemplateSpec {
    /// The data of the generated ConfigMap.
    #[serde(default)]
    pub data: BTreeMap<String, String>,
}

/// What the operator last did with a ConfigTemplate.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigTemplateStatus {
    /// The generation of the spec the ConfigMap was last built from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The `Ready` condition: the ConfigMap matches the spec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The CRD, as `crd` prints it and `manifests/crd.yaml` holds it.
pub fn crd_yaml() -> Result<String, serde_saphyr::ser::Error> {
    serde_saphyr::to_string(&ConfigTemplate::crd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_names_the_contract() {
        let crd = ConfigTemplate::crd();
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.names.kind, "ConfigTemplate");
        assert_eq!(crd.spec.names.plural, "configtemplates");
        assert_eq!(crd.spec.names.short_names, Some(vec!["ct".to_owned()]));
        assert_eq!(crd.spec.scope, "Namespaced");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1");
        assert!(version.subresources.as_ref().unwrap().status.is_some());
    }
}
