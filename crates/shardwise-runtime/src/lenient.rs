//! Reading objects one at a time, so that one object that cannot be read never hides the others.
//!
//! The API server stores whatever passed the schema in force when it was written. An object
//! written under an older, looser schema (or by a client that skipped validation) may not decode
//! into a controller's types, and a LIST decodes all its objects at once: one such object fails
//! the whole list, and a watch built on it retries forever. [`Lenient`] decodes each object on its
//! own and never fails for what is in its body: it holds the object, or its metadata and the
//! reason it could not be read, with the path of the offending field.
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use shardwise_runtime::lenient::Lenient;
//!
//! let text = r#"{"apiVersion": "v1", "kind": "ConfigMap",
//!     "metadata": {"name": "odd", "namespace": "team-a"}, "data": {"replicas": 3}}"#;
//! let object: Lenient<ConfigMap> = serde_json::from_str(text).unwrap();
//! let bad = object.decoded().unwrap_err();
//! assert_eq!(bad.metadata.name.as_deref(), Some("odd"));
//! assert!(bad.reason.starts_with("data.replicas: "), "{}", bad.reason);
//! ```

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// An object that did not decode: who it is, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Undecodable {
    /// The object's metadata, which always decodes.
    pub metadata: ObjectMeta,
    /// `<field path>: <problem>`, e.g. `spec.weight: invalid value: integer `4294967296`,
    /// expected u32`.
    pub reason: String,
}

/// An object of type `K`, or what is known of it when it does not decode as `K`.
#[derive(Clone, Debug, PartialEq)]
pub struct Lenient<K>(Result<K, Box<Undecodable>>);

impl<K> Lenient<K> {
    /// The object, or why it could not be read.
    pub fn decoded(self) -> Result<K, Box<Undecodable>> {
        self.0
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        match serde_path_to_error::deserialize::<_, K>(&value) {
            Ok(object) => Ok(Self(Ok(object))),
            Err(e) => {
                // Metadata is the API server's own and always readable; without it there is
                // nobody to report to, so that alone is an error.
                let metadata = match value.get("metadata") {
                    Some(m) => ObjectMeta::deserialize(m).map_err(serde::de::Error::custom)?,
                    None => return Err(serde::de::Error::missing_field("metadata")),
                };
                let path = e.path().to_string();
                let reason = format!("{path}: {}", e.into_inner());
                Ok(Self(Err(Box::new(Undecodable { metadata, reason }))))
            }
        }
    }
}

/// Its scope is dynamic whatever `K`'s is, so that code generic over `K` can address it in a
/// namespace or across all of them.
impl<K: Resource> Resource for Lenient<K> {
    type DynamicType = K::DynamicType;
    type Scope = kube::core::DynamicResourceScope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match &self.0 {
            Ok(object) => object.meta(),
            Err(bad) => &bad.metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match &mut self.0 {
            Ok(object) => object.meta_mut(),
            Err(bad) => &mut bad.metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use serde_json::json;

    use super::*;

    fn deployment(spec: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "team", "resourceVersion": "7"}, "spec": spec})
    }

    fn selector() -> serde_json::Value {
        json!({"matchLabels": {"app": "d"}})
    }

    #[test]
    fn good_objects_decode_as_themselves() {
        let value = deployment(json!({"replicas": 3, "selector": selector(), "template": {}}));
        let lenient: Lenient<Deployment> = serde_json::from_value(value.clone()).unwrap();
        let strict: Deployment = serde_json::from_value(value).unwrap();
        assert_eq!(lenient.decoded(), Ok(strict));
    }

    #[test]
    fn a_bad_object_keeps_its_identity_and_names_its_field() {
        let cases = [
            (
                deployment(json!({"replicas": "three", "selector": selector(), "template": {}})),
                "spec.replicas: ",
            ),
            (
                deployment(json!({"selector": 5, "template": {}})),
                "spec.selector: ",
            ),
            (
                deployment(json!({"replicas": 1.5, "selector": selector(), "template": {}})),
                "spec.replicas: ",
            ),
        ];
        for (value, expected) in cases {
            let bad = serde_json::from_value::<Lenient<Deployment>>(value)
                .unwrap()
                .decoded()
                .unwrap_err();
            assert_eq!(bad.metadata.resource_version.as_deref(), Some("7"));
            assert!(bad.reason.starts_with(expected), "{}", bad.reason);
        }
    }

    #[test]
    fn a_list_with_one_bad_item_still_gives_the_others() {
        let list = json!({"items": [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": "v"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}, "data": {"k": 1}},
        ]});
        #[derive(Deserialize)]
        struct List {
            items: Vec<Lenient<k8s_openapi::api::core::v1::ConfigMap>>,
        }
        let items = serde_json::from_value::<List>(list).unwrap().items;
        let results: Vec<bool> = items.into_iter().map(|i| i.decoded().is_ok()).collect();
        assert_eq!(results, vec![true, false]);
        // Unreadable and without metadata, there is nothing to report on: that alone fails.
        assert!(
            serde_json::from_value::<Lenient<k8s_openapi::api::core::v1::ConfigMap>>(
                json!({"data": {"k": 1}})
            )
            .is_err()
        );
    }
}
