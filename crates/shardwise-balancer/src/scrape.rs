//! Reads the application controllers' own metrics, for the measured load and for handovers:
//! one GET of each pod's `/metrics`, all at once, each bounded in time. What the pages say is
//! [`crate::measured`]'s to read.

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use shardwise_plan::installation::ControllerPod;

use crate::measured::{self, Scrape};

/// The longest one scrape may take: a controller that does not answer in time is left out of
/// this pass (its clusters keep their last measurement).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest metrics page read (a controller of 10,000 apps writes about 5 MB).
const MAX_PAGE: usize = 64 << 20;

/// What one pass read.
#[derive(Debug, Default)]
pub struct Scraped {
    /// By pod UID, what each answering pod reported.
    pub scrapes: BTreeMap<String, Scrape>,
    /// Pods that did not answer, each with why.
    pub failed: Vec<String>,
}

/// One HTTP client for every scrape of the balancer's life, so that its connections to the
/// controllers are kept from pass to pass.
#[derive(Clone)]
pub struct Scraper {
    client: Client<HttpConnector, Empty<Bytes>>,
    port: u16,
}

impl Scraper {
    /// Scrapes the controllers' metrics on `port`.
    pub fn new(port: u16) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            port,
        }
    }

    /// Scrapes `http://<pod ip>:<port>/metrics` of every pod of `pods` that has an address
    /// and is not being deleted.
    pub async fn controllers(&self, pods: &[ControllerPod]) -> Scraped {
        let live: Vec<&ControllerPod> = pods.iter().filter(|p| !p.terminating).collect();
        self.pods(&live).await
    }

    /// Scrapes every pod of `pods` that has an address, those being deleted too (their
    /// process runs until it exits).
    pub async fn pods(&self, pods: &[&ControllerPod]) -> Scraped {
        let port = self.port;
        let requests = pods
            .iter()
            .filter_map(|p| Some((*p, p.ip.as_deref()?)))
            .map(|(pod, ip)| {
                let client = self.client.clone();
                let url = if ip.contains(':') {
                    format!("http://[{ip}]:{port}/metrics")
                } else {
                    format!("http://{ip}:{port}/metrics")
                };
                async move {
                    let page = tokio::time::timeout(SCRAPE_TIMEOUT, get(&client, &url))
                        .await
                        .unwrap_or_else(|_| Err(format!("no answer within {SCRAPE_TIMEOUT:?}")));
                    (pod, url, page)
                }
            });
        let mut scraped = Scraped::default();
        for (pod, url, page) in futures::future::join_all(requests).await {
            match page {
                Ok(text) => {
                    scraped
                        .scrapes
                        .insert(pod.uid.clone(), measured::parse(&text));
                }
                Err(why) => scraped.failed.push(format!("{} ({url}): {why}", pod.name)),
            }
        }
        scraped
    }
}

async fn get(client: &Client<HttpConnector, Empty<Bytes>>, url: &str) -> Result<String, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let response = client.get(uri).await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("HTTP {}", response.status()));
    }
    let body = http_body_util::Limited::new(response.into_body(), MAX_PAGE)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    String::from_utf8(body.to_vec()).map_err(|_| "the page is not UTF-8".to_string())
}
