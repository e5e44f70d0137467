//! Status of FleetClusters and FleetApps: conditions, merge patches that clear what is gone, and
//! the status of an object that cannot be read.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};
use shardwise_runtime::ObjectKind;

/// A condition whose transition time moves only when its status does.
pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    previous: &[Condition],
    generation: Option<i64>,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    // The transition time only moves when the status does.
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(jiff::Timestamp::now()));
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// A status as a JSON merge patch: fields the status leaves out are set to null so that the
/// patch clears them instead of keeping stale values. A field may be nested (`health.message`):
/// a merge patch merges objects, so a field left out of one the status has would keep its old
/// value; it is nulled when its parent is there (an absent parent is nulled whole).
pub fn status_patch<T: serde::Serialize>(status: &T, fields: &[&str]) -> Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        for field in fields {
            match field.split_once('.') {
                None => {
                    object.entry(*field).or_insert(Value::Null);
                }
                Some((parent, child)) => {
                    if let Some(parent) = object.get_mut(parent).and_then(Value::as_object_mut) {
                        parent.entry(child).or_insert(Value::Null);
                    }
                }
            }
        }
    }
    value
}

/// The status that says an object cannot be read: `phase` or `syncPhase`, a message, and the
/// kind's condition, all naming the field at fault.
pub fn unreadable(kind: ObjectKind, reason: &str) -> Value {
    let message = format!("cannot be read, so shardwise ignores it until it is fixed: {reason}");
    let generation = None;
    match kind {
        ObjectKind::Unit => json!({
            "phase": "Invalid",
            "message": message,
            "conditions": [condition("Ready", false, "InvalidSpec", message.clone(), &[], generation)],
        }),
        ObjectKind::Item => json!({
            "syncPhase": "Failed",
            "message": message,
            "conditions": [condition("Synced", false, "InvalidSpec", message.clone(), &[], generation)],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let first = condition("Ready", true, "Connected", "ok".into(), &[], Some(1));
        let same = condition(
            "Ready",
            true,
            "Connected",
            "still".into(),
            std::slice::from_ref(&first),
            Some(2),
        );
        assert_eq!(same.last_transition_time, first.last_transition_time);
        assert_eq!(same.observed_generation, Some(2));
        let flipped = condition(
            "Ready",
            false,
            "Unreachable",
            "no".into(),
            &[first],
            Some(2),
        );
        assert_eq!(flipped.status, "False");
    }

    #[test]
    fn an_unreadable_object_gets_a_status_that_names_the_field() {
        let cluster = unreadable(ObjectKind::Unit, "spec.weight: invalid value");
        assert_eq!(cluster["phase"], "Invalid");
        assert_eq!(cluster["conditions"][0]["reason"], "InvalidSpec");
        let app = unreadable(ObjectKind::Item, "spec.destination: missing field");
        assert_eq!(app["syncPhase"], "Failed");
        assert!(
            app["message"]
                .as_str()
                .is_some_and(|m| m.contains("spec.destination"))
        );
    }
}
