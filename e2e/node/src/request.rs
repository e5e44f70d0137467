//! The agent's requests to the API server, each bounded in time.

use std::time::Duration;

/// How long a one-off request may go unanswered before the agent gives up on it (and retries
/// it where it retries). kube's client sets no read timeout: a request that a restarting
/// kube-apiserver took and never answered held a deleted pod's final delete for good (the
/// chaos suite's kube-apiserver restart, 2026-12-06), so the pod was never gone.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `request`, failed with a service error if it has no answer within [`REQUEST_TIMEOUT`].
pub(crate) async fn bounded<T>(
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .unwrap_or_else(|elapsed| Err(kube::Error::Service(Box::new(elapsed))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_request_without_an_answer_fails_after_the_bound_and_an_answer_passes() {
        let started = tokio::time::Instant::now();
        let never = bounded(std::future::pending::<Result<(), kube::Error>>()).await;
        assert!(matches!(never, Err(kube::Error::Service(_))), "{never:?}");
        assert_eq!(started.elapsed(), REQUEST_TIMEOUT);
        assert_eq!(
            bounded(async { Ok::<_, kube::Error>(7) }).await.ok(),
            Some(7)
        );
    }
}
