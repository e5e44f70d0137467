//! End-to-end tests of slices: a cluster too hot for one replica is cut into slices of its
//! apps, spread over the replicas, and handed off slice by slice through scale-downs and
//! scale-ups, with the chart's replica pods on a real control plane.

// Test code: a step that fails fails the test, helpers included.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::api::ListParams;
use kube::{Api, ResourceExt};
use shardwise_api::FleetCluster;
use shardwise_e2e::wait_with;
use shardwise_handoff::keys::{SLICE_SHARDS_ANNOTATION, SLICES_LABEL, unit_token};
use shardwise_wire::slice::UnitSlice;
use support::{Fleet, FleetOptions, NAMESPACE, raised_client_limits, shard_label};

/// A bound, not a wait.
const SETTLE: Duration = Duration::from_secs(300);

/// Max over mean of the apps each of `shards` holds: those of its clusters and slices.
async fn apps_balance(fleet: &Fleet, shards: &[u32]) -> Result<f64, String> {
    let apps = fleet
        .apps_api()
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let placement = fleet.placement().await.map_err(|e| e.to_string())?;
    let mut per_shard: BTreeMap<u32, u64> = shards.iter().map(|&s| (s, 0)).collect();
    for app in &apps.items {
        let shard = placement
            .owner_of(app)
            .ok_or_else(|| format!("{} has no owner", app.name_any()))?;
        *per_shard.entry(shard).or_default() += 1;
    }
    let total: u64 = per_shard.values().sum();
    let max = per_shard.values().copied().max().unwrap_or(0);
    let mean = total as f64 / per_shard.len() as f64;
    eprintln!("apps per shard {per_shard:?}");
    Ok(max as f64 / mean)
}

/// Waits until every app is Synced on a live shard and the owned apps per replica are within
/// 1.10 of the mean, with the hot cluster cut over several shards. The planner balances apps
/// plus the cost of each extra cache copy of the hot cluster (a cut must pay for its copies,
/// memory's share of the apps their bytes are worth: about 80 of these small apps each), so
/// app counts alone may sit a little further from the mean than its 1.03 target.
async fn wait_balanced_and_settled(fleet: &Fleet, live: &[u32]) {
    if let Err(e) = fleet.wait_settled(live, SETTLE).await {
        panic!("{e}\n{}", fleet.report());
    }
    wait_with(
        "owned apps per replica within 1.10 of the mean",
        fleet.settle_poll(SETTLE),
        || async {
            fleet.check_settled(live).await?;
            let placement = fleet.placement().await.map_err(|e| e.to_string())?;
            let cut = placement.cut();
            let hot = cut.get("cluster-0").ok_or("cluster-0 is not cut")?;
            if hot.len() < 2 {
                return Err(format!("cluster-0 is cut but on {hot:?} only"));
            }
            let balance = apps_balance(fleet, live).await?;
            if balance <= 1.10 {
                Ok(())
            } else {
                Err(format!("max/mean {balance:.3}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", fleet.report()));
}

/// 4 replicas, 4,000 apps, 60% of them on one cluster: the hot cluster is cut and spread, so
/// each replica owns about a quarter of the apps; a scale-down to 3 and up to 5 hands its slices
/// over; every app is Synced after each step, and no two processes ever worked on one app (nor
/// on overlapping slices) at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_cluster_is_cut_spread_and_handed_over_slice_by_slice() {
    let mut fleet = Fleet::start(FleetOptions {
        replicas: 4,
        clusters: 16,
        apps: 4000,
        hot_percent: Some(60),
        audit: true,
        // A running fleet, as after the planner's first pass: each of 4,000 apps labelled
        // with its cluster's token first took most of the first settle (170 s on 2 cores).
        // The next test starts from apps without tokens, labelled while the cut is made.
        tokened_apps: true,
        // Placement by app count, since app counts are what the test checks: under the
        // default measured model the planner balances busy time instead, and leaves app counts
        // alone while the measured balance is inside its band.
        args: std::iter::once("--load-model=apps".to_string())
            .chain(raised_client_limits())
            .collect(),
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    let started = std::time::Instant::now();
    wait_balanced_and_settled(&fleet, &[0, 1, 2, 3]).await;
    eprintln!(
        "4 replicas: balanced in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // kubectl's view: the cut cluster shows its slices and their shards; its UnitSlices name
    // their ranges. The planner may still refine the cut after the fleet settled, so each look
    // reads the records between two reads of their versions, and is taken again until it
    // describes one moment of the fleet.
    let kubeconfig = fleet.env.control_plane().kubeconfig_path("admin").unwrap();
    wait_with(
        "kubectl, the cut cluster and its UnitSlices to agree, read at one moment",
        fleet.settle_poll(SETTLE),
        || look_at_the_cut(&fleet, &kubeconfig),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", fleet.report()));

    // Neither this test server nor kube-apiserver with its default gates selects by key
    // range, and every replica found that out: each keeps its slices' apps itself.
    assert_eq!(server_selection(&fleet).await, [0.0; 4]);

    fleet.scale(3).await.unwrap();
    fleet.stop_replica(3).await.unwrap();
    let started = std::time::Instant::now();
    wait_balanced_and_settled(&fleet, &[0, 1, 2]).await;
    eprintln!(
        "4 -> 3: balanced in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    fleet.scale(5).await.unwrap();
    fleet.spawn_replica(3).await.unwrap();
    fleet.spawn_replica(4).await.unwrap();
    let started = std::time::Instant::now();
    wait_balanced_and_settled(&fleet, &[0, 1, 2, 3, 4]).await;
    eprintln!(
        "3 -> 5: balanced in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let intervals = fleet.audited_without_overlap();
    let sliced = intervals
        .iter()
        .filter(|i| i.range != shard_assign::KeyRange::WHOLE)
        .count();
    eprintln!(
        "{} reconciles audited, {sliced} under slices of a cut cluster, no overlap",
        intervals.len()
    );
    assert!(sliced > 0);
}

/// cluster-0 and every UnitSlice, as the server has them now.
async fn read_cut(fleet: &Fleet) -> Result<(FleetCluster, Vec<UnitSlice>), String> {
    let hot = fleet
        .clusters_api()
        .get("cluster-0")
        .await
        .map_err(|e| e.to_string())?;
    let records: Api<UnitSlice> = Api::namespaced(fleet.admin.clone(), NAMESPACE);
    let records = records
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok((hot, records.items))
}

/// The resourceVersions of a read of the cut: equal in two reads, nothing of the cut changed
/// in between.
fn versions(hot: &FleetCluster, records: &[UnitSlice]) -> Vec<String> {
    let mut versions: Vec<String> = records
        .iter()
        .map(|s| {
            format!(
                "{}@{}",
                s.name_any(),
                s.resource_version().unwrap_or_default()
            )
        })
        .collect();
    versions.sort();
    versions.push(format!(
        "cluster-0@{}",
        hot.resource_version().unwrap_or_default()
    ));
    versions
}

/// `kubectl -n shardwise <args>` as the admin.
fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-n", NAMESPACE])
        .args(args)
        .output()
        .map_err(|e| format!("kubectl: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    String::from_utf8(output.stdout).map_err(|e| e.to_string())
}

/// One look at the cut cluster, by its records and through kubectl, all of one moment (the
/// versions of the cut read before and after are the same): its labels give the slices, its
/// annotation their shards, one UnitSlice per slice, kubectl's printer columns say the same,
/// and its status is written by the owner of the slice holding key 0 alone.
async fn look_at_the_cut(fleet: &Fleet, kubeconfig: &std::path::Path) -> Result<(), String> {
    let (hot, records) = read_cut(fleet).await?;
    let table = kubectl(
        kubeconfig,
        &["get", "fleetclusters", "cluster-0", "cluster-1"],
    )?;
    let slices_table = kubectl(kubeconfig, &["get", "unitslices"])?;
    let placement = fleet.placement().await.map_err(|e| e.to_string())?;
    let (hot_after, records_after) = read_cut(fleet).await?;
    if versions(&hot_after, &records_after) != versions(&hot, &records) {
        return Err("the cut changed while it was read".to_string());
    }
    let slices: usize = hot
        .labels()
        .get(SLICES_LABEL)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("cluster-0 is not cut: {:?}", hot.labels()))?;
    if slices < 2 {
        return Err(format!("cut in {slices}: {:?}", hot.labels()));
    }
    if let Some(shard) = shard_label(&hot) {
        return Err(format!("the cut cluster has a shard of its own, {shard}"));
    }
    if records.len() != slices {
        return Err(format!("{slices} slices but {} UnitSlices", records.len()));
    }
    let mut shards = Vec::new();
    for record in &records {
        let shard = shard_label(record)
            .ok_or_else(|| format!("UnitSlice {} has no shard", record.name_any()))?;
        shards.push(shard.to_string());
    }
    shards.sort();
    shards.dedup();
    let shown = hot
        .annotations()
        .get(SLICE_SHARDS_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    if shown != shards.join(",") {
        return Err(format!(
            "cluster-0 shows shards {shown:?}, its UnitSlices are on {shards:?}"
        ));
    }
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    if header.get(..4) != Some(&["NAME", "SHARD", "SLICES", "SHARDS"][..]) {
        return Err(format!("printer columns:\n{table}"));
    }
    let hot_row = table
        .lines()
        .find(|l| l.starts_with("cluster-0 "))
        .unwrap_or_default();
    if !(hot_row.contains(&format!(" {slices} ")) && hot_row.contains(shown.as_str())) {
        return Err(format!("kubectl shows another cut:\n{table}"));
    }
    if slices_table.lines().count() != slices + 1
        || !slices_table
            .lines()
            .skip(1)
            .all(|l| l.contains("cluster-0"))
    {
        return Err(format!("kubectl's UnitSlices:\n{slices_table}"));
    }
    // Exactly one owner reports on the cut cluster: its status names the shard of the slice
    // holding key 0, and no app count (each owner sees its own slices only).
    let status = hot.status.clone().unwrap_or_default();
    let first = placement.clusters["cluster-0"][0];
    if (status.shard, status.app_count) != (Some(first.1), None) {
        return Err(format!(
            "cluster-0's status says shard {:?} with {:?} apps; the slice holding key 0 is on {}",
            status.shard, status.app_count, first.1
        ));
    }
    eprintln!("{table}\n{slices_table}");
    Ok(())
}

/// What each replica says of the API server: 1 if it selects items by key range.
async fn server_selection(fleet: &Fleet) -> Vec<f64> {
    let mut said = Vec::new();
    for &ordinal in fleet.replicas.keys() {
        let metrics = fleet.scrape(ordinal).await.unwrap();
        said.push(metrics.sum("shardwise_server_shard_selection", &[]));
    }
    said
}

/// KEP-5866 on kube-apiserver with its `ShardedListAndWatch` gate on: the owners of the hot
/// cluster's slices list its apps with a shard selector of their slices' ranges, the server
/// keeps only the apps of those ranges, and every app still ends Synced with no overlap (an app
/// the server left out that its owner needed would never be reconciled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slice_owners_have_the_server_select_their_apps_where_it_can() {
    let fleet = Fleet::start(FleetOptions {
        replicas: 4,
        clusters: 16,
        apps: 2000,
        hot_percent: Some(60),
        audit: true,
        args: std::iter::once("--load-model=apps".to_string())
            .chain(raised_client_limits())
            .collect(),
        apiserver_args: vec!["--feature-gates=ShardedListAndWatch=true".to_string()],
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    wait_balanced_and_settled(&fleet, &[0, 1, 2, 3]).await;
    assert_eq!(server_selection(&fleet).await, [1.0; 4]);
    // The planner may still refine the cut after the fleet settled (a cut must pay for its
    // copies, and the balance is chased to 1.03): wait until the cut tiles the cluster again
    // and each owner of a slice has listed (at least) that slice's range, or watches every
    // cluster it holds in one watch.
    let hot_token = unit_token(NAMESPACE, "cluster-0");
    let lists = wait_with(
        "each owner of a slice of cluster-0 to have listed its apps by the slice's range",
        fleet.settle_poll(SETTLE),
        || async {
            let lists = AppLists::read(&fleet, &hot_token);
            let placement = fleet.placement().await.map_err(|e| e.to_string())?;
            for (range, shard, _) in &placement.clusters["cluster-0"] {
                let link = &fleet.replicas[shard].link;
                if lists.merged.contains(link) {
                    continue;
                }
                let sent = lists.selected.get(link).cloned().unwrap_or_default();
                if !sent.iter().any(|s| covers(s, *range)) {
                    return Err(format!("shard {shard} owns {range}; it sent {sent:?}"));
                }
            }
            Ok(lists)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", fleet.report()));
    let selected = lists.selected;
    eprintln!("lists of apps with a shard selector: {selected:#?}");
    assert!(!selected.is_empty(), "no replica listed apps by selector");
    // The server's answer to a few of them, sent again, is exactly the apps of their ranges.
    for (path, query, selector) in lists.replayable.iter().take(4) {
        replay_selects_by_key(&fleet, path, query, selector).await;
    }
    for sent in selected.values().flatten() {
        assert!(
            sent.starts_with("shardRange(object.metadata.uid, ")
                && !sent.contains("'0x0000000000000000', '0x10000000000000000'"),
            "{sent}"
        );
    }
    let intervals = fleet.audited_without_overlap();
    eprintln!("{} reconciles audited, no overlap", intervals.len());
}

/// The lists of apps the replicas sent, read from the server's audit log.
struct AppLists {
    /// Each identity's shard selectors.
    selected: BTreeMap<String, Vec<String>>,
    /// Identities that listed the hot cluster's apps among those of several clusters, with no
    /// range to select by: a watch of every cluster a replica holds, which it starts when it
    /// has too many (after many moves, which a loaded machine's first settle can make).
    merged: BTreeSet<String>,
    /// (path, query, selector) of each list with a selector, in the order sent.
    replayable: Vec<(String, String, String)>,
}

impl AppLists {
    fn read(fleet: &Fleet, hot_token: &str) -> Self {
        let mut lists = Self {
            selected: BTreeMap::new(),
            merged: BTreeSet::new(),
            replayable: Vec::new(),
        };
        for r in fleet.env.control_plane().server().requests() {
            if r.method != "LIST" || !r.path.ends_with("/fleetapps") || r.code != 200 {
                continue;
            }
            let param = |key: &str| {
                form_urlencoded::parse(r.query.as_bytes())
                    .find(|(name, _)| name == key)
                    .map(|(_, value)| value.into_owned())
            };
            let labels = param("labelSelector").unwrap_or_default();
            match param("shardSelector") {
                None if labels.contains(hot_token) && labels.contains(',') => {
                    lists.merged.insert(r.identity.clone());
                }
                None => {}
                Some(selector) => {
                    lists
                        .replayable
                        .push((r.path.clone(), r.query.clone(), selector.clone()));
                    lists
                        .selected
                        .entry(r.identity.clone())
                        .or_default()
                        .push(selector);
                }
            }
        }
        lists
    }
}

/// Sends the list a replica sent (`path?query`, `selector` its shard selector) again, with and
/// without the selector: the server's answer with it is exactly the apps of the answer without
/// it whose keys (`shard_assign::app_key` of their UIDs) lie in the selector's ranges, and
/// fewer of them.
async fn replay_selects_by_key(fleet: &Fleet, path: &str, query: &str, selector: &str) {
    let list = |query: String| async move {
        let request = http::Request::get(format!("{path}?{query}"))
            .body(Vec::new())
            .unwrap();
        let list: kube::core::ObjectList<shardwise_api::FleetApp> =
            fleet.admin.request(request).await.unwrap();
        let mut names: Vec<(String, u64)> = list
            .items
            .iter()
            .map(|a| {
                (
                    a.name_any(),
                    shard_assign::app_key(a.metadata.uid.as_deref().unwrap()),
                )
            })
            .collect();
        names.sort();
        names
    };
    let without: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(
            form_urlencoded::parse(query.as_bytes()).filter(|(name, _)| name != "shardSelector"),
        )
        .finish();
    let selected = list(query.to_string()).await;
    let everything = list(without).await;
    let in_ranges: Vec<(String, u64)> = everything
        .iter()
        .filter(|(_, key)| in_selector(selector, *key))
        .cloned()
        .collect();
    assert_eq!(selected, in_ranges, "{selector}");
    assert!(
        !selected.is_empty() && selected.len() < everything.len(),
        "{selector}: {} of {}",
        selected.len(),
        everything.len()
    );
}

/// The `[start, end)` bounds of each `shardRange` term of `selector`.
fn bounds(selector: &str) -> Vec<(u128, u128)> {
    selector
        .split(" || ")
        .filter_map(|term| {
            let hex: Vec<u128> = term
                .split('\'')
                .filter_map(|part| part.strip_prefix("0x"))
                .filter_map(|hex| u128::from_str_radix(hex, 16).ok())
                .collect();
            match hex[..] {
                [start, end] => Some((start, end)),
                _ => None,
            }
        })
        .collect()
}

/// Whether `key` lies in one of `selector`'s ranges.
fn in_selector(selector: &str, key: u64) -> bool {
    bounds(selector)
        .iter()
        .any(|&(start, end)| start <= u128::from(key) && u128::from(key) < end)
}

/// Whether one `shardRange` term of `selector` holds every key of `range` (a selector joins
/// adjacent ranges into one term).
fn covers(selector: &str, range: shard_assign::KeyRange) -> bool {
    bounds(selector)
        .iter()
        .any(|&(start, end)| start <= u128::from(range.start()) && u128::from(range.last()) < end)
}
