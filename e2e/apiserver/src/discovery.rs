//! `/version`, legacy and aggregated discovery, and a minimal OpenAPI v3 that tells kubectl
//! which query parameters PATCH accepts.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::registry::{Registry, ResourceDef, VersionDef};

pub const SERVER_VERSION: (&str, &str) = ("1", "33");

pub fn version() -> Value {
    json!({
        "major": SERVER_VERSION.0,
        "minor": SERVER_VERSION.1,
        "emulationMajor": SERVER_VERSION.0,
        "emulationMinor": SERVER_VERSION.1,
        "gitVersion": format!("v{}.{}.0-shardwise-test", SERVER_VERSION.0, SERVER_VERSION.1),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// Which aggregated-discovery version the client accepts first, if any.
pub fn aggregated_version(accept: &str) -> Option<&'static str> {
    for entry in accept.split(',') {
        let params: BTreeMap<&str, &str> = entry
            .split(';')
            .skip(1)
            .filter_map(|p| p.trim().split_once('='))
            .collect();
        let base = entry.split(';').next().unwrap_or("").trim();
        if params.get("as") == Some(&"APIGroupDiscoveryList")
            && params.get("g") == Some(&"apidiscovery.k8s.io")
        {
            match params.get("v") {
                Some(&"v2") => return Some("v2"),
                Some(&"v2beta1") => return Some("v2beta1"),
                _ => continue,
            }
        }
        if base == "application/json" || base == "*/*" || base.is_empty() {
            return None;
        }
    }
    None
}

pub fn aggregated_content_type(version: &str) -> String {
    format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
}

pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let gvs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    let preferred = gvs.first().cloned().unwrap_or(Value::Null);
    json!({"name": name, "versions": gvs, "preferredVersion": preferred})
}

pub fn group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .into_iter()
        .filter(|g| !g.name.is_empty())
        .map(|g| group_json(&g.name, &g.versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(registry: &Registry, name: &str) -> Option<Value> {
    let g = registry
        .groups()
        .into_iter()
        .find(|g| g.name == name && !name.is_empty())?;
    let mut v = group_json(&g.name, &g.versions);
    if let Some(m) = v.as_object_mut() {
        m.insert("kind".into(), "APIGroup".into());
        m.insert("apiVersion".into(), "v1".into());
    }
    Some(v)
}

const SUBRESOURCE_VERBS: [&str; 3] = ["get", "patch", "update"];

fn subresources(
    def: &ResourceDef,
    v: &VersionDef,
) -> Vec<(&'static str, (String, String, String))> {
    let mut out = Vec::new();
    if v.scale.is_some() {
        out.push(("scale", ("autoscaling".into(), "v1".into(), "Scale".into())));
    }
    if v.status {
        out.push((
            "status",
            (def.gr.group.clone(), v.name.clone(), def.kind.clone()),
        ));
    }
    out
}

/// `APIResourceList` for one group version, or None if nothing is served there.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let defs = registry.resources_in(group, version);
    if defs.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for def in &defs {
        let Some(v) = def.version(version) else {
            continue;
        };
        let mut r = json!({
            "name": def.gr.resource,
            "singularName": def.singular,
            "namespaced": def.namespaced,
            "kind": def.kind,
            "verbs": def.verbs(),
        });
        if let Some(m) = r.as_object_mut() {
            if !def.short_names.is_empty() {
                m.insert("shortNames".into(), def.short_names.clone().into());
            }
            if !def.categories.is_empty() {
                m.insert("categories".into(), def.categories.clone().into());
            }
        }
        resources.push(r);
        for (sub, (g, ver, kind)) in subresources(def, v) {
            let mut s = json!({
                "name": format!("{}/{sub}", def.gr.resource),
                "singularName": "",
                "namespaced": def.namespaced,
                "kind": kind,
                "verbs": SUBRESOURCE_VERBS,
            });
            if (g.as_str(), ver.as_str()) != (group, version)
                && let Some(m) = s.as_object_mut()
            {
                m.insert("group".into(), g.into());
                m.insert("version".into(), ver.into());
            }
            resources.push(s);
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn resource_discovery(def: &Arc<ResourceDef>, v: &VersionDef) -> Value {
    let subs: Vec<Value> = subresources(def, v)
        .into_iter()
        .map(|(sub, (g, ver, kind))| {
            json!({
                "subresource": sub,
                "responseKind": {"group": g, "version": ver, "kind": kind},
                "verbs": SUBRESOURCE_VERBS,
            })
        })
        .collect();
    let mut r = json!({
        "resource": def.gr.resource,
        "responseKind": {"group": def.gr.group, "version": v.name, "kind": def.kind},
        "scope": if def.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": def.singular,
        "verbs": def.verbs(),
    });
    if let Some(m) = r.as_object_mut() {
        if !def.short_names.is_empty() {
            m.insert("shortNames".into(), def.short_names.clone().into());
        }
        if !def.categories.is_empty() {
            m.insert("categories".into(), def.categories.clone().into());
        }
        if !subs.is_empty() {
            m.insert("subresources".into(), subs.into());
        }
    }
    r
}

/// Aggregated discovery (`APIGroupDiscoveryList`) for `/api` (core) or `/apis` (all others).
pub fn aggregated(registry: &Registry, core: bool, api_version: &str) -> Value {
    let items: Vec<Value> = registry
        .groups()
        .into_iter()
        .filter(|g| g.name.is_empty() == core)
        .map(|g| {
            let versions: Vec<Value> = g
                .versions
                .iter()
                .map(|ver| {
                    let resources: Vec<Value> = registry
                        .resources_in(&g.name, ver)
                        .iter()
                        .filter_map(|d| d.version(ver).map(|v| resource_discovery(d, v)))
                        .collect();
                    json!({"version": ver, "resources": resources, "freshness": "Current"})
                })
                .collect();
            let metadata = if g.name.is_empty() {
                json!({"creationTimestamp": null})
            } else {
                json!({"name": g.name, "creationTimestamp": null})
            };
            json!({"metadata": metadata, "versions": versions})
        })
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{api_version}"),
        "metadata": {},
        "items": items,
    })
}

fn openapi_key(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn doc_hash(registry: &Registry, group: &str, version: &str) -> String {
    let mut h = DefaultHasher::new();
    for def in registry.resources_in(group, version) {
        def.gr.hash(&mut h);
        def.kind.hash(&mut h);
        def.namespaced.hash(&mut h);
    }
    format!("{:016X}", h.finish())
}

/// The OpenAPI v3 index: one document per served group version.
pub fn openapi_index(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for g in registry.groups() {
        for v in &g.versions {
            let key = openapi_key(&g.name, v);
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={}", doc_hash(registry, &g.name, v))}),
            );
        }
    }
    json!({"paths": paths})
}

/// A minimal OpenAPI v3 document for one group version: a PATCH operation per resource that
/// declares the query parameters, with no schemas.
pub fn openapi_doc(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let defs = registry.resources_in(group, version);
    if defs.is_empty() {
        return None;
    }
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let params: Vec<Value> = ["dryRun", "fieldManager", "fieldValidation", "force"]
        .iter()
        .map(|p| json!({"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
        .collect();
    let mut paths = serde_json::Map::new();
    for def in &defs {
        let path = if def.namespaced {
            format!(
                "{prefix}/namespaces/{{namespace}}/{}/{{name}}",
                def.gr.resource
            )
        } else {
            format!("{prefix}/{}/{{name}}", def.gr.resource)
        };
        paths.insert(
            path,
            json!({"patch": {
                "operationId": format!("patch{}", def.kind),
                "parameters": params,
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": def.kind},
            }}),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", SERVER_VERSION.0, SERVER_VERSION.1)},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(aggregated_version(kubectl), Some("v2"));
        assert_eq!(aggregated_version("application/json"), None);
        assert_eq!(aggregated_version(""), None);
        assert_eq!(
            aggregated_version(
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
            ),
            Some("v2beta1")
        );
    }

    #[test]
    fn statefulsets_expose_scale() {
        let reg = Registry::with_builtins();
        let list = resource_list(&reg, "apps", "v1").unwrap();
        let scale = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "statefulsets/scale")
            .unwrap();
        assert_eq!(scale["group"], "autoscaling");
        assert_eq!(scale["kind"], "Scale");
        let agg = aggregated(&reg, false, "v2");
        assert!(
            agg["items"]
                .as_array()
                .unwrap()
                .iter()
                .all(|i| i["metadata"]["name"] != "")
        );
        assert!(openapi_doc(&reg, "", "v1").unwrap()["paths"]["/api/v1/namespaces/{namespace}/configmaps/{name}"]["patch"].is_object());
    }
}
