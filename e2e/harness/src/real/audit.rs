//! The write log of a kube-apiserver: its audit log, written by the server itself for every
//! write request (policy [`POLICY`]), read back as [`WriteRecord`]s. Tests read them to prove
//! from the server's side what a client did, e.g. that no write of a fenced term arrived.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use shardwise_e2e_testkit::WriteRecord;

use crate::cost::RequestKind;

/// Every write and every LIST at `Metadata` level (who, what, when, how it was answered),
/// nothing else: the writes are the write log, the LISTs show when a client listed again
/// (e.g. after its watch expired). (GETs and WATCHes too made e2e_configmapgen's handoffs
/// slower than its bound in a trial.)
pub(crate) const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection, list]
  - level: None
";

/// The requests received in `[from, to)` by user and kind, from the audit log at `path` (what
/// its policy records: writes and LISTs, or every verb a caller's policy names), with
/// the verbs kube-apiserver's `apiserver_request_total` uses (`POST` for create, `PUT` for
/// update; a server-side apply is a `PATCH` here). A WATCH counts once it has ended.
pub(crate) fn count_requests(
    path: &Path,
    from: SystemTime,
    to: SystemTime,
) -> BTreeMap<String, BTreeMap<RequestKind, u64>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut counts: BTreeMap<String, BTreeMap<RequestKind, u64>> = BTreeMap::new();
    for event in text
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
    {
        let text = |pointer: &str| event.pointer(pointer).and_then(Value::as_str);
        if text("/stage") != Some("ResponseComplete") {
            continue;
        }
        let Some(at) = text("/requestReceivedTimestamp").and_then(wall_clock) else {
            continue;
        };
        if at < from || at >= to {
            continue;
        }
        let verb = match text("/verb").unwrap_or_default() {
            "create" => "POST",
            "update" => "PUT",
            "deletecollection" => "DELETE",
            other => other,
        };
        let Some(resource) = text("/objectRef/resource") else {
            continue;
        };
        let kind = RequestKind::new(
            verb,
            resource,
            text("/objectRef/subresource").unwrap_or_default(),
        );
        *counts
            .entry(text("/user/username").unwrap_or_default().to_string())
            .or_default()
            .entry(kind)
            .or_default() += 1;
    }
    counts
}

/// An RFC 3339 timestamp of the audit log on this machine's wall clock.
fn wall_clock(timestamp: &str) -> Option<SystemTime> {
    let at: jiff::Timestamp = timestamp.parse().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(at.as_nanosecond()).ok()?))
}

/// The requests recorded in the audit log at `path`, oldest first: writes by their HTTP method
/// (`POST`, `PUT`, `PATCH`, `DELETE`), LISTs as `LIST`. `identity_of(user, uid)` names the
/// identity that sent each one, but for a pod's: a token bound to a pod names it (the server
/// records its UID among the user's extras), and its requests are its link's
/// ([`crate::pod_link`]), since every replica pod authenticates as the same ServiceAccount.
pub(crate) fn read_requests(
    path: &Path,
    identity_of: impl Fn(&str, &str) -> String,
) -> Vec<WriteRecord> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|event| write_record(&event, &identity_of))
        .collect()
}

fn write_record(event: &Value, identity_of: &impl Fn(&str, &str) -> String) -> Option<WriteRecord> {
    if event.get("stage")?.as_str()? != "ResponseComplete" {
        return None;
    }
    let method = match event.get("verb")?.as_str()? {
        "create" => "POST",
        "update" => "PUT",
        "patch" => "PATCH",
        "delete" | "deletecollection" => "DELETE",
        "list" => "LIST",
        _ => return None,
    };
    let text = |pointer: &str| event.pointer(pointer).and_then(Value::as_str);
    let at = wall_clock(text("/requestReceivedTimestamp")?)?;
    let uri = text("/requestURI")?;
    let pod = text("/user/extra/authentication.kubernetes.io~1pod-uid/0");
    let user = text("/user/username").unwrap_or_default();
    Some(WriteRecord {
        at,
        user: user.to_string(),
        identity: match pod {
            Some(uid) => crate::pod_link(uid),
            None => identity_of(user, text("/user/uid").unwrap_or_default()),
        },
        user_agent: text("/userAgent").map(str::to_string),
        method: method.to_string(),
        path: uri
            .split_once('?')
            .map_or(uri, |(path, _)| path)
            .to_string(),
        query: uri
            .split_once('?')
            .map_or("", |(_, query)| query)
            .to_string(),
        code: event
            .pointer("/responseStatus/code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_lists_become_records_and_other_events_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.log");
        let event = |verb: &str, stage: &str| {
            serde_json::json!({
                "kind": "Event", "level": "Metadata", "stage": stage, "verb": verb,
                "requestURI": "/api/v1/namespaces/team/configmaps/app-1?fieldManager=shardwise",
                "user": {"username": "system:serviceaccount:shardwise:shardwise", "uid": "shardwise-1"},
                "userAgent": "shardwise/0.1 (term 1f)",
                "responseStatus": {"code": 201},
                "requestReceivedTimestamp": "2026-11-25T12:00:01.250000Z",
            })
            .to_string()
        };
        let lines = [
            event("create", "ResponseComplete"),
            event("get", "ResponseComplete"),
            event("patch", "Panic"),
            event("list", "ResponseComplete"),
        ];
        std::fs::write(&log, lines.join("\n")).unwrap();
        let records = read_requests(&log, |user, uid| format!("{uid}/{user}"));
        assert_eq!(records.len(), 2, "{records:?}");
        assert_eq!(records[1].method, "LIST");
        let r = &records[0];
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/api/v1/namespaces/team/configmaps/app-1");
        assert_eq!(r.query, "fieldManager=shardwise");
        assert_eq!(r.code, 201);
        assert_eq!(
            r.identity,
            "shardwise-1/system:serviceaccount:shardwise:shardwise"
        );
        assert_eq!(r.user_agent.as_deref(), Some("shardwise/0.1 (term 1f)"));
        let seconds = r.at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(seconds, Duration::from_millis(1_795_608_001_250));
    }

    /// Every request of the window is counted under its user and kind, with the metrics'
    /// verbs; a request received before or at the window's end, or not yet answered, is not.
    #[test]
    fn requests_are_counted_by_user_and_kind_within_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.log");
        let event = |user: &str, verb: &str, subresource: &str, second: u32, stage: &str| {
            serde_json::json!({
                "kind": "Event", "level": "Metadata", "stage": stage, "verb": verb,
                "requestURI": "/apis/shardwise.io/v1alpha1/namespaces/shardwise/fleetapps/a",
                "objectRef": {"resource": "fleetapps", "subresource": subresource},
                "user": {"username": user},
                "responseStatus": {"code": 200},
                "requestReceivedTimestamp": format!("2026-11-25T12:00:0{second}Z"),
            })
            .to_string()
        };
        let lines = [
            event("controller", "update", "status", 0, "ResponseComplete"),
            event("controller", "update", "status", 1, "ResponseComplete"),
            event("controller", "update", "status", 2, "ResponseComplete"),
            event("controller", "get", "", 2, "ResponseComplete"),
            event("controller", "watch", "", 2, "ResponseStarted"),
            event("admin", "create", "", 3, "ResponseComplete"),
            event("admin", "list", "", 5, "ResponseComplete"),
        ];
        std::fs::write(&log, lines.join("\n")).unwrap();
        let at = |second: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_608_000 + second);
        let counts = count_requests(&log, at(1), at(5));
        let kind = |verb: &str, subresource: &str| RequestKind::new(verb, "fleetapps", subresource);
        assert_eq!(
            counts["controller"],
            [(kind("PUT", "status"), 2), (kind("GET", ""), 1)].into()
        );
        assert_eq!(counts["admin"], [(kind("POST", ""), 1)].into());
        assert_eq!(counts.len(), 2);
    }

    #[test]
    fn a_pods_requests_are_its_links_whatever_its_service_account() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.log");
        let event = |extra: serde_json::Value| {
            serde_json::json!({
                "kind": "Event", "level": "Metadata", "stage": "ResponseComplete", "verb": "list",
                "requestURI": "/apis/shardwise.io/v1alpha1/namespaces/shardwise/fleetapps",
                "user": {"username": "system:serviceaccount:shardwise:shardwise", "uid": "0b1c",
                         "extra": extra},
                "responseStatus": {"code": 200},
                "requestReceivedTimestamp": "2026-11-25T12:00:01Z",
            })
            .to_string()
        };
        let lines = [
            event(serde_json::json!({
                "authentication.kubernetes.io/pod-name": ["shardwise-1"],
                "authentication.kubernetes.io/pod-uid": ["7f3e"],
            })),
            event(serde_json::json!({})),
        ];
        std::fs::write(&log, lines.join("\n")).unwrap();
        let records = read_requests(&log, |user, _| user.to_string());
        assert!(
            records
                .iter()
                .all(|r| r.user == "system:serviceaccount:shardwise:shardwise")
        );
        let identities: Vec<&str> = records.iter().map(|r| r.identity.as_str()).collect();
        assert_eq!(
            identities,
            [
                crate::pod_link("7f3e").as_str(),
                "system:serviceaccount:shardwise:shardwise"
            ]
        );
    }
}
