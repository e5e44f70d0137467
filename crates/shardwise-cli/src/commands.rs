//! One module per subcommand.

pub(crate) mod apply;
pub(crate) mod assign;
pub(crate) mod completions;
pub(crate) mod crds;
pub(crate) mod plan;
pub(crate) mod simulate;
