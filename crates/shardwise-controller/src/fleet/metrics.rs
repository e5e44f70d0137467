//! The Fleet controller's own metrics, served beside the runtime's: the owned apps by health, and
//! the objects held in the caches of the owned clusters.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use shardwise_api::Health;
use shardwise_runtime::ObjectKey;

use crate::live::CacheGauges;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HealthLabels {
    shard: String,
    health: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabels {
    shard: String,
}

/// The gauges, registered once per process.
#[derive(Clone, Debug, Default)]
pub struct FleetMetrics {
    shard: Arc<AtomicU32>,
    apps: Family<HealthLabels, Gauge>,
    cached: Family<ShardLabels, Gauge>,
    cached_bytes: Family<ShardLabels, Gauge>,
}

fn health_name(health: Health) -> &'static str {
    match health {
        Health::Healthy => "Healthy",
        Health::Progressing => "Progressing",
        Health::Unknown => "Unknown",
        Health::Missing => "Missing",
        Health::Degraded => "Degraded",
    }
}

impl FleetMetrics {
    pub fn register(&self, registry: &mut Registry, shard: u32) {
        self.shard.store(shard, Ordering::Relaxed);
        registry.register(
            "shardwise_app_health",
            "Apps this shard owns, by the health of their objects",
            self.apps.clone(),
        );
        registry.register(
            "shardwise_cached_objects",
            "Objects in this shard's caches of its clusters (what shardwise applied there)",
            self.cached.clone(),
        );
        registry.register(
            "shardwise_cached_bytes",
            "Bytes the objects in this shard's caches of its clusters take (their compact JSON)",
            self.cached_bytes.clone(),
        );
    }

    fn shard(&self) -> String {
        self.shard.load(Ordering::Relaxed).to_string()
    }

    fn apps_with(&self, health: Health) -> Gauge {
        self.apps
            .get_or_create(&HealthLabels {
                shard: self.shard(),
                health: health_name(health),
            })
            .clone()
    }

    /// The gauges of the objects in the shard's caches and the bytes they take, which the
    /// caches move as they change.
    pub fn cache_gauges(&self) -> CacheGauges {
        let shard = ShardLabels {
            shard: self.shard(),
        };
        CacheGauges {
            objects: self.cached.get_or_create(&shard).clone(),
            bytes: self.cached_bytes.get_or_create(&shard).clone(),
        }
    }
}

/// The health of every app a term reconciled, kept to count them by health. An app leaves the
/// count with its cluster, when it is found deleted, or when the term ends.
#[derive(Debug)]
pub struct HealthCount {
    metrics: FleetMetrics,
    /// App -> (its cluster, its health).
    apps: Mutex<BTreeMap<ObjectKey, (ObjectKey, Health)>>,
}

impl HealthCount {
    pub fn new(metrics: FleetMetrics) -> Self {
        Self {
            metrics,
            apps: Mutex::new(BTreeMap::new()),
        }
    }

    fn apps(&self) -> MutexGuard<'_, BTreeMap<ObjectKey, (ObjectKey, Health)>> {
        self.apps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn set(&self, app: ObjectKey, cluster: ObjectKey, health: Health) {
        let before = self.apps().insert(app, (cluster, health));
        if let Some((_, was)) = before {
            self.metrics.apps_with(was).dec();
        }
        self.metrics.apps_with(health).inc();
    }

    /// Forgets the apps of `cluster` that `keep` rejects (all of them: the cluster left).
    pub fn forget(&self, cluster: &ObjectKey, keep: impl Fn(&ObjectKey) -> bool) {
        let mut apps = self.apps();
        apps.retain(|app, (of, health)| {
            let kept = of != cluster || keep(app);
            if !kept {
                self.metrics.apps_with(*health).dec();
            }
            kept
        });
    }
}

impl Drop for HealthCount {
    fn drop(&mut self) {
        for (_, health) in self.apps().values() {
            self.metrics.apps_with(*health).dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn apps_are_counted_by_their_latest_health_until_they_or_the_term_go() {
        let metrics = FleetMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry, 2);
        let line = |health: &str, n: i64| {
            format!("shardwise_app_health{{shard=\"2\",health=\"{health}\"}} {n}")
        };
        let (a, b, c) = (
            ObjectKey::new("fleet", "a"),
            ObjectKey::new("fleet", "b"),
            ObjectKey::new("fleet", "c"),
        );
        let (one, two) = (
            ObjectKey::new("fleet", "one"),
            ObjectKey::new("fleet", "two"),
        );
        let count = HealthCount::new(metrics.clone());
        count.set(a.clone(), one.clone(), Health::Progressing);
        count.set(b.clone(), one.clone(), Health::Healthy);
        count.set(c.clone(), two.clone(), Health::Healthy);
        count.set(a.clone(), one.clone(), Health::Healthy);
        let text = encoded(&registry);
        assert!(text.contains(&line("Healthy", 3)), "{text}");
        assert!(text.contains(&line("Progressing", 0)), "{text}");
        // b was deleted; then cluster two left the shard.
        count.forget(&one, |app| *app != b);
        count.forget(&two, |_| false);
        assert!(encoded(&registry).contains(&line("Healthy", 1)));
        drop(count);
        assert!(encoded(&registry).contains(&line("Healthy", 0)));
        let gauges = metrics.cache_gauges();
        gauges.objects.set(42);
        gauges.bytes.set(4200);
        let text = encoded(&registry);
        assert!(
            text.contains("shardwise_cached_objects{shard=\"2\"} 42"),
            "{text}"
        );
        assert!(
            text.contains("shardwise_cached_bytes{shard=\"2\"} 4200"),
            "{text}"
        );
    }
}
