//! Waiting for conditions, with failure messages that say what was expected and what was seen.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

/// A condition that did not hold in time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct WaitError {
    /// What the caller waited for.
    pub expected: String,
    /// How long it waited.
    pub timeout: Duration,
    /// The last observation the check reported.
    pub last_seen: String,
    /// How many times the condition was checked.
    pub attempts: u32,
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}; last seen: {} ({} checks)",
            self.timeout, self.expected, self.last_seen, self.attempts
        )
    }
}

/// How often and how long to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Poll {
    /// How long to keep checking before giving up.
    pub timeout: Duration,
    /// The pause between the end of one check and the start of the next.
    pub interval: Duration,
}

impl Poll {
    /// Checks every 50 ms for up to `timeout`.
    pub fn timeout(timeout: Duration) -> Self {
        Self {
            timeout,
            interval: Duration::from_millis(50),
        }
    }

    /// Checks every `interval` instead.
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }
}

/// Checks `check` until it returns `Ok` or `timeout` passes. The check returns `Err` with a
/// description of what it saw when the condition does not hold yet.
///
/// ```
/// # async fn demo() -> Result<(), shardwise_e2e::WaitError> {
/// use std::time::Duration;
/// let mut n = 0;
/// let value = shardwise_e2e::wait_for("n to reach 3", Duration::from_secs(1), || {
///     n += 1;
///     let seen = n;
///     async move { if seen >= 3 { Ok(seen) } else { Err(format!("n = {seen}")) } }
/// })
/// .await?;
/// assert_eq!(value, 3);
/// # Ok(()) }
/// ```
pub async fn wait_for<T, F, Fut>(
    expected: &str,
    timeout: Duration,
    check: F,
) -> Result<T, WaitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    wait_with(expected, Poll::timeout(timeout), check).await
}

/// [`wait_for`] with an explicit polling interval.
pub async fn wait_with<T, F, Fut>(expected: &str, poll: Poll, mut check: F) -> Result<T, WaitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + poll.timeout;
    let mut attempts = 0;
    // What the last check that finished said.
    let mut last_answer: Option<String> = None;
    loop {
        attempts += 1;
        // A check that hangs (e.g. on a paused server) must not outlive the deadline.
        let remaining = deadline.saturating_duration_since(Instant::now());
        let finished =
            match tokio::time::timeout(remaining.max(Duration::from_millis(1)), check()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(seen)) => {
                    last_answer = Some(seen);
                    true
                }
                Err(_) => false,
            };
        if Instant::now() >= deadline {
            // Usually the deadline cut the last check short: report what the check said
            // before, which is what the caller needs to understand the failure.
            let last_seen = match (last_answer, finished) {
                (Some(seen), true) => seen,
                (Some(seen), false) => {
                    format!("{seen} (the last check did not finish before the deadline)")
                }
                (None, _) => "the check itself did not finish before the deadline".to_string(),
            };
            return Err(WaitError {
                expected: expected.to_string(),
                timeout: poll.timeout,
                last_seen,
                attempts,
            });
        }
        tokio::time::sleep(
            poll.interval
                .min(deadline.saturating_duration_since(Instant::now())),
        )
        .await;
    }
}
