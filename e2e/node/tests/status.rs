//! Pod status from what the agent observed: phases per restart policy, readiness conditions
//! with their transition times kept while they hold, container states and the UID
//! precondition.

// Test code: a status that is not what is expected fails the test.
#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use shardwise_e2e_node::Exit;
use shardwise_e2e_node::status::{
    ContainerObservation, PodObservation, State, Termination, phase, status_patch,
};

fn container(state: State, ready: bool) -> ContainerObservation {
    ContainerObservation {
        name: "controller".into(),
        image: "ghcr.io/shardwise/shardwise:0.1.0".into(),
        state,
        last_termination: None,
        restart_count: 0,
        ready,
        started: true,
    }
}

fn running() -> State {
    State::Running {
        started_at: "2026-11-28T10:00:01Z".into(),
    }
}

fn ended(code: i32) -> State {
    State::Terminated(termination(code))
}

fn termination(code: i32) -> Termination {
    Termination {
        exit: Exit {
            code,
            signal: (code > 128).then_some(code - 128),
        },
        started_at: "2026-11-28T10:00:01Z".into(),
        finished_at: "2026-11-28T10:00:09Z".into(),
    }
}

fn patch(containers: &[ContainerObservation], previous: &[Value], now: &str) -> Value {
    status_patch(&PodObservation {
        uid: "uid-7",
        restart_policy: "Always",
        sandbox_ready: true,
        containers,
        host_ip: "10.244.3.1",
        pod_ip: Some("10.244.3.12"),
        start_time: "2026-11-28T10:00:00Z",
        now,
        previous_conditions: previous,
    })
}

fn condition<'a>(patch: &'a Value, kind: &str) -> &'a Value {
    patch["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == kind)
        .unwrap()
}

#[test]
fn phases_follow_the_containers_and_the_restart_policy() {
    let creating = State::Waiting {
        reason: "ContainerCreating".into(),
        message: None,
    };
    assert_eq!(phase("Always", &[container(creating, false)]), "Pending");
    assert_eq!(phase("Always", &[container(running(), false)]), "Running");
    // Ended, and to be restarted: still Running.
    assert_eq!(phase("Always", &[container(ended(0), false)]), "Running");
    assert_eq!(phase("OnFailure", &[container(ended(1), false)]), "Running");
    assert_eq!(
        phase("OnFailure", &[container(ended(0), false)]),
        "Succeeded"
    );
    assert_eq!(phase("Never", &[container(ended(0), false)]), "Succeeded");
    assert_eq!(phase("Never", &[container(ended(137), false)]), "Failed");
    // In back-off after a crash: Running, as the kubelet says.
    let mut backing_off = container(
        State::Waiting {
            reason: "CrashLoopBackOff".into(),
            message: None,
        },
        false,
    );
    backing_off.restart_count = 2;
    assert_eq!(phase("Always", &[backing_off]), "Running");
}

#[test]
fn readiness_conditions_name_unready_containers_and_keep_their_transition_time() {
    let starting = patch(&[container(running(), false)], &[], "2026-11-28T10:00:02Z");
    assert_eq!(starting["metadata"], json!({"uid": "uid-7"}));
    let ready = condition(&starting, "Ready");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "ContainersNotReady");
    assert_eq!(
        ready["message"],
        "containers with unready status: [controller]"
    );
    assert_eq!(
        condition(&starting, "PodReadyToStartContainers")["status"],
        "True"
    );
    assert_eq!(starting["status"]["podIP"], "10.244.3.12");
    assert_eq!(
        starting["status"]["containerStatuses"][0]["state"]["running"]["startedAt"],
        "2026-11-28T10:00:01Z"
    );

    let previous = starting["status"]["conditions"].as_array().unwrap().clone();
    let became_ready = patch(
        &[container(running(), true)],
        &previous,
        "2026-11-28T10:00:05Z",
    );
    assert_eq!(condition(&became_ready, "Ready")["status"], "True");
    // The strategic merge must clear the reason and message of the False it replaces.
    let cleared = condition(&became_ready, "Ready").as_object().unwrap();
    assert_eq!(cleared.get("reason"), Some(&Value::Null));
    assert_eq!(cleared.get("message"), Some(&Value::Null));
    assert_eq!(
        condition(&became_ready, "Ready")["lastTransitionTime"],
        "2026-11-28T10:00:05Z"
    );
    // Conditions that did not change keep their time.
    assert_eq!(
        condition(&became_ready, "Initialized")["lastTransitionTime"],
        "2026-11-28T10:00:02Z"
    );
    assert_eq!(
        became_ready["status"]["containerStatuses"][0]["ready"],
        true
    );
}

#[test]
fn a_restarted_container_reports_its_last_termination_and_count() {
    let mut restarted = container(running(), true);
    restarted.restart_count = 1;
    restarted.last_termination = Some(termination(137));
    let patched = patch(&[restarted], &[], "2026-11-28T10:00:10Z");
    let status = &patched["status"]["containerStatuses"][0];
    assert_eq!(status["restartCount"], 1);
    assert_eq!(status["lastState"]["terminated"]["exitCode"], 137);
    assert_eq!(status["lastState"]["terminated"]["signal"], 9);
    assert_eq!(status["lastState"]["terminated"]["reason"], "Error");
    let done = patch(&[container(ended(0), false)], &[], "2026-11-28T10:00:10Z");
    assert_eq!(
        done["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
        "Completed"
    );
}
