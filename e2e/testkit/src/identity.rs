use rand::Rng;

use crate::tls::ClientCertificate;

/// A client identity: the name of its kubeconfig user and context (and of the faults scoped to
/// it), the user name and groups RBAC sees, and its bearer token.
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
        let mut rng = rand::rng();
        let token = (0..32)
            .map(|_| char::from_digit(rng.random_range(0..16u32), 16).unwrap_or('0'))
            .collect();
        Self {
            name: name.into(),
            user,
            groups,
            token,
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
        let mut groups = self.groups.clone();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".to_string());
        }
        groups
    }

    /// The ServiceAccount it is, as (namespace, name).
    pub fn service_account_name(&self) -> Option<(&str, &str)> {
        self.user
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
    }
}

/// How a kubeconfig user authenticates.
#[derive(Clone, Copy, Debug)]
pub enum Credential<'a> {
    /// A bearer token.
    Token(&'a str),
    /// A client certificate and its key.
    Certificate(&'a ClientCertificate),
}

/// A kubeconfig for the server at `url` (whose serving CA is `ca_pem`; `None` for plain HTTP):
/// `users` are (name, credential) pairs, each with a context of the same name; `current` is the
/// current context.
pub fn kubeconfig_yaml(
    cluster: &str,
    url: &str,
    ca_pem: Option<&str>,
    users: &[(&str, Credential<'_>)],
    current: &str,
) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    // JSON strings are YAML strings: every value is quoted so that no name or token can break
    // the document.
    let q = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let mut y = String::from("apiVersion: v1\nkind: Config\npreferences: {}\nclusters:\n");
    y.push_str(&format!(
        "- name: {}\n  cluster:\n    server: {}\n",
        q(cluster),
        q(url)
    ));
    if let Some(pem) = ca_pem {
        y.push_str(&format!(
            "    certificate-authority-data: {}\n",
            q(&b64(pem))
        ));
    }
    y.push_str("users:\n");
    for (name, credential) in users {
        y.push_str(&format!("- name: {}\n  user:\n", q(name)));
        match credential {
            Credential::Token(token) => y.push_str(&format!("    token: {}\n", q(token))),
            Credential::Certificate(cert) => y.push_str(&format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n",
                q(&b64(&cert.cert_pem)),
                q(&b64(&cert.key_pem))
            )),
        }
    }
    y.push_str("contexts:\n");
    for (name, _) in users {
        y.push_str(&format!(
            "- name: {}\n  context:\n    cluster: {}\n    user: {}\n    namespace: default\n",
            q(name),
            q(cluster),
            q(name)
        ));
    }
    y.push_str(&format!("current-context: {}\n", q(current)));
    y
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
        assert_eq!(i.service_account_name(), Some(("shardwise", "shardwise")));
        assert!(!i.is_admin());
        assert!(Identity::admin("admin").is_admin());
    }

    #[test]
    fn a_kubeconfig_quotes_every_value_and_names_a_context_per_user() {
        let yaml = kubeconfig_yaml(
            "c",
            "https://127.0.0.1:1",
            None,
            &[
                ("a", Credential::Token("t: x")),
                ("b", Credential::Token("u")),
            ],
            "b",
        );
        assert!(yaml.contains("token: \"t: x\""));
        assert!(!yaml.contains("certificate-authority-data"));
        assert_eq!(yaml.matches("context:\n").count(), 2);
        assert!(yaml.ends_with("current-context: \"b\"\n"));
    }
}
