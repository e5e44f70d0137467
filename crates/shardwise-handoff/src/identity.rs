//! A replica's shard is the ordinal of its StatefulSet pod, parsed strictly.

use thiserror::Error;

/// Why a pod name gives no shard.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdentityError {
    /// The name has no `-` with text on both sides of it.
    #[error(
        "pod name {0:?} does not end in -ORDINAL; shardwise must run as a StatefulSet pod (name-0, name-1, ...)"
    )]
    NoOrdinal(String),
    /// What follows the last `-` is not a decimal number without leading zeros.
    #[error(
        "pod name {name:?} has no valid ordinal ({ordinal:?} is not a decimal number without leading zeros); shardwise must run as a StatefulSet pod"
    )]
    BadOrdinal {
        /// The pod name.
        name: String,
        /// What follows its last `-`.
        ordinal: String,
    },
    /// What precedes the ordinal is not the name of the expected StatefulSet.
    #[error("pod name {name:?} does not belong to StatefulSet {statefulset:?}")]
    WrongStatefulSet {
        /// The pod name.
        name: String,
        /// The StatefulSet the pod should belong to.
        statefulset: String,
    },
}

/// The shard of the pod `pod_name` (`<statefulset>-<ordinal>`). When `statefulset` is given the
/// prefix must be exactly it. Anything else is an error, never a default of 0.
pub fn shard_from_pod_name(
    pod_name: &str,
    statefulset: Option<&str>,
) -> Result<u32, IdentityError> {
    let Some((prefix, ordinal)) = pod_name.rsplit_once('-') else {
        return Err(IdentityError::NoOrdinal(pod_name.to_string()));
    };
    if prefix.is_empty() || ordinal.is_empty() {
        return Err(IdentityError::NoOrdinal(pod_name.to_string()));
    }
    let bad = || IdentityError::BadOrdinal {
        name: pod_name.to_string(),
        ordinal: ordinal.to_string(),
    };
    if !ordinal.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if ordinal.len() > 1 && ordinal.starts_with('0') {
        return Err(bad());
    }
    let shard: u32 = ordinal.parse().map_err(|_| bad())?;
    if let Some(statefulset) = statefulset
        && prefix != statefulset
    {
        return Err(IdentityError::WrongStatefulSet {
            name: pod_name.to_string(),
            statefulset: statefulset.to_string(),
        });
    }
    Ok(shard)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_of_statefulset_pods() {
        assert_eq!(shard_from_pod_name("shardwise-0", None), Ok(0));
        assert_eq!(
            shard_from_pod_name("shardwise-12", Some("shardwise")),
            Ok(12)
        );
        assert_eq!(shard_from_pod_name("my-ctl-3", Some("my-ctl")), Ok(3));
    }

    #[test]
    fn anything_else_is_refused() {
        for (name, sts) in [
            ("shardwise", None),
            ("shardwise-", None),
            ("-3", None),
            ("shardwise-abc", None),
            ("shardwise-7c9f8d-x2x4z", None),
            ("shardwise-01", None),
            ("shardwise-1a", None),
            ("shardwise-99999999999", None),
            ("other-2", Some("shardwise")),
            ("", None),
        ] {
            assert!(shard_from_pod_name(name, sts).is_err(), "{name:?} accepted");
        }
        let message = shard_from_pod_name("shardwise-7c9f8d-x2x4z", None)
            .unwrap_err()
            .to_string();
        assert!(message.contains("StatefulSet"), "{message}");
    }
}
