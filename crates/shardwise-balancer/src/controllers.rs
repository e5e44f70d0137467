//! Which of Argo CD's shards the balancer may place clusters on, decided from the application
//! controller pods that run now. No I/O: the pods are read elsewhere and passed in.
//!
//! Argo CD has no handoff protocol: a controller owns the clusters whose `shard` key it reads as
//! its own shard, and each process reads keys with the replica count it started with (a key at
//! or above that count means shard 0). While pods of two counts run (a rollout, or a scale under
//! dynamic cluster distribution before the old pods restart) a key at or above the smaller
//! count has two owners. So the balancer only places clusters on shards below every running
//! pod's count ([`Shards::agreed`]), and only on shards a Ready pod serves; a shard whose pod
//! has not been Ready for the grace period is given up and its clusters rescued.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use shard_assign::{ShardId, ShardSet};
pub use shardwise_plan::installation::ControllerPod;

/// The shards as the balancer may use them after one look at the pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shards {
    /// Keys below this are read alike by every running pod: the smallest of the target and
    /// every running pod's count. Clusters on a shard at or above it move at once.
    pub agreed: u32,
    /// Every running pod reads keys with the target count: a cluster without a key is placed
    /// by Argo CD's algorithm alike everywhere.
    pub uniform: bool,
    /// Shards below `agreed` that a Ready pod serves: the only shards clusters move onto.
    pub ready: ShardSet,
    /// Shards below `agreed` without a Ready pod for less than the grace period: their
    /// clusters stay and nothing moves onto them.
    pub down: BTreeSet<ShardId>,
    /// Shards below `agreed` without a Ready pod for the grace period or longer: their
    /// clusters are rescued onto Ready shards until they recover.
    pub dead: BTreeSet<ShardId>,
    /// Shards below `agreed` whose pod is to restart (`--manage-replicas`): their clusters are
    /// moved off as from a dead shard, and come back once it serves again.
    pub draining: BTreeSet<ShardId>,
    /// Why nothing may be written now, if so.
    pub hold: Option<String>,
}

impl Shards {
    /// Drains `shard`: nothing stays on it or moves onto it, and its clusters leave as rescued
    /// ones do (they come back once it is no longer drained).
    pub fn drain(&mut self, shard: ShardId) {
        self.ready = self.ready.iter().filter(|&s| s != shard).collect();
        self.down.remove(&shard);
        self.dead.remove(&shard);
        self.draining.insert(shard);
    }
}

/// The watchdog's memory between two looks: since when each shard has had no Ready pod, on
/// this balancer's own clock. A new leader starts afresh, so it rescues no sooner than one
/// grace period after it took over: late, never early.
#[derive(Debug, Default)]
pub struct Health {
    down_since: BTreeMap<ShardId, Instant>,
    /// Since when each pod (by UID) has been Ready and not deleting, as this balancer saw it.
    ready_since: BTreeMap<String, Instant>,
}

impl Health {
    /// Looks at `pods` of a workload asking for `target` replicas at `now`: the shards as the
    /// balancer may use them, a shard given up once it has had no Ready pod for `grace`.
    pub fn observe(
        &mut self,
        target: u32,
        pods: &[ControllerPod],
        now: Instant,
        grace: Duration,
    ) -> Shards {
        let mut hold = None;
        let unknown: Vec<&str> = pods
            .iter()
            .filter(|p| p.replicas.is_none())
            .map(|p| p.name.as_str())
            .collect();
        if !unknown.is_empty() {
            hold = Some(format!(
                "the replica count of controller pod(s) {} cannot be told: no key is written until they restart",
                unknown.join(", ")
            ));
        }
        let counts = pods.iter().filter_map(|p| p.replicas);
        let agreed = if shardwise_runtime::failpoints::seeded(
            shardwise_runtime::failpoints::BALANCER_KEY_ABOVE_POD_COUNT,
        ) {
            target
        } else {
            counts.clone().fold(target, u32::min)
        };
        let uniform = counts.clone().all(|c| c == target);
        if hold.is_none() && agreed <= 1 {
            hold = Some(if target <= 1 {
                format!("Argo CD does not shard (replica count {target}): nothing to balance")
            } else {
                let unsharded: Vec<&str> = pods
                    .iter()
                    .filter(|p| p.replicas.is_some_and(|c| c <= 1))
                    .map(|p| p.name.as_str())
                    .collect();
                format!(
                    "controller pod(s) {} run without sharding and reconcile every cluster: no key is written until they are replaced",
                    unsharded.join(", ")
                )
            });
        }
        self.ready_since.retain(|uid, _| {
            pods.iter()
                .any(|p| &p.uid == uid && p.ready && !p.terminating)
        });
        for pod in pods.iter().filter(|p| p.ready && !p.terminating) {
            self.ready_since.entry(pod.uid.clone()).or_insert(now);
        }
        let serving: BTreeSet<ShardId> = pods
            .iter()
            .filter(|p| p.ready && !p.terminating)
            .filter_map(|p| p.shard)
            .filter(|&s| s < agreed)
            .collect();
        self.down_since
            .retain(|shard, _| *shard < agreed && !serving.contains(shard));
        let (mut down, mut dead) = (BTreeSet::new(), BTreeSet::new());
        for shard in (0..agreed).filter(|s| !serving.contains(s)) {
            let since = *self.down_since.entry(shard).or_insert(now);
            if now.saturating_duration_since(since) >= grace {
                dead.insert(shard);
            } else {
                down.insert(shard);
            }
        }
        if hold.is_none() && serving.is_empty() {
            hold = Some("no controller pod is Ready: no key is written until one is".to_string());
        }
        Shards {
            agreed,
            uniform,
            ready: serving.into_iter().collect(),
            down,
            dead,
            draining: BTreeSet::new(),
            hold,
        }
    }

    /// Whether `pod` has been Ready, and not deleting, for `settle` or longer at `now`, as
    /// this balancer saw it from the looks it took ([`Health::observe`]): a new leader waits
    /// the whole time again.
    pub fn settled(&self, pod: &ControllerPod, now: Instant, settle: Duration) -> bool {
        self.ready_since
            .get(&pod.uid)
            .is_some_and(|since| now.saturating_duration_since(*since) >= settle)
    }
}

/// For tests: the Ready pod `controller-<shard>` serving `shard`, reading keys with `replicas`.
#[cfg(test)]
pub(crate) fn ready_pod(shard: ShardId, replicas: u32) -> ControllerPod {
    ControllerPod {
        name: format!("controller-{shard}"),
        shard: Some(shard),
        replicas: Some(replicas),
        ready: true,
        terminating: false,
        ..ControllerPod::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::ready_pod as pod;

    const GRACE: Duration = Duration::from_secs(60);

    #[test]
    fn pods_of_two_counts_agree_only_below_the_smaller() {
        let mut health = Health::default();
        let now = Instant::now();
        // 3 -> 4: the new pod 3 runs, pods 0 to 2 still read keys with 3.
        let up = [pod(0, 3), pod(1, 3), pod(2, 3), pod(3, 4)];
        let shards = health.observe(4, &up, now, GRACE);
        assert_eq!(shards.agreed, 3);
        assert!(!shards.uniform);
        assert_eq!(shards.ready, ShardSet::contiguous(3));
        assert!(shards.down.is_empty() && shards.dead.is_empty());
        assert_eq!(shards.hold, None);
        // Rolled: every pod reads with 4.
        let rolled = [pod(0, 4), pod(1, 4), pod(2, 4), pod(3, 4)];
        let shards = health.observe(4, &rolled, now, GRACE);
        assert_eq!((shards.agreed, shards.uniform), (4, true));
        assert_eq!(shards.ready, ShardSet::contiguous(4));
        // 4 -> 3 asked, nothing rolled yet: shard 3 is left at once.
        let shards = health.observe(3, &rolled, now, GRACE);
        assert_eq!((shards.agreed, shards.uniform), (3, false));
        assert_eq!(shards.ready, ShardSet::contiguous(3));
    }

    #[test]
    fn a_shard_without_a_ready_pod_is_down_then_dead_after_the_grace_and_back_when_ready() {
        let mut health = Health::default();
        let start = Instant::now();
        let mut pods = vec![pod(0, 3), pod(1, 3), pod(2, 3)];
        pods[1].ready = false;
        let shards = health.observe(3, &pods, start, GRACE);
        assert_eq!(shards.ready.as_slice(), [0, 2]);
        assert_eq!(shards.down, BTreeSet::from([1]));
        assert!(shards.dead.is_empty());
        // Still down just before the grace ends, even if the pod is gone meanwhile.
        pods.remove(1);
        let shards = health.observe(3, &pods, start + GRACE - Duration::from_millis(1), GRACE);
        assert_eq!(shards.down, BTreeSet::from([1]));
        let shards = health.observe(3, &pods, start + GRACE, GRACE);
        assert!(shards.down.is_empty());
        assert_eq!(shards.dead, BTreeSet::from([1]));
        // A replacement that is not Ready yet keeps it dead; a Ready one brings it back.
        let mut back = pod(1, 3);
        back.ready = false;
        pods.push(back);
        let later = start + 2 * GRACE;
        assert_eq!(
            health.observe(3, &pods, later, GRACE).dead,
            BTreeSet::from([1])
        );
        pods[2].ready = true;
        let shards = health.observe(3, &pods, later, GRACE);
        assert_eq!(shards.ready, ShardSet::contiguous(3));
        assert!(shards.down.is_empty() && shards.dead.is_empty());
        // Down again later: the grace starts over.
        pods[2].ready = false;
        let again = later + Duration::from_secs(1);
        assert_eq!(
            health.observe(3, &pods, again, GRACE).down,
            BTreeSet::from([1])
        );
    }

    #[test]
    fn a_terminating_pod_serves_no_shard_but_its_count_still_binds() {
        let mut health = Health::default();
        let mut old = pod(2, 4);
        old.terminating = true;
        let shards = health.observe(3, &[pod(0, 3), pod(1, 3), old], Instant::now(), GRACE);
        assert_eq!(shards.agreed, 3);
        assert!(
            !shards.uniform,
            "the terminating pod still reads keys with 4"
        );
        assert_eq!(shards.ready.as_slice(), [0, 1]);
        assert_eq!(shards.down, BTreeSet::from([2]));
    }

    #[test]
    fn nothing_is_written_while_a_count_is_unknown_unsharded_or_no_pod_is_ready() {
        let now = Instant::now();
        let mut unknown = pod(1, 3);
        unknown.replicas = None;
        let shards = Health::default().observe(3, &[pod(0, 3), unknown], now, GRACE);
        assert!(shards.hold.unwrap().contains("controller-1"));

        let shards = Health::default().observe(1, &[pod(0, 1)], now, GRACE);
        assert!(shards.hold.unwrap().contains("does not shard"));

        // 1 -> 3: the old pod reconciles every cluster whatever the keys say.
        let shards = Health::default().observe(3, &[pod(0, 1), pod(1, 3), pod(2, 3)], now, GRACE);
        assert!(shards.hold.unwrap().contains("controller-0"));

        let mut pods = [pod(0, 2), pod(1, 2)];
        pods.iter_mut().for_each(|p| p.ready = false);
        let shards = Health::default().observe(2, &pods, now, GRACE);
        assert!(shards.hold.unwrap().contains("no controller pod is Ready"));

        let shards = Health::default().observe(3, &[pod(0, 3), pod(1, 3), pod(2, 3)], now, GRACE);
        assert_eq!(shards.hold, None);
    }

    #[test]
    fn a_pod_serving_a_shard_at_or_above_the_agreed_count_serves_none_of_them() {
        let mut health = Health::default();
        let shards = health.observe(2, &[pod(0, 2), pod(1, 2), pod(2, 3)], Instant::now(), GRACE);
        assert_eq!(shards.agreed, 2);
        assert_eq!(shards.ready, ShardSet::contiguous(2));
        let mut none = pod(0, 2);
        none.shard = None;
        let shards = health.observe(2, &[none, pod(1, 2)], Instant::now(), GRACE);
        assert_eq!(shards.ready.as_slice(), [1]);
        assert_eq!(shards.down, BTreeSet::from([0]));
    }
}
