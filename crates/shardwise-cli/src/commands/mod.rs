//! One module per subcommand.

pub(crate) mod assign;
pub(crate) mod crds;
pub(crate) mod simulate;
