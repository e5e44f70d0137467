//! Synthetic fleets: cluster ids and app counts drawn from a seeded generator.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, RngCore};
use serde::Serialize;
use shard_assign::{AppKeys, Cluster, app_key};

use crate::error::SimError;

/// How apps are spread over clusters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum AppDistribution {
    /// Every cluster gets the same number of apps (the remainder goes to the first ones).
    Uniform,
    /// Each cluster draws a weight uniformly in [0, 1); apps are shared in proportion, so a
    /// cluster holds between none and about twice the mean.
    Random,
    /// The k-th cluster (in a random order) has weight `1 / k^exponent`: a few huge clusters
    /// and a long tail of small ones.
    Zipf {
        /// How steeply weights fall with rank; larger is more skewed.
        exponent: f64,
    },
}

impl AppDistribution {
    /// The exponent of a plain `zipf`.
    const DEFAULT_ZIPF_EXPONENT: f64 = 1.0;
}

impl fmt::Display for AppDistribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppDistribution::Uniform => f.write_str("uniform"),
            AppDistribution::Random => f.write_str("random"),
            AppDistribution::Zipf { exponent } => write!(f, "zipf:{exponent}"),
        }
    }
}

impl FromStr for AppDistribution {
    type Err = SimError;

    /// `uniform`, `random`, `zipf` or `zipf:EXPONENT` (a positive number, default 1).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || SimError::InvalidDistribution(s.to_string());
        match s.split_once(':') {
            None => match s {
                "uniform" => Ok(AppDistribution::Uniform),
                "random" => Ok(AppDistribution::Random),
                "zipf" => Ok(AppDistribution::Zipf {
                    exponent: Self::DEFAULT_ZIPF_EXPONENT,
                }),
                _ => Err(invalid()),
            },
            Some(("zipf", exponent)) => {
                let exponent: f64 = exponent.parse().map_err(|_| invalid())?;
                if exponent.is_finite() && exponent > 0.0 {
                    Ok(AppDistribution::Zipf { exponent })
                } else {
                    Err(invalid())
                }
            }
            Some(_) => Err(invalid()),
        }
    }
}

/// A synthetic fleet: how many clusters, how many apps in all, and how they are spread.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FleetSpec {
    /// Number of clusters.
    pub clusters: u32,
    /// Apps over all clusters.
    pub apps: u64,
    /// How the apps are spread over the clusters.
    pub distribution: AppDistribution,
}

impl FleetSpec {
    /// The reference experiment: 100 clusters, 10,000 apps, a random count per cluster.
    pub const REFERENCE: FleetSpec = FleetSpec {
        clusters: 100,
        apps: 10_000,
        distribution: AppDistribution::Random,
    };

    /// Draws the fleet. Ids look like Kubernetes UIDs and are unique within the fleet.
    pub fn generate(&self, rng: &mut impl RngCore) -> Vec<Cluster> {
        let counts = self.app_counts(rng);
        counts
            .into_iter()
            .enumerate()
            .map(|(i, apps)| {
                let id = random_uid(rng);
                Cluster {
                    name: format!("cluster-{i:05}"),
                    id,
                    apps,
                    pin: None,
                    weight: None,
                }
            })
            .collect()
    }

    fn app_counts(&self, rng: &mut impl RngCore) -> Vec<u64> {
        let n = self.clusters as usize;
        let weights: Vec<f64> = match self.distribution {
            AppDistribution::Uniform => vec![1.0; n],
            AppDistribution::Random => (0..n).map(|_| rng.random::<f64>()).collect(),
            AppDistribution::Zipf { exponent } => {
                let mut ranks: Vec<usize> = (1..=n).collect();
                shuffle(&mut ranks, rng);
                ranks
                    .into_iter()
                    .map(|rank| 1.0 / (rank as f64).powf(exponent))
                    .collect()
            }
        };
        apportion(self.apps, &weights)
    }
}

/// Splits `total` into integer shares proportional to `weights` that add up to `total` exactly
/// (largest remainder method; ties to the lower index). All-zero weights share equally.
pub fn apportion(total: u64, weights: &[f64]) -> Vec<u64> {
    if weights.is_empty() {
        return Vec::new();
    }
    let sum: f64 = weights.iter().sum();
    let weights: Vec<f64> = if sum > 0.0 {
        weights.to_vec()
    } else {
        vec![1.0; weights.len()]
    };
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| total as f64 * w / sum).collect();
    let mut shares: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let assigned: u64 = shares.iter().sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let ra = exact[a] - exact[a].floor();
        let rb = exact[b] - exact[b].floor();
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    let mut left = total.saturating_sub(assigned);
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        shares[i] += 1;
        left -= 1;
    }
    shares
}

/// A random version-4 UUID in its text form, like the UID of a Kubernetes object.
pub fn random_uid(rng: &mut impl RngCore) -> String {
    let mut bytes = [0u8; 16];
    rng.fill_bytes(&mut bytes);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The UID of app `index` of a cluster: a version-4 UUID derived from the cluster's id, so that
/// a cluster's apps are the same in every step of a scenario and drawing them costs the seed's
/// generator nothing (reports without slicing stay as they were).
pub fn app_uid(cluster_id: &str, index: u64) -> String {
    let mut state = app_key(cluster_id) ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        // splitmix64
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (a, b) = (next(), next());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:x}{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        8 | (b >> 62),
        (b >> 48) & 0xfff,
        b & 0xffff_ffff_ffff
    )
}

/// The keys of every app of `clusters` (by id; a cluster seen twice keeps its first count).
pub fn app_keys<'a>(clusters: impl IntoIterator<Item = &'a Cluster>) -> AppKeys {
    let mut keys = AppKeys::new();
    for cluster in clusters {
        keys.entry(cluster.id.clone()).or_insert_with(|| {
            let mut k: Vec<u64> = (0..cluster.apps)
                .map(|i| app_key(&app_uid(&cluster.id, i)))
                .collect();
            k.sort_unstable();
            k
        });
    }
    keys
}

/// Fisher-Yates with the simulator's generator (reproducible for a seed).
pub fn shuffle<T>(items: &mut [T], rng: &mut impl RngCore) {
    for i in (1..items.len()).rev() {
        let j = rng.random_range(0..=i);
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn apportion_adds_up_exactly_and_follows_the_weights() {
        assert_eq!(apportion(10, &[1.0, 1.0, 1.0]), vec![4, 3, 3]);
        assert_eq!(apportion(100, &[3.0, 1.0]), vec![75, 25]);
        assert_eq!(apportion(5, &[0.0, 0.0]), vec![3, 2]);
        assert!(apportion(7, &[]).is_empty());
    }

    #[test]
    fn the_reference_fleet_has_the_requested_size_and_spread() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let fleet = FleetSpec::REFERENCE.generate(&mut rng);
        assert_eq!(fleet.len(), 100);
        assert_eq!(fleet.iter().map(|c| c.apps).sum::<u64>(), 10_000);
        let max = fleet.iter().map(|c| c.apps).max().unwrap();
        let min = fleet.iter().map(|c| c.apps).min().unwrap();
        // Uniform weights in [0, 1): counts range from near 0 to near twice the mean.
        assert!(max > 150 && min < 50, "min {min} max {max}");
        let mut ids: Vec<&str> = fleet.iter().map(|c| c.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 100);
        assert_eq!(fleet[0].id.len(), 36);
    }

    #[test]
    fn zipf_is_skewed_and_uniform_is_flat() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let spec = FleetSpec {
            clusters: 50,
            apps: 5_000,
            distribution: "zipf".parse().unwrap(),
        };
        let fleet = spec.generate(&mut rng);
        let max = fleet.iter().map(|c| c.apps).max().unwrap();
        // The rank-1 cluster holds 1 / H(50) ~ 22% of the apps.
        assert!((1_000..=1_200).contains(&max), "{max}");
        let flat = FleetSpec {
            distribution: AppDistribution::Uniform,
            ..spec
        }
        .generate(&mut rng);
        assert!(flat.iter().all(|c| c.apps == 100));
    }

    #[test]
    fn distributions_parse() {
        assert_eq!(
            "uniform".parse::<AppDistribution>().unwrap(),
            AppDistribution::Uniform
        );
        assert_eq!(
            "zipf:1.5".parse::<AppDistribution>().unwrap(),
            AppDistribution::Zipf { exponent: 1.5 }
        );
        for bad in ["", "zipf:-1", "zipf:x", "normal", "random:2"] {
            assert!(bad.parse::<AppDistribution>().is_err(), "{bad}");
        }
    }
}
