//! Probes from the chart's spec (named ports, the kubelet's defaults), and checks against a
//! server that answers 200, 500 or nothing.

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;
use serde_json::json;
use shardwise_e2e_node::probe::{Action, Probe, ProbeError, check};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn container() -> Container {
    serde_json::from_value(json!({
        "name": "controller",
        "ports": [{"name": "metrics", "containerPort": 8080}, {"name": "health", "containerPort": 8081}],
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 60},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "health", "httpHeaders": [{"name": "X-Probe", "value": "1"}]}},
        "livenessProbe": {"tcpSocket": {"port": 8080}, "terminationGracePeriodSeconds": 5},
    }))
    .unwrap()
}

#[test]
fn probes_resolve_named_ports_and_take_the_kubelet_defaults() {
    let c = container();
    let startup = Probe::from_spec(c.startup_probe.as_ref().unwrap(), &c).unwrap();
    assert_eq!(
        startup.action,
        Action::Http {
            port: 8081,
            path: "/healthz".into(),
            headers: vec![]
        }
    );
    assert_eq!(
        (startup.period, startup.timeout, startup.failure_threshold),
        (Duration::from_secs(2), Duration::from_secs(3), 60)
    );
    let readiness = Probe::from_spec(c.readiness_probe.as_ref().unwrap(), &c).unwrap();
    assert_eq!(
        (
            readiness.period,
            readiness.timeout,
            readiness.success_threshold,
            readiness.failure_threshold
        ),
        (Duration::from_secs(10), Duration::from_secs(1), 1, 3)
    );
    let liveness = Probe::from_spec(c.liveness_probe.as_ref().unwrap(), &c).unwrap();
    assert_eq!(liveness.action, Action::Tcp { port: 8080 });
    assert_eq!(liveness.termination_grace, Some(Duration::from_secs(5)));

    let mut bad = c.clone();
    bad.readiness_probe
        .as_mut()
        .unwrap()
        .http_get
        .as_mut()
        .unwrap()
        .port = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("nope".into());
    assert_eq!(
        Probe::from_spec(bad.readiness_probe.as_ref().unwrap(), &bad).unwrap_err(),
        ProbeError::Unsupported("no port named \"nope\"".into())
    );
}

/// A server on 127.0.0.1 that answers `/ok` with 200, `/moved` with 302, anything else with
/// 500, and `/hang` never; returns its port.
async fn server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 1024];
                let n = stream.read(&mut buffer).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buffer[..n]).into_owned();
                assert!(request.contains("User-Agent: kube-probe/1.37"), "{request}");
                let path = request.split_whitespace().nth(1).unwrap_or("").to_string();
                let status = match path.as_str() {
                    "/ok" => "200 OK",
                    "/moved" => "302 Found",
                    "/hang" => {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        return;
                    }
                    _ => "500 Internal Server Error",
                };
                let _ = stream
                    .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            });
        }
    });
    port
}

#[tokio::test]
async fn checks_pass_on_2xx_and_3xx_and_fail_on_errors_refusals_and_timeouts() {
    let port = server().await;
    let local: IpAddr = [127, 0, 0, 1].into();
    let http = |path: &str| Action::Http {
        port,
        path: path.into(),
        headers: vec![],
    };
    let second = Duration::from_secs(1);
    assert!(check(&http("/ok"), local, second).await);
    assert!(check(&http("/moved"), local, second).await);
    assert!(!check(&http("/broken"), local, second).await);
    assert!(!check(&http("/hang"), local, Duration::from_millis(200)).await);
    assert!(check(&Action::Tcp { port }, local, second).await);
    // A port nobody listens on.
    assert!(!check(&Action::Tcp { port: 1 }, local, second).await);
}
