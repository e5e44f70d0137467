//! Identities and bearer-token authentication.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use rand::Rng;

/// A client identity: the name used for kubeconfig contexts and fault scoping, the user name
/// and groups RBAC sees, and the bearer token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The kubeconfig user and context name, also the name faults are scoped by.
    pub name: String,
    /// The user name RBAC sees, e.g. `system:serviceaccount:ns:sa`.
    pub user: String,
    /// The groups RBAC sees, without the implied `system:authenticated`.
    pub groups: Vec<String>,
    /// The bearer token that authenticates as this identity.
    pub token: String,
}

impl Identity {
    /// An identity with a random token; service-account users get their implied groups.
    pub fn new(name: impl Into<String>, user: impl Into<String>) -> Self {
        let user = user.into();
        let mut groups = Vec::new();
        if let Some(rest) = user.strip_prefix("system:serviceaccount:")
            && let Some((ns, _)) = rest.split_once(':')
        {
            groups.push("system:serviceaccounts".to_string());
            groups.push(format!("system:serviceaccounts:{ns}"));
        }
        Self {
            name: name.into(),
            user,
            groups,
            token: random_token(),
        }
    }

    /// A cluster admin (group `system:masters`, which bypasses RBAC).
    pub fn admin(name: impl Into<String>) -> Self {
        let name = name.into();
        Self::new(name.clone(), name).with_groups(["system:masters"])
    }

    /// The identity of ServiceAccount `namespace/sa`.
    pub fn service_account(name: impl Into<String>, namespace: &str, sa: &str) -> Self {
        Self::new(name, format!("system:serviceaccount:{namespace}:{sa}"))
    }

    /// Adds groups, skipping ones it already has.
    pub fn with_groups<I, S>(mut self, groups: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        for g in groups {
            let g = g.into();
            if !self.groups.contains(&g) {
                self.groups.push(g);
            }
        }
        self
    }

    /// Replaces the random token with a fixed one.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = token.into();
        self
    }

    /// Whether it is in `system:masters`, so RBAC never applies to it.
    pub fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }

    /// Groups as RBAC evaluates them, including `system:authenticated`.
    pub fn effective_groups(&self) -> Vec<String> {
        let mut g = self.groups.clone();
        if !g.iter().any(|x| x == "system:authenticated") {
            g.push("system:authenticated".to_string());
        }
        g
    }
}

fn random_token() -> String {
    let mut rng = rand::rng();
    (0..32)
        .map(|_| char::from_digit(rng.random_range(0..16u32), 16).unwrap_or('0'))
        .collect()
}

/// Token lookup, shared by the server and its handle.
#[derive(Debug, Default)]
pub struct Authenticator {
    by_token: RwLock<HashMap<String, Arc<Identity>>>,
    order: RwLock<Vec<String>>,
}

impl Authenticator {
    pub fn add(&self, identity: Identity) {
        let mut by_token = self.by_token.write();
        let mut order = self.order.write();
        by_token.retain(|_, i| i.name != identity.name);
        order.retain(|n| *n != identity.name);
        order.push(identity.name.clone());
        by_token.insert(identity.token.clone(), Arc::new(identity));
    }

    pub fn authenticate(&self, token: &str) -> Option<Arc<Identity>> {
        self.by_token.read().get(token).cloned()
    }

    /// All identities in the order they were added.
    pub fn identities(&self) -> Vec<Identity> {
        let by_token = self.by_token.read();
        let order = self.order.read();
        order
            .iter()
            .filter_map(|n| by_token.values().find(|i| i.name == *n))
            .map(|i| Identity::clone(i))
            .collect()
    }

    /// The identity a verified client certificate stands for: its user and groups are the
    /// certificate's, as RBAC must see them; its name (for fault scoping and the write log) is
    /// that of the first identity with that user and those groups, else the user.
    pub fn for_certificate(&self, user: &str, groups: &[String]) -> Arc<Identity> {
        let mut wanted = groups.to_vec();
        wanted.sort();
        let name = self
            .identities()
            .into_iter()
            .find(|i| {
                let mut have = i.groups.clone();
                have.sort();
                i.user == user && have == wanted
            })
            .map_or_else(|| user.to_string(), |i| i.name);
        Arc::new(Identity {
            name,
            user: user.to_string(),
            groups: groups.to_vec(),
            // Not a token client: nothing can authenticate with this.
            token: String::new(),
        })
    }

    pub fn by_name(&self, name: &str) -> Option<Identity> {
        self.by_token
            .read()
            .values()
            .find(|i| i.name == name)
            .map(|i| Identity::clone(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_accounts_get_their_groups() {
        let i = Identity::service_account("r0", "shardwise", "shardwise");
        assert_eq!(i.user, "system:serviceaccount:shardwise:shardwise");
        assert_eq!(
            i.groups,
            vec!["system:serviceaccounts", "system:serviceaccounts:shardwise"]
        );
        assert!(
            i.effective_groups()
                .contains(&"system:authenticated".to_string())
        );
        assert!(!i.is_admin());
        assert!(Identity::admin("admin").is_admin());
    }

    #[test]
    fn tokens_resolve_and_names_replace() {
        let a = Authenticator::default();
        let first = Identity::new("x", "u").with_token("t1");
        a.add(first);
        a.add(Identity::new("x", "u2").with_token("t2"));
        assert!(a.authenticate("t1").is_none());
        assert_eq!(a.authenticate("t2").unwrap().user, "u2");
        assert_eq!(a.identities().len(), 1);
    }

    #[test]
    fn certificates_take_the_name_of_the_identity_they_match() {
        let a = Authenticator::default();
        a.add(Identity::service_account("sa", "ns", "app"));
        let groups = vec![
            "system:serviceaccounts:ns".to_string(),
            "system:serviceaccounts".to_string(),
        ];
        let i = a.for_certificate("system:serviceaccount:ns:app", &groups);
        assert_eq!(i.name, "sa");
        assert_eq!(i.groups, groups);
        let other = a.for_certificate("system:serviceaccount:ns:app", &groups[..1]);
        assert_eq!(other.name, "system:serviceaccount:ns:app");
        assert!(a.authenticate(&other.token).is_none());
    }
}
