//! Identities and bearer-token authentication.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
pub(crate) use shardwise_e2e_testkit::Identity;

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
