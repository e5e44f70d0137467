//! The words a controller uses for its units and items.

/// Words for a controller's units and items, in metric labels, help texts, logs and the audit:
/// `shardwise_owned_units{kind="<unit>"}`. Lowercase, `[a-z_]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nouns {
    /// One unit, as in `kind="namespace"`.
    pub unit: &'static str,
    /// Units, as in the help text "Namespaces this shard owns".
    pub units: &'static str,
    /// One item.
    pub item: &'static str,
    /// Items.
    pub items: &'static str,
}
