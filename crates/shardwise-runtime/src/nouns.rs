//! The words a controller uses for its units and items.

/// Words for a controller's units and items, in metric names, labels, logs and the audit:
/// `shardwise_owned_<units>`, `kind="<unit>"`. Lowercase, `[a-z_]`, so that every metric name
/// they make is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nouns {
    /// One unit, as in `kind="namespace"`.
    pub unit: &'static str,
    /// Units, as in `shardwise_owned_namespaces`.
    pub units: &'static str,
    /// One item.
    pub item: &'static str,
    /// Items.
    pub items: &'static str,
}
