use std::time::SystemTime;

/// One request a server answered: a write (POST, PUT, PATCH or DELETE), or on kube-apiserver
/// also a LIST (its audit log records both).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRecord {
    /// When it arrived, on this machine's wall clock.
    pub at: SystemTime,
    /// The identity that sent it: its name on the test server; on kube-apiserver the link of
    /// the pod its token is bound to, else its token's UID, else its user.
    pub identity: String,
    /// The user the server authenticated it as.
    pub user: String,
    /// The `User-Agent` header, when the request had one.
    pub user_agent: Option<String>,
    /// The HTTP method, or `LIST`.
    pub method: String,
    /// The request path, without the query.
    pub path: String,
    /// The query, percent-encoded as sent (empty without one).
    pub query: String,
    /// The status code of the answer.
    pub code: u16,
}
