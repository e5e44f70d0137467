//! Lease holding against kube-apiserver: one holder at a time, release on stop, and
//! fencing when the holder cannot reach the API server.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use shardwise_e2e::{Environment, FaultScope, Identity, wait_for};
use shardwise_handoff::lease::LeaseTiming;
use shardwise_runtime::lease::{
    Holding, LeaseSpecification, hold, hold_annotated, until_held, until_lost,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The path of the holders' leases, as the server's audit log names it (a create is sent to
/// the collection, a renewal to the lease).
const LEASES_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases";

const TIMING: LeaseTiming = LeaseTiming {
    duration: Duration::from_secs(3),
    renew_deadline: Duration::from_secs(2),
    retry_period: Duration::from_millis(300),
};

/// A control plane where each of `holders` is an admin (reaching it through a link of its
/// own, which a partition cuts).
fn environment(holders: &[&str]) -> Environment {
    holders
        .iter()
        .fold(Environment::builder(), |builder, name| {
            builder.identity(Identity::admin(*name))
        })
        .start()
        .expect("the control plane starts")
}

struct Holder {
    rx: watch::Receiver<Holding>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn specification(identity: &str) -> LeaseSpecification {
    LeaseSpecification {
        name: "shared".into(),
        labels: BTreeMap::from([("test".to_string(), "lease".to_string())]),
        identity: format!("{identity}-process"),
        timing: TIMING,
        statefulset: None,
    }
}

async fn client(env: &Environment, identity: &str) -> kube::Client {
    env.control_plane()
        .client(identity)
        .await
        .expect("the control plane gives clients")
}

async fn holder(env: &Environment, identity: &str) -> Holder {
    let client = client(env, identity).await;
    let (tx, rx) = watch::channel(Holding::NotHeld);
    let stop = CancellationToken::new();
    let spec = specification(identity);
    let task = tokio::spawn(hold(client, "default".into(), spec, tx, stop.clone()));
    Holder { rx, stop, task }
}

fn held(h: &Holder) -> bool {
    h.rx.borrow().is_held()
}

async fn wait_held(h: &Holder, who: &str, timeout: Duration) {
    wait_for(&format!("{who} to hold the lease"), timeout, || async {
        if held(h) {
            Ok(())
        } else {
            Err("not held".to_string())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_at_a_time_and_release_hands_over_at_once() {
    let env = environment(&["a", "b"]);
    let a = holder(&env, "a").await;
    wait_held(&a, "a", Duration::from_secs(5)).await;
    let b = holder(&env, "b").await;
    // b keeps trying but never holds while a renews.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(held(&a) && !held(&b), "a {} b {}", held(&a), held(&b));
    }
    // a stops: it releases the lease, and b takes it without waiting for it to expire.
    let released = Instant::now();
    a.stop.cancel();
    let a_rx = a.rx.clone();
    a.task.await.unwrap();
    assert!(!a_rx.borrow().is_held());
    wait_held(&b, "b", Duration::from_secs(2)).await;
    assert!(
        released.elapsed() < TIMING.duration,
        "b waited for expiry: {:?}",
        released.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_fences_before_anyone_else_can_take_over() {
    let env = environment(&["a", "b"]);
    let a = holder(&env, "a").await;
    wait_held(&a, "a", Duration::from_secs(5)).await;
    let b = holder(&env, "b").await;
    let term = a.rx.borrow().incarnation().expect("held");
    let lost = tokio::spawn(until_lost(a.rx.clone(), term));

    env.control_plane()
        .faults()
        .partition(FaultScope::identity("a"));
    let partitioned = Instant::now();
    lost.await.unwrap();
    // On the wall clock, which the server's audit log keeps too: a had fenced by then.
    let fenced = SystemTime::now();
    let fenced_after = partitioned.elapsed();
    assert!(
        fenced_after <= TIMING.renew_deadline + Duration::from_millis(200),
        "fenced after {fenced_after:?}"
    );
    assert!(!held(&a));
    wait_held(&b, "b", Duration::from_secs(10)).await;
    // When the takeover was committed, from the server's side: b's first accepted write of the
    // lease (it writes none while it waits), and a's last accepted renewal before it.
    let (a_renewed, b_took) = wait_for(
        "b's takeover in the audit log",
        Duration::from_secs(5),
        || async {
            let writes: Vec<_> = env
                .control_plane()
                .writes()
                .into_iter()
                .filter(|w| w.path.starts_with(LEASES_PATH) && w.code < 300)
                .collect();
            let b_took = writes
                .iter()
                .find(|w| w.identity == "b")
                .ok_or(format!(
                    "no write of b's among {} of the lease",
                    writes.len()
                ))?
                .at;
            let a_renewed = writes
                .iter()
                .filter(|w| w.identity == "a" && w.at < b_took)
                .map(|w| w.at)
                .next_back()
                .ok_or("no write of a's before b's")?;
            Ok::<_, String>((a_renewed, b_took))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // Seconds from `from` to `to`, negative when `to` came first.
    let seconds = |from: SystemTime, to: SystemTime| match to.duration_since(from) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    };
    eprintln!(
        "a fenced {:.3} s after its partition; b's takeover arrived {:.3} s after that, {:.3} s after a's last renewal",
        fenced_after.as_secs_f64(),
        seconds(fenced, b_took),
        seconds(a_renewed, b_took)
    );
    // b's takeover arrived after a had stopped, and only once the server had kept a's last
    // renewal unchanged for a lease duration: b counts it from the start of the read that
    // first showed it, which may have been sent just before the renewal arrived (a retry
    // period covers that read).
    assert!(
        seconds(fenced, b_took) > 0.0,
        "b took the lease {:.3} s after a fenced",
        seconds(fenced, b_took)
    );
    assert!(
        seconds(a_renewed, b_took) >= (TIMING.duration - TIMING.retry_period).as_secs_f64(),
        "b took the lease {:.3} s after a's last renewal, before it expired",
        seconds(a_renewed, b_took)
    );

    // a comes back: it must not take the lease from b.
    env.control_plane()
        .faults()
        .heal(&FaultScope::identity("a"));
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!held(&a) && held(&b));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_taken_again_under_a_new_incarnation_after_it_expired() {
    let env = environment(&["a"]);
    let a = holder(&env, "a").await;
    let first = until_held(a.rx.clone()).await.unwrap();
    let lost = tokio::spawn(until_lost(a.rx.clone(), first));

    // Partitioned past the renew deadline: a fences itself.
    env.control_plane()
        .faults()
        .partition(FaultScope::identity("a"));
    lost.await.unwrap();
    let fenced = Instant::now();
    env.control_plane()
        .faults()
        .heal(&FaultScope::identity("a"));

    // Nobody else wants the lease, yet a takes it back only as a new incarnation, and only
    // once the lost term's lease expired: work assigned to the lost term stays unowned until
    // the planner assigns it again.
    let second = until_held(a.rx.clone()).await.unwrap();
    let again_after = fenced.elapsed();
    assert_ne!(second, first, "the same incarnation came back");
    assert!(
        again_after >= TIMING.duration - TIMING.renew_deadline - TIMING.retry_period,
        "held again {again_after:?} after fencing"
    );
    // And it is one identity on the server: the lease names the new one.
    let client = env.control_plane().client("a").await.unwrap();
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client, "default");
    let holder = leases
        .get("shared")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert_eq!(
        shardwise_handoff::drain::Incarnation::of_identity(&holder),
        second
    );
    assert_eq!(holder, "a-process-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holders_annotations_ride_on_its_renewals_and_others_are_left_alone() {
    let env = environment(&["a"]);
    let (tx, rx) = watch::channel(Holding::NotHeld);
    let stop = CancellationToken::new();
    let key = shardwise_handoff::keys::LOAD_ANNOTATION;
    let (annotations, carried) =
        watch::channel(BTreeMap::from([(key.to_string(), "first".to_string())]));
    let task = tokio::spawn(hold_annotated(
        client(&env, "a").await,
        "default".into(),
        specification("a"),
        carried,
        tx,
        stop.clone(),
    ));
    let a = Holder { rx, stop, task };
    wait_held(&a, "a", Duration::from_secs(5)).await;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client(&env, "a").await, "default");
    let annotation = |name: &'static str| {
        let leases = leases.clone();
        async move {
            let lease = leases.get("shared").await.map_err(|e| e.to_string())?;
            Ok::<_, String>(
                lease
                    .metadata
                    .annotations
                    .unwrap_or_default()
                    .get(name)
                    .cloned(),
            )
        }
    };
    // Created with it.
    assert_eq!(annotation(key).await.unwrap().as_deref(), Some("first"));
    // Someone else annotates the lease; the holder changes its value: the next renewal carries
    // the new value and keeps the other.
    let patch = serde_json::json!({"metadata": {"annotations": {"example.com/note": "kept"}}});
    leases
        .patch(
            "shared",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    annotations.send_replace(BTreeMap::from([(key.to_string(), "second".to_string())]));
    wait_for(
        "the renewal to carry the new value",
        TIMING.retry_period * 4,
        || async {
            match annotation(key).await?.as_deref() {
                Some("second") => Ok(()),
                other => Err(format!("{key} is {other:?}")),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        annotation("example.com/note").await.unwrap().as_deref(),
        Some("kept")
    );
    assert!(held(&a));
    a.stop.cancel();
    a.task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulsets_lease_exists_only_with_it_and_names_it_as_owner() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::coordination::v1::Lease;

    let env = environment(&["a"]);
    let admin = client(&env, "admin").await;
    let leases: kube::Api<Lease> = kube::Api::namespaced(admin.clone(), "default");
    let (tx, rx) = watch::channel(Holding::NotHeld);
    let stop = CancellationToken::new();
    let spec = LeaseSpecification {
        statefulset: Some("web".into()),
        ..specification("a")
    };
    let task = tokio::spawn(hold(
        client(&env, "a").await,
        "default".into(),
        spec,
        tx,
        stop.clone(),
    ));
    let a = Holder { rx, stop, task };
    // No StatefulSet: round after round, no Lease is created (the replica of a deleted
    // StatefulSet must not leave one behind).
    for _ in 0..10 {
        tokio::time::sleep(TIMING.retry_period).await;
        assert!(!held(&a));
        assert!(leases.get_opt("shared").await.unwrap().is_none());
    }
    env.control_plane()
        .apply_yaml(
            "admin",
            "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: web, namespace: default}\nspec:\n  serviceName: web\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: web}]}\n",
        )
        .await
        .unwrap();
    wait_held(&a, "a", Duration::from_secs(5)).await;
    let statefulsets: kube::Api<StatefulSet> = kube::Api::namespaced(admin, "default");
    let uid = statefulsets.get("web").await.unwrap().metadata.uid.unwrap();
    let owners = |lease: Lease| -> Vec<(String, String, String)> {
        lease
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .map(|o| (o.kind, o.name, o.uid))
            .collect()
    };
    let expected = vec![("StatefulSet".to_string(), "web".to_string(), uid)];
    assert_eq!(owners(leases.get("shared").await.unwrap()), expected);
    // Orphaned (as `kubectl delete --cascade=orphan` leaves it): the next renewal puts the
    // reference back.
    let orphan = serde_json::json!({"metadata": {"ownerReferences": null}});
    leases
        .patch(
            "shared",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&orphan),
        )
        .await
        .unwrap();
    wait_for(
        "the owner reference back",
        TIMING.retry_period * 4,
        || async {
            let found = owners(leases.get("shared").await.map_err(|e| e.to_string())?);
            if found == expected {
                Ok(())
            } else {
                Err(format!("owners {found:?}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(held(&a));
    a.stop.cancel();
    a.task.await.unwrap();
}
