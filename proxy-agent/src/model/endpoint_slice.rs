//! The EndpointSlice (discovery.k8s.io/v1) as the API serves it, with only the
//! fields kube-proxy reads. k8s-openapi's type reads every field of every
//! endpoint (its pod reference, hostname, deprecated topology) into 352 bytes;
//! reading a first listing of 50,000 slices of 10 endpoints into it took about
//! 1.5 times the CPU of this type, on the cold start's critical path. The JSON
//! accepted is the same: the fields left out are skipped, and a missing field
//! reads as its default, as in k8s-openapi.

use std::borrow::Cow;

use k8s_openapi::{
    api::discovery::v1::{EndpointConditions, EndpointHints, EndpointPort},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndpointSlice {
    pub metadata: ObjectMeta,
    /// IPv4, IPv6 or FQDN.
    pub address_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<Endpoint>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<EndpointPort>>,
}

/// An endpoint of a slice; upstream uses only `addresses[0]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Endpoint {
    pub addresses: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<EndpointConditions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hints: Option<EndpointHints>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl kube::Resource for EndpointSlice {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "EndpointSlice".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "discovery.k8s.io".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "endpointslices".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slice as the EndpointSlice controller writes it, every field set.
    const FULL: &str = r#"{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice",
        "metadata":{"name":"web-abc","namespace":"ns","labels":{"kubernetes.io/service-name":"web"},
          "annotations":{"endpoints.kubernetes.io/last-change-trigger-time":"2026-11-27T10:00:00Z"},
          "ownerReferences":[{"apiVersion":"v1","kind":"Service","name":"web","uid":"u","controller":true}],
          "managedFields":[{"manager":"kube-controller-manager","operation":"Update","apiVersion":"discovery.k8s.io/v1","fieldsType":"FieldsV1","fieldsV1":{"f:ports":{}}}]},
        "addressType":"IPv4",
        "endpoints":[{"addresses":["198.18.1.10","198.18.1.11"],
          "conditions":{"ready":true,"serving":true,"terminating":false},
          "hints":{"forZones":[{"name":"z1"}],"forNodes":[{"name":"n1"}]},
          "nodeName":"n1","zone":"z1","hostname":"h",
          "targetRef":{"kind":"Pod","namespace":"ns","name":"web-1","uid":"v"},
          "deprecatedTopology":{"a":"b"}}],
        "ports":[{"name":"http","protocol":"TCP","port":8080,"appProtocol":"http"}]}"#;

    #[test]
    fn reads_what_k8s_openapi_reads_of_the_fields_kube_proxy_uses() {
        let ours: EndpointSlice = serde_json::from_str(FULL).unwrap();
        let theirs: k8s_openapi::api::discovery::v1::EndpointSlice =
            serde_json::from_str(FULL).unwrap();
        assert_eq!(ours.metadata, theirs.metadata);
        assert_eq!(ours.address_type, theirs.address_type);
        assert_eq!(ours.ports, theirs.ports);
        let (ours, theirs) = (&ours.endpoints.unwrap()[0], &theirs.endpoints.unwrap()[0]);
        assert_eq!(ours.addresses, theirs.addresses);
        assert_eq!(ours.conditions, theirs.conditions);
        assert_eq!(ours.hints, theirs.hints);
        assert_eq!(ours.node_name, theirs.node_name);
        assert_eq!(ours.zone, theirs.zone);
    }

    #[test]
    fn missing_fields_read_as_their_defaults_and_wrong_types_are_errors() {
        let bare: EndpointSlice = serde_json::from_str(r#"{"endpoints":[{}]}"#).unwrap();
        assert_eq!(bare.address_type, "");
        assert_eq!(bare.endpoints.unwrap()[0].addresses, Vec::<String>::new());
        let err = serde_json::from_str::<EndpointSlice>(r#"{"addressType":4}"#).unwrap_err();
        assert!(err.to_string().contains("invalid type"), "{err}");
    }

    #[test]
    fn the_api_path_is_the_endpointslices_collection() {
        use kube::Resource as _;
        assert_eq!(
            EndpointSlice::url_path(&(), Some("ns")),
            "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"
        );
        assert_eq!(EndpointSlice::api_version(&()), "discovery.k8s.io/v1");
    }
}
