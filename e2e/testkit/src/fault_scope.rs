/// Who a fault applies to: every client the fault reaches, or the identity with this name (as
/// in the kubeconfig).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultScope {
    /// Every client the fault can reach (on kube-apiserver, every identity but the harness's
    /// `admin`).
    Global,
    /// Only the identity with this name.
    Identity(String),
}

impl FaultScope {
    /// The scope of the identity named `name`.
    pub fn identity(name: impl Into<String>) -> Self {
        Self::Identity(name.into())
    }

    /// Whether the fault reaches `identity`'s requests.
    pub fn covers(&self, identity: &str) -> bool {
        match self {
            Self::Global => true,
            Self::Identity(n) => n == identity,
        }
    }
}
