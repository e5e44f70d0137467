//! A pod's status as the kubelet reports it, computed from what the agent observed of its
//! containers (pure): the phase, the conditions (`PodReadyToStartContainers`, `Initialized`,
//! `ContainersReady`, `Ready`; the scheduler's `PodScheduled` is left as it is), each
//! container's state, last termination, restart count, readiness, and the addresses. The patch
//! carries the pod's UID as a precondition, as the kubelet's does, so that a recreated pod of
//! the same name (a StatefulSet's) never gets the status of the one before.

use serde_json::{Value, json};

use crate::container::Exit;

/// What the agent observed of one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerObservation {
    /// The container's name.
    pub name: String,
    /// Its `image`.
    pub image: String,
    /// Where it stands now.
    pub state: State,
    /// Its previous run's end, after a restart.
    pub last_termination: Option<Termination>,
    /// How many times it was restarted.
    pub restart_count: u32,
    /// Its readiness probe passed (or it has none and runs).
    pub ready: bool,
    /// Its startup probe passed (or it has none and runs).
    pub started: bool,
}

/// A container's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Not running: being created, in back-off, or refused.
    Waiting {
        /// `ContainerCreating`, `CrashLoopBackOff`, `ErrImagePull`,
        /// `CreateContainerConfigError`.
        reason: String,
        /// Why, for a person.
        message: Option<String>,
    },
    /// Running since `started_at` (RFC 3339).
    Running {
        /// When it started.
        started_at: String,
    },
    /// Ended.
    Terminated(Termination),
}

/// How a container's run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Termination {
    /// Its exit.
    pub exit: Exit,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When it ended (RFC 3339).
    pub finished_at: String,
}

impl Termination {
    fn to_json(&self) -> Value {
        let mut value = json!({
            "exitCode": self.exit.code,
            "reason": if self.exit.code == 0 { "Completed" } else { "Error" },
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
        });
        if let Some(signal) = self.exit.signal {
            value["signal"] = json!(signal);
        }
        value
    }
}

/// Everything the status is computed from.
#[derive(Clone, Debug)]
pub struct PodObservation<'a> {
    /// The pod's UID (the patch's precondition).
    pub uid: &'a str,
    /// `spec.restartPolicy`: `Always`, `OnFailure` or `Never`.
    pub restart_policy: &'a str,
    /// The pod's sandbox (network) exists.
    pub sandbox_ready: bool,
    /// Its containers, in spec order.
    pub containers: &'a [ContainerObservation],
    /// The node's address.
    pub host_ip: &'a str,
    /// The pod's address, once it has one.
    pub pod_ip: Option<&'a str>,
    /// When the agent took the pod on (RFC 3339).
    pub start_time: &'a str,
    /// Now (RFC 3339): the transition time of a condition that changes.
    pub now: &'a str,
    /// The conditions the pod has now, to keep the transition times of those that hold.
    pub previous_conditions: &'a [Value],
}

/// The pod's phase.
pub fn phase(restart_policy: &str, containers: &[ContainerObservation]) -> &'static str {
    let terminated: Vec<&Termination> = containers
        .iter()
        .filter_map(|c| match &c.state {
            State::Terminated(t) => Some(t),
            _ => None,
        })
        .collect();
    let all_ended = !containers.is_empty() && terminated.len() == containers.len();
    let restarts = |t: &Termination| match restart_policy {
        "Never" => false,
        "OnFailure" => t.exit.code != 0,
        _ => true,
    };
    if all_ended && !terminated.iter().any(|t| restarts(t)) {
        if terminated.iter().all(|t| t.exit.code == 0) {
            "Succeeded"
        } else {
            "Failed"
        }
    } else if containers.iter().any(|c| {
        // Running, or ended and to be restarted, or in back-off after a run.
        matches!(c.state, State::Running { .. } | State::Terminated(_)) || c.restart_count > 0
    }) {
        "Running"
    } else {
        "Pending"
    }
}

/// The strategic-merge patch of `pods/<name>/status`.
pub fn status_patch(pod: &PodObservation<'_>) -> Value {
    let ready = !pod.containers.is_empty()
        && pod
            .containers
            .iter()
            .all(|c| c.ready && matches!(c.state, State::Running { .. }));
    let unready: Vec<&str> = pod
        .containers
        .iter()
        .filter(|c| !(c.ready && matches!(c.state, State::Running { .. })))
        .map(|c| c.name.as_str())
        .collect();
    let condition = |kind: &str, holds: bool, reason: Option<&str>| {
        let status = if holds { "True" } else { "False" };
        let previous = pod
            .previous_conditions
            .iter()
            .find(|c| c["type"] == kind && c["status"] == status)
            .and_then(|c| c["lastTransitionTime"].as_str());
        // A strategic merge keeps the fields a condition no longer has unless they are null:
        // a Ready condition must not keep the reason of its last False.
        let mut value = json!({
            "type": kind,
            "status": status,
            "lastProbeTime": null,
            "lastTransitionTime": previous.unwrap_or(pod.now),
            "reason": null,
            "message": null,
        });
        if let (false, Some(reason)) = (holds, reason) {
            value["reason"] = json!(reason);
            value["message"] = json!(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            ));
        }
        value
    };
    let containers: Vec<Value> = pod
        .containers
        .iter()
        .map(|c| {
            let state = match &c.state {
                State::Waiting { reason, message } => {
                    let mut waiting = json!({"reason": reason});
                    if let Some(message) = message {
                        waiting["message"] = json!(message);
                    }
                    json!({"waiting": waiting})
                }
                State::Running { started_at } => json!({"running": {"startedAt": started_at}}),
                State::Terminated(t) => json!({"terminated": t.to_json()}),
            };
            let last = c
                .last_termination
                .as_ref()
                .map_or_else(|| json!({}), |t| json!({"terminated": t.to_json()}));
            json!({
                "name": c.name,
                "image": c.image,
                "imageID": format!("shardwise://{}", c.image),
                "state": state,
                "lastState": last,
                "ready": c.ready && matches!(c.state, State::Running { .. }),
                "started": c.started && matches!(c.state, State::Running { .. }),
                "restartCount": c.restart_count,
            })
        })
        .collect();
    let mut status = json!({
        "phase": phase(pod.restart_policy, pod.containers),
        "conditions": [
            condition("PodReadyToStartContainers", pod.sandbox_ready, None),
            condition("Initialized", true, None),
            condition("ContainersReady", ready, Some("ContainersNotReady")),
            condition("Ready", ready, Some("ContainersNotReady")),
        ],
        "hostIP": pod.host_ip,
        "hostIPs": [{"ip": pod.host_ip}],
        "startTime": pod.start_time,
        "containerStatuses": containers,
    });
    if let Some(ip) = pod.pod_ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    json!({"metadata": {"uid": pod.uid}, "status": status})
}
