//! Who may read `/metrics`: the bearer token of each request is authenticated by the API server
//! (TokenReview), and its user authorized to `get` the path (SubjectAccessReview), as
//! kube-rbac-proxy and kubebuilder's secure metrics do. Answers are cached (a token for a
//! minute, an allow for five, a deny for thirty seconds) so that a scraper costs the API server
//! two requests every few minutes, and the reviews go through a client of their own so that a
//! flood of made-up tokens cannot slow down lease renewals.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use thiserror::Error;
use tokio::time::Instant;
use tracing::{debug, warn};

/// An authenticated user, as a TokenReview reports it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct User {
    pub(crate) username: String,
    pub(crate) uid: String,
    pub(crate) groups: Vec<String>,
    pub(crate) extra: BTreeMap<String, Vec<String>>,
}

/// The API server could not be asked.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("cannot review the request with the API server: {0}")]
pub struct ReviewError(pub(crate) String);

/// Asks who a token belongs to and what its user may do.
pub trait Reviewer: Send + Sync + 'static {
    /// The token's user, or `None` if the API server does not accept the token.
    fn authenticate(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<Option<User>, ReviewError>> + Send;

    /// Whether `user` may `verb` the non-resource `path`.
    fn authorize(
        &self,
        user: &User,
        verb: &str,
        path: &str,
    ) -> impl Future<Output = Result<bool, ReviewError>> + Send;
}

/// The reviews as the API server answers them.
#[derive(Clone)]
pub struct KubeReviewer {
    client: Client,
}

impl std::fmt::Debug for KubeReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeReviewer").finish_non_exhaustive()
    }
}

impl KubeReviewer {
    /// `client` should be one of its own, with a small rate limit of its own.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

impl Reviewer for KubeReviewer {
    async fn authenticate(&self, token: &str) -> Result<Option<User>, ReviewError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ReviewError(e.to_string()))?;
        let Some(status) = answer.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(None);
        };
        let user = status.user.unwrap_or_default();
        Ok(Some(User {
            username: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        }))
    }

    async fn authorize(&self, user: &User, verb: &str, path: &str) -> Result<bool, ReviewError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()).filter(|e| !e.is_empty()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some(verb.to_string()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ReviewError(e.to_string()))?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

/// What a request to a guarded path gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Served to this user.
    Allowed(String),
    /// 401: no bearer token, or one the API server does not accept.
    Unauthenticated(&'static str),
    /// 403: the user may not read the path.
    Forbidden(String),
    /// 503: the API server could not be asked, and no earlier grant stands in; nothing is
    /// cached.
    Unavailable(ReviewError),
}

/// How long answers are kept (the defaults of kubebuilder's secure metrics filter), and how
/// long past that an accepted token and an allow still stand in while the API server cannot
/// be asked: a replica cut off from the control plane is the one whose metrics matter most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheTimes {
    pub token: Duration,
    pub allowed: Duration,
    pub denied: Duration,
    pub stale_grants: Duration,
}

impl Default for CacheTimes {
    fn default() -> Self {
        Self {
            token: Duration::from_secs(60),
            allowed: Duration::from_secs(300),
            denied: Duration::from_secs(30),
            stale_grants: Duration::from_secs(600),
        }
    }
}

/// Entries each cache keeps at most: made-up tokens cannot grow memory without bound.
const CACHE_CAPACITY: usize = 4096;

/// A map whose entries expire, and are kept `stale` longer for [`Expiring::get_stale`].
#[derive(Debug)]
struct Expiring<K, V> {
    entries: HashMap<K, (Instant, V)>,
    stale: Duration,
}

impl<K: Eq + Hash, V: Clone> Expiring<K, V> {
    fn new(stale: Duration) -> Self {
        Self {
            entries: HashMap::new(),
            stale,
        }
    }

    fn get<Q>(&self, key: &Q, now: Instant) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        match self.entries.get(key) {
            Some((until, value)) if now < *until => Some(value.clone()),
            _ => None,
        }
    }

    /// The value even if it expired, up to `stale` ago.
    fn get_stale<Q>(&self, key: &Q, now: Instant) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        match self.entries.get(key) {
            Some((until, value)) if now < *until + self.stale => Some(value.clone()),
            _ => None,
        }
    }

    fn put(&mut self, key: K, value: V, until: Instant, now: Instant) {
        if self.entries.len() >= CACHE_CAPACITY {
            let stale = self.stale;
            self.entries.retain(|_, (u, _)| now < *u + stale);
            if self.entries.len() >= CACHE_CAPACITY {
                // Full of live entries: start over rather than pick victims; the next requests
                // are simply reviewed again.
                self.entries.clear();
            }
        }
        self.entries.insert(key, (until, value));
    }
}

type Decision = (User, String, String);

/// Authentication and authorization of requests to the guarded paths, with caches.
#[derive(Debug)]
pub struct Gate<R> {
    reviewer: R,
    times: CacheTimes,
    tokens: Mutex<Expiring<String, Option<User>>>,
    decisions: Mutex<Expiring<Decision, bool>>,
}

impl<R: Reviewer> Gate<R> {
    pub(crate) fn new(reviewer: R, times: CacheTimes) -> Self {
        Self {
            reviewer,
            times,
            tokens: Mutex::new(Expiring::new(times.stale_grants)),
            decisions: Mutex::new(Expiring::new(times.stale_grants)),
        }
    }

    /// The verdict on a request with this `Authorization` header for `verb` on `path`.
    pub(crate) async fn check(
        &self,
        authorization: Option<&HeaderValue>,
        verb: &str,
        path: &str,
    ) -> Verdict {
        let Some(token) = bearer_token(authorization) else {
            return Verdict::Unauthenticated("a bearer token is required");
        };
        let times = self.times;
        let user = match reviewed(
            &self.tokens,
            token,
            |_| times.token,
            Option::is_some,
            self.reviewer.authenticate(token),
        )
        .await
        {
            Ok(Some(user)) => user,
            Ok(None) => {
                return Verdict::Unauthenticated("the API server does not accept this token");
            }
            Err(e) => return Verdict::Unavailable(e),
        };
        let key = (user, verb.to_string(), path.to_string());
        let allowed = match reviewed(
            &self.decisions,
            &key,
            |&allowed| if allowed { times.allowed } else { times.denied },
            |&allowed| allowed,
            self.reviewer.authorize(&key.0, verb, path),
        )
        .await
        {
            Ok(allowed) => allowed,
            Err(e) => return Verdict::Unavailable(e),
        };
        let name = key.0.username;
        if allowed {
            Verdict::Allowed(name)
        } else {
            Verdict::Forbidden(format!(
                "forbidden: User {name:?} cannot {verb} path {path:?}"
            ))
        }
    }
}

/// The answer cached for `key` while it is fresh; else `review`'s, cached for `ttl` of it. When
/// the review fails, an expired answer that `grants` still stands in within the grace.
async fn reviewed<K, Q, V>(
    cache: &Mutex<Expiring<K, V>>,
    key: &Q,
    ttl: impl Fn(&V) -> Duration,
    grants: impl Fn(&V) -> bool,
    review: impl Future<Output = Result<V, ReviewError>>,
) -> Result<V, ReviewError>
where
    K: Eq + Hash + std::borrow::Borrow<Q>,
    Q: Eq + Hash + ToOwned<Owned = K> + ?Sized,
    V: Clone,
{
    let fresh = lock(cache).get(key, Instant::now());
    if let Some(answer) = fresh {
        return Ok(answer);
    }
    match review.await {
        Ok(answer) => {
            let now = Instant::now();
            lock(cache).put(key.to_owned(), answer.clone(), now + ttl(&answer), now);
            Ok(answer)
        }
        Err(e) => {
            let stale = lock(cache).get_stale(key, Instant::now());
            match stale {
                Some(answer) if grants(&answer) => {
                    warn!(error = %e, "API server unreachable: a metrics grant given earlier stands in");
                    Ok(answer)
                }
                _ => Err(e),
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The token of `Authorization: Bearer <token>` (the scheme is case-insensitive).
fn bearer_token(header: Option<&HeaderValue>) -> Option<&str> {
    let value = header?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Axum middleware: serves the request only when the [`Gate`] allows it.
pub(crate) async fn require_access<R: Reviewer>(
    State(gate): State<Arc<Gate<R>>>,
    request: Request,
    next: Next,
) -> Response {
    let verb = match *request.method() {
        axum::http::Method::GET | axum::http::Method::HEAD => "get",
        _ => return StatusCode::METHOD_NOT_ALLOWED.into_response(),
    };
    let path = request.uri().path().to_string();
    match gate
        .check(request.headers().get(header::AUTHORIZATION), verb, &path)
        .await
    {
        Verdict::Allowed(user) => {
            debug!(%user, %path, "metrics request allowed");
            next.run(request).await
        }
        Verdict::Unauthenticated(why) => (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                "Bearer realm=\"shardwise-controller\"",
            )],
            format!("Unauthorized: {why}\n"),
        )
            .into_response(),
        Verdict::Forbidden(why) => (StatusCode::FORBIDDEN, format!("{why}\n")).into_response(),
        Verdict::Unavailable(e) => {
            warn!(error = %e, "cannot authorize a metrics request");
            (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Knows token "good" (user "prometheus", allowed) and "other" (user "intruder", denied).
    #[derive(Debug, Default)]
    struct Fake {
        authentications: AtomicUsize,
        authorizations: AtomicUsize,
        down: std::sync::atomic::AtomicBool,
    }

    fn user(name: &str) -> User {
        User {
            username: name.to_string(),
            uid: format!("uid-{name}"),
            groups: vec!["system:authenticated".to_string()],
            extra: BTreeMap::new(),
        }
    }

    impl Reviewer for Arc<Fake> {
        async fn authenticate(&self, token: &str) -> Result<Option<User>, ReviewError> {
            self.authentications.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err(ReviewError("connection refused".into()));
            }
            Ok(match token {
                "good" => Some(user("prometheus")),
                "other" => Some(user("intruder")),
                _ => None,
            })
        }

        async fn authorize(
            &self,
            user: &User,
            verb: &str,
            path: &str,
        ) -> Result<bool, ReviewError> {
            self.authorizations.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err(ReviewError("connection refused".into()));
            }
            Ok(user.username == "prometheus" && verb == "get" && path == "/metrics")
        }
    }

    fn bearer(token: &str) -> HeaderValue {
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn only_an_accepted_and_authorized_token_is_served() {
        let fake = Arc::new(Fake::default());
        let gate = Gate::new(fake.clone(), CacheTimes::default());
        assert_eq!(
            gate.check(Some(&bearer("good")), "get", "/metrics").await,
            Verdict::Allowed("prometheus".into())
        );
        assert_eq!(
            gate.check(Some(&bearer("other")), "get", "/metrics").await,
            Verdict::Forbidden("forbidden: User \"intruder\" cannot get path \"/metrics\"".into())
        );
        assert!(matches!(
            gate.check(Some(&bearer("made-up")), "get", "/metrics")
                .await,
            Verdict::Unauthenticated(_)
        ));
        assert!(matches!(
            gate.check(None, "get", "/metrics").await,
            Verdict::Unauthenticated(_)
        ));
        for header in ["Basic Z29vZA==", "Bearer", "Bearer   ", "good"] {
            assert!(
                matches!(
                    gate.check(Some(&HeaderValue::from_static(header)), "get", "/metrics")
                        .await,
                    Verdict::Unauthenticated(_)
                ),
                "{header}"
            );
        }
        assert_eq!(
            gate.check(
                Some(&HeaderValue::from_static("bearer good")),
                "get",
                "/metrics"
            )
            .await,
            Verdict::Allowed("prometheus".into())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_cached_for_their_time_and_grants_stand_in_while_the_api_server_is_away() {
        let fake = Arc::new(Fake::default());
        let gate = Gate::new(fake.clone(), CacheTimes::default());
        let count = |f: &Fake| {
            (
                f.authentications.load(Ordering::SeqCst),
                f.authorizations.load(Ordering::SeqCst),
            )
        };
        for _ in 0..5 {
            gate.check(Some(&bearer("good")), "get", "/metrics").await;
            gate.check(Some(&bearer("other")), "get", "/metrics").await;
        }
        assert_eq!(count(&fake), (2, 2), "repeated requests reviewed again");
        // After 31 s the deny has expired, the allow and the tokens not.
        tokio::time::advance(Duration::from_secs(31)).await;
        gate.check(Some(&bearer("good")), "get", "/metrics").await;
        gate.check(Some(&bearer("other")), "get", "/metrics").await;
        assert_eq!(count(&fake), (2, 3));
        // After 61 s the tokens are reviewed again; the allow still stands.
        tokio::time::advance(Duration::from_secs(30)).await;
        gate.check(Some(&bearer("good")), "get", "/metrics").await;
        assert_eq!(count(&fake), (3, 3));
        // The API server down, 122 s in. The token and the allow of "good" have expired, but
        // grants stand in for ten minutes; a deny never does, nor does an unknown token.
        tokio::time::advance(Duration::from_secs(61)).await;
        fake.down.store(true, Ordering::SeqCst);
        assert_eq!(
            gate.check(Some(&bearer("good")), "get", "/metrics").await,
            Verdict::Allowed("prometheus".into())
        );
        assert!(matches!(
            gate.check(Some(&bearer("other")), "get", "/metrics").await,
            Verdict::Unavailable(_)
        ));
        assert!(matches!(
            gate.check(Some(&bearer("made-up")), "get", "/metrics")
                .await,
            Verdict::Unavailable(_)
        ));
        // Failures are not cached: once the API server answers again, it is asked.
        fake.down.store(false, Ordering::SeqCst);
        let before = count(&fake);
        assert!(matches!(
            gate.check(Some(&bearer("made-up")), "get", "/metrics")
                .await,
            Verdict::Unauthenticated(_)
        ));
        assert_eq!(count(&fake).0, before.0 + 1);
        // Past the grace, nothing stands in.
        tokio::time::advance(Duration::from_secs(700)).await;
        fake.down.store(true, Ordering::SeqCst);
        assert!(matches!(
            gate.check(Some(&bearer("good")), "get", "/metrics").await,
            Verdict::Unavailable(_)
        ));
    }

    #[test]
    fn a_full_cache_keeps_its_bound() {
        let now = Instant::now();
        let mut cache = Expiring::new(Duration::from_secs(600));
        for n in 0..CACHE_CAPACITY * 2 + 1 {
            cache.put(n, (), now + Duration::from_secs(60), now);
            assert!(cache.entries.len() <= CACHE_CAPACITY);
        }
        assert_eq!(cache.get(&(CACHE_CAPACITY * 2), now), Some(()));
    }
}
