//! The health of an applied object, read from the object as its cluster serves it, following
//! the conventions of kstatus (kubernetes-sigs/cli-utils): what generation the object's
//! controller observed, the `Reconciling`, `Stalled` and `Ready` conditions, and per-kind rules
//! for the built-in workloads. Pure; fed JSON values in tests.
//!
//! kstatus says Current, InProgress, Failed or Terminating; shardwise says Healthy, Progressing
//! (also while terminating), Degraded, and adds Missing (the object does not exist) and Unknown
//! (its cluster's cache cannot tell).

use serde_json::Value;
use shardwise_api::Health;

/// An object's health and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assessment {
    pub health: Health,
    pub message: String,
}

fn healthy(message: impl Into<String>) -> Assessment {
    Assessment {
        health: Health::Healthy,
        message: message.into(),
    }
}

fn progressing(message: impl Into<String>) -> Assessment {
    Assessment {
        health: Health::Progressing,
        message: message.into(),
    }
}

fn degraded(message: impl Into<String>) -> Assessment {
    Assessment {
        health: Health::Degraded,
        message: message.into(),
    }
}

/// An integer field at `path`, or `default` when it is absent or not an integer.
fn int(object: &Value, path: &[&str], default: i64) -> i64 {
    path.iter()
        .try_fold(object, |v, key| v.get(key))
        .and_then(Value::as_i64)
        .unwrap_or(default)
}

/// A string field at `path`, or `""`.
fn text<'a>(object: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(object, |v, key| v.get(key))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// One entry of `status.conditions`.
struct Condition<'a> {
    type_: &'a str,
    status: &'a str,
    reason: &'a str,
    message: &'a str,
}

fn conditions(object: &Value) -> Vec<Condition<'_>> {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|c| Condition {
                    type_: text(c, &["type"]),
                    status: text(c, &["status"]),
                    reason: text(c, &["reason"]),
                    message: text(c, &["message"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The health of `object`, a live object of `apiVersion` and `kind` as served.
pub fn assess(object: &Value) -> Assessment {
    if object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        return progressing("being deleted");
    }
    let kind = text(object, &["kind"]);
    if let Some(generation) = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        && let Some(observed) = object
            .pointer("/status/observedGeneration")
            .and_then(Value::as_i64)
        && observed != generation
    {
        return progressing(format!(
            "{kind} generation is {generation}, but the latest observed is {observed}"
        ));
    }
    for c in conditions(object) {
        match (c.type_, c.status) {
            ("Reconciling", "True") => return progressing(or_reason(c.message, c.reason)),
            ("Stalled", "True") => return degraded(or_reason(c.message, c.reason)),
            _ => {}
        }
    }
    let group = text(object, &["apiVersion"])
        .rsplit_once('/')
        .map(|(group, _)| group)
        .unwrap_or_default();
    match (group, kind) {
        ("apps" | "extensions", "Deployment") => deployment(object),
        ("apps", "StatefulSet") => stateful_set(object),
        ("apps" | "extensions", "DaemonSet") => daemon_set(object),
        ("apps" | "extensions", "ReplicaSet") => replica_set(object),
        ("batch", "Job") => job(object),
        ("", "Pod") => pod(object),
        ("", "PersistentVolumeClaim") => claim(object),
        ("", "Service") => service(object),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => definition(object),
        ("", "Secret" | "ConfigMap") | ("batch", "CronJob") | ("policy", "PodDisruptionBudget") => {
            healthy("always ready")
        }
        _ => match conditions(object).into_iter().find(|c| c.type_ == "Ready") {
            Some(c) if c.status == "True" => healthy("Ready"),
            Some(c) => progressing(or_reason(c.message, c.reason)),
            None => healthy("current"),
        },
    }
}

fn or_reason(message: &str, reason: &str) -> String {
    if message.is_empty() {
        reason.to_string()
    } else {
        message.to_string()
    }
}

fn deployment(d: &Value) -> Assessment {
    let deadline = d
        .pointer("/spec/progressDeadlineSeconds")
        .and_then(Value::as_i64);
    let mut progressed = deadline.is_none_or(|s| s == i64::from(i32::MAX));
    let mut available = false;
    for c in conditions(d) {
        match (c.type_, c.status, c.reason) {
            ("Progressing", _, "ProgressDeadlineExceeded") => {
                return degraded("progress deadline exceeded");
            }
            ("Progressing", "True", "NewReplicaSetAvailable") => progressed = true,
            ("Available", "True", _) => available = true,
            _ => {}
        }
    }
    let spec = int(d, &["spec", "replicas"], 1);
    let status = int(d, &["status", "replicas"], 0);
    let updated = int(d, &["status", "updatedReplicas"], 0);
    let ready = int(d, &["status", "readyReplicas"], 0);
    let available_replicas = int(d, &["status", "availableReplicas"], 0);
    if spec > status {
        progressing(format!("replicas: {status}/{spec}"))
    } else if spec > updated {
        progressing(format!("updated: {updated}/{spec}"))
    } else if status > spec {
        progressing(format!("pending termination: {}", status - spec))
    } else if updated > available_replicas {
        progressing(format!("available: {available_replicas}/{updated}"))
    } else if spec > ready {
        progressing(format!("ready: {ready}/{spec}"))
    } else if !progressed {
        progressing("ReplicaSet not available")
    } else if !available {
        progressing("Deployment not available")
    } else {
        healthy(format!("available, {status} replicas"))
    }
}

fn stateful_set(s: &Value) -> Assessment {
    if text(s, &["spec", "updateStrategy", "type"]) == "OnDelete" {
        return healthy("updated on delete");
    }
    let spec = int(s, &["spec", "replicas"], 1);
    let status = int(s, &["status", "replicas"], 0);
    let ready = int(s, &["status", "readyReplicas"], 0);
    let current = int(s, &["status", "currentReplicas"], 0);
    let updated = int(s, &["status", "updatedReplicas"], 0);
    let partition = int(
        s,
        &["spec", "updateStrategy", "rollingUpdate", "partition"],
        -1,
    );
    if spec > status {
        return progressing(format!("replicas: {status}/{spec}"));
    }
    if spec > ready {
        return progressing(format!("ready: {ready}/{spec}"));
    }
    if status > spec {
        return progressing(format!("pending termination: {}", status - spec));
    }
    if partition != -1 {
        let expected = spec - partition;
        return if updated < expected {
            progressing(format!("partition rollout: updated {updated}/{expected}"))
        } else {
            healthy(format!("partition rollout complete, {updated} updated"))
        };
    }
    if spec > current {
        return progressing(format!("current: {current}/{spec}"));
    }
    if text(s, &["status", "currentRevision"]) != text(s, &["status", "updateRevision"]) {
        return progressing("waiting for the updated revision");
    }
    healthy(format!("{status} replicas as expected"))
}

fn daemon_set(d: &Value) -> Assessment {
    if d.pointer("/metadata/generation").is_none() {
        return progressing("no metadata.generation yet");
    }
    if d.pointer("/status/observedGeneration").is_none() {
        return progressing("no status.observedGeneration yet");
    }
    let desired = int(d, &["status", "desiredNumberScheduled"], -1);
    let checks = [
        ("currentNumberScheduled", "current"),
        ("updatedNumberScheduled", "updated"),
        ("numberAvailable", "available"),
        ("numberReady", "ready"),
    ];
    if desired == -1 {
        return progressing("no status.desiredNumberScheduled yet");
    }
    for (field, what) in checks {
        let n = int(d, &["status", field], 0);
        if desired > n {
            return progressing(format!("{what}: {n}/{desired}"));
        }
    }
    healthy(format!("{desired} scheduled as expected"))
}

fn replica_set(r: &Value) -> Assessment {
    if conditions(r)
        .iter()
        .any(|c| c.type_ == "ReplicaFailure" && c.status == "True")
    {
        return progressing("replica failure: check the Pods");
    }
    let spec = int(r, &["spec", "replicas"], 1);
    for (field, what) in [
        ("fullyLabeledReplicas", "labelled"),
        ("availableReplicas", "available"),
        ("readyReplicas", "ready"),
    ] {
        let n = int(r, &["status", field], 0);
        if spec > n {
            return progressing(format!("{what}: {n}/{spec}"));
        }
    }
    let status = int(r, &["status", "replicas"], 0);
    if status > spec {
        return progressing(format!("pending termination: {}", status - spec));
    }
    healthy(format!("available, {status} replicas"))
}

fn job(j: &Value) -> Assessment {
    let suspended = j.pointer("/spec/suspend").and_then(Value::as_bool) == Some(true);
    for c in conditions(j) {
        match (c.type_, c.status) {
            ("Complete", "True") => return healthy("completed"),
            ("Failed", "True") => return degraded(or_reason(c.message, "failed")),
            ("Suspended", "True") if suspended => return healthy("suspended"),
            _ => {}
        }
    }
    if text(j, &["status", "startTime"]).is_empty() {
        return progressing("not started");
    }
    healthy(format!(
        "running: {} succeeded, {} active, {} failed",
        int(j, &["status", "succeeded"], 0),
        int(j, &["status", "active"], 0),
        int(j, &["status", "failed"], 0)
    ))
}

fn pod(p: &Value) -> Assessment {
    let conditions = conditions(p);
    match text(p, &["status", "phase"]) {
        "Succeeded" => healthy("completed"),
        "Failed" => healthy("completed, not successfully"),
        "Running" => {
            if conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
            {
                return healthy("Ready");
            }
            let crashing: Vec<&str> = p
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|s| text(s, &["state", "waiting", "reason"]) == "CrashLoopBackOff")
                .map(|s| text(s, &["name"]))
                .collect();
            if crashing.is_empty() {
                progressing("running, not Ready")
            } else {
                degraded(format!("containers crash-looping: {}", crashing.join(",")))
            }
        }
        "Pending" => {
            let unschedulable = conditions
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                .is_some_and(|c| c.reason == "Unschedulable");
            if unschedulable {
                degraded("cannot be scheduled")
            } else {
                progressing("pending")
            }
        }
        "" => progressing("no phase yet"),
        other => progressing(format!("phase {other}")),
    }
}

fn claim(c: &Value) -> Assessment {
    match text(c, &["status", "phase"]) {
        "Bound" => healthy("bound"),
        "" => progressing("not bound"),
        phase => progressing(format!("not bound: {phase}")),
    }
}

fn service(s: &Value) -> Assessment {
    if text(s, &["spec", "type"]) == "LoadBalancer" && text(s, &["spec", "clusterIP"]).is_empty() {
        return progressing("no cluster IP yet");
    }
    healthy("ready")
}

fn definition(d: &Value) -> Assessment {
    for c in conditions(d) {
        match (c.type_, c.status) {
            ("NamesAccepted", "False") => return degraded(or_reason(c.message, c.reason)),
            ("Established", "False") if c.reason != "Installing" => {
                return degraded(or_reason(c.message, c.reason));
            }
            ("Established", "True") => return healthy("established"),
            _ => {}
        }
    }
    progressing("installing")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(status: Value) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "generation": 2},
            "spec": {"replicas": 3, "progressDeadlineSeconds": 600},
            "status": status,
        })
    }

    fn health(object: &Value) -> Health {
        assess(object).health
    }

    #[test]
    fn a_deployment_is_healthy_only_when_rolled_out_and_available() {
        let available = json!({
            "observedGeneration": 2, "replicas": 3, "updatedReplicas": 3,
            "readyReplicas": 3, "availableReplicas": 3,
            "conditions": [
                {"type": "Available", "status": "True"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
            ],
        });
        assert_eq!(health(&deployment(available.clone())), Health::Healthy);
        let mut stale = available.clone();
        stale["observedGeneration"] = json!(1);
        let a = assess(&deployment(stale));
        assert_eq!(a.health, Health::Progressing);
        assert!(a.message.contains("generation is 2"), "{}", a.message);
        let mut rolling = available.clone();
        rolling["updatedReplicas"] = json!(1);
        assert_eq!(assess(&deployment(rolling)).message, "updated: 1/3");
        let mut not_ready = available.clone();
        not_ready["readyReplicas"] = json!(2);
        assert_eq!(assess(&deployment(not_ready)).message, "ready: 2/3");
        let mut unavailable = available.clone();
        unavailable["conditions"][0]["status"] = json!("False");
        assert_eq!(health(&deployment(unavailable)), Health::Progressing);
        let failed = json!({
            "observedGeneration": 2, "replicas": 3, "updatedReplicas": 1,
            "conditions": [{"type": "Progressing", "status": "False",
                            "reason": "ProgressDeadlineExceeded"}],
        });
        assert_eq!(health(&deployment(failed)), Health::Degraded);
        assert_eq!(
            assess(&deployment(json!({}))).message,
            "replicas: 0/3",
            "a Deployment with no status yet"
        );
    }

    #[test]
    fn generic_conditions_come_before_the_kind() {
        let mut d = deployment(json!({"observedGeneration": 2}));
        d["status"]["conditions"] =
            json!([{"type": "Stalled", "status": "True", "message": "quota exceeded"}]);
        assert_eq!(
            assess(&d),
            Assessment {
                health: Health::Degraded,
                message: "quota exceeded".into()
            }
        );
        let custom = |conditions: Value| {
            json!({"apiVersion": "example.com/v1", "kind": "Widget",
                   "metadata": {"name": "w"}, "status": {"conditions": conditions}})
        };
        assert_eq!(health(&custom(json!([]))), Health::Healthy);
        assert_eq!(
            health(&custom(json!([{"type": "Ready", "status": "False"}]))),
            Health::Progressing
        );
        assert_eq!(
            health(&custom(json!([{"type": "Reconciling", "status": "True"}]))),
            Health::Progressing
        );
        let mut deleting = custom(json!([{"type": "Ready", "status": "True"}]));
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-25T10:00:00Z");
        assert_eq!(health(&deleting), Health::Progressing);
    }

    #[test]
    fn stateful_sets_daemon_sets_and_replica_sets() {
        let sts = |status: Value, partition: Option<i64>| {
            let mut s = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                               "metadata": {"name": "db"}, "spec": {"replicas": 2},
                               "status": status});
            if let Some(p) = partition {
                s["spec"]["updateStrategy"] = json!({"rollingUpdate": {"partition": p}});
            }
            s
        };
        let done = json!({"replicas": 2, "readyReplicas": 2, "currentReplicas": 2,
                          "updatedReplicas": 2, "currentRevision": "a", "updateRevision": "a"});
        assert_eq!(health(&sts(done.clone(), None)), Health::Healthy);
        let mut revising = done.clone();
        revising["updateRevision"] = json!("b");
        assert_eq!(health(&sts(revising.clone(), None)), Health::Progressing);
        // A partition of 1 expects one updated replica of two, whatever the revisions say.
        revising["updatedReplicas"] = json!(1);
        assert_eq!(health(&sts(revising.clone(), Some(1))), Health::Healthy);
        revising["updatedReplicas"] = json!(0);
        assert_eq!(health(&sts(revising, Some(1))), Health::Progressing);

        let ds = |status: Value| {
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                   "metadata": {"name": "agent", "generation": 1}, "status": status})
        };
        let all = json!({"observedGeneration": 1, "desiredNumberScheduled": 3,
                         "currentNumberScheduled": 3, "updatedNumberScheduled": 3,
                         "numberAvailable": 3, "numberReady": 3});
        assert_eq!(health(&ds(all.clone())), Health::Healthy);
        let mut short = all.clone();
        short["numberAvailable"] = json!(2);
        assert_eq!(assess(&ds(short)).message, "available: 2/3");
        assert_eq!(health(&ds(json!({}))), Health::Progressing);

        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "r"},
                        "spec": {"replicas": 1},
                        "status": {"replicas": 1, "fullyLabeledReplicas": 1,
                                   "availableReplicas": 1, "readyReplicas": 1,
                                   "conditions": [{"type": "ReplicaFailure", "status": "True"}]}});
        assert_eq!(health(&rs), Health::Progressing);
    }

    #[test]
    fn jobs_pods_claims_services_and_definitions() {
        let job = |status: Value| {
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                   "status": status})
        };
        assert_eq!(health(&job(json!({}))), Health::Progressing);
        assert_eq!(
            health(&job(
                json!({"startTime": "2026-11-25T10:00:00Z", "active": 1})
            )),
            Health::Healthy
        );
        let failed = json!({"conditions": [{"type": "Failed", "status": "True",
                                             "message": "BackoffLimitExceeded"}]});
        assert_eq!(health(&job(failed)), Health::Degraded);

        let pod = |status: Value| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                   "status": status})
        };
        let crashing = json!({"phase": "Running", "containerStatuses": [
            {"name": "app", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]});
        assert_eq!(
            assess(&pod(crashing)),
            Assessment {
                health: Health::Degraded,
                message: "containers crash-looping: app".into()
            }
        );
        let ready = json!({"phase": "Running",
                           "conditions": [{"type": "Ready", "status": "True"}]});
        assert_eq!(health(&pod(ready)), Health::Healthy);
        let unschedulable = json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]});
        assert_eq!(health(&pod(unschedulable)), Health::Degraded);

        let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "metadata": {"name": "data"}, "status": {"phase": "Pending"}});
        assert_eq!(health(&pvc), Health::Progressing);
        let lb = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                        "spec": {"type": "LoadBalancer"}});
        assert_eq!(health(&lb), Health::Progressing);
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
        assert_eq!(health(&config), Health::Healthy);
        let crd = json!({"apiVersion": "apiextensions.k8s.io/v1",
                         "kind": "CustomResourceDefinition", "metadata": {"name": "x"},
                         "status": {"conditions": [
                             {"type": "NamesAccepted", "status": "False",
                              "reason": "NameConflict"}]}});
        assert_eq!(
            assess(&crd),
            Assessment {
                health: Health::Degraded,
                message: "NameConflict".into()
            }
        );
    }
}
