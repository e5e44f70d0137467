//! Scraping a process's Prometheus `/metrics` and reading sample values.

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Why a scrape or a parse failed.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The URL does not parse.
    #[error("invalid metrics URL {url:?}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No answer: the connection failed, the body broke off, or 10 seconds passed.
    #[error("cannot scrape {url}: {reason}")]
    Scrape {
        /// The URL scraped.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// An answer other than 200 OK.
    #[error("{url} answered {status}: {body}")]
    Status {
        /// The URL scraped.
        url: String,
        /// The HTTP status code.
        status: u16,
        /// The start of the body (500 characters at most).
        body: String,
    },
    /// A line that is not a valid sample.
    #[error("line {line}: cannot parse {text:?}: {reason}")]
    Parse {
        /// Its number, from 1.
        line: usize,
        /// The line as read.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// One sample: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    name: String,
    /// The labels, by name; unescaped.
    pub labels: BTreeMap<String, String>,
    /// The value (`+Inf`, `-Inf` and `NaN` included).
    pub value: f64,
}

/// The samples of one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    samples: Vec<Sample>,
}

impl Metrics {
    /// Parses the Prometheus text exposition format (and OpenMetrics text).
    pub fn parse(text: &str) -> Result<Self, MetricsError> {
        let mut samples = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            samples.push(parse_line(line).map_err(|reason| MetricsError::Parse {
                line: i + 1,
                text: raw.to_string(),
                reason,
            })?);
        }
        Ok(Self { samples })
    }

    /// Every sample, in the order of the text.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// Samples named `name` whose labels include every pair in `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The value of the first matching sample.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).next().map(|s| s.value)
    }

    /// The sum over matching samples (0 when none match).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        // Folded from 0.0: `Iterator::sum` of floats starts from -0.0, which prints as "-0".
        self.matching(name, labels)
            .fold(0.0, |sum, s| sum + s.value)
    }
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        other => other
            .parse()
            .map_err(|e| format!("bad value {other:?}: {e}")),
    }
}

fn parse_line(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .ok_or("missing value")?;
    let name = line[..name_end].to_string();
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        let mut end = None;
        loop {
            while chars
                .peek()
                .is_some_and(|(_, c)| c.is_whitespace() || *c == ',')
            {
                chars.next();
            }
            match chars.peek() {
                Some((i, '}')) => {
                    end = Some(*i);
                    break;
                }
                None => break,
                Some(_) => {}
            }
            let mut key = String::new();
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label {key:?} has no quoted value"));
            }
            let mut value = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some(other) => value.push(other),
                        None => return Err("dangling escape".into()),
                    },
                    '"' => {
                        closed = true;
                        break;
                    }
                    other => value.push(other),
                }
            }
            if !closed {
                return Err(format!("unterminated value of label {key:?}"));
            }
            labels.insert(key.trim().to_string(), value);
        }
        let end = end.ok_or("unterminated label set")?;
        rest = &after[end + 1..];
    }
    let value = rest.split_whitespace().next().ok_or("missing value")?;
    Ok(Sample {
        name,
        labels,
        value: parse_value(value)?,
    })
}

/// Fetches and parses `url` (e.g. `http://127.0.0.1:9090/metrics`) over plain HTTP.
pub async fn scrape(url: &str) -> Result<Metrics, MetricsError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| MetricsError::Url {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let scrape_error = |reason: String| MetricsError::Scrape {
        url: url.to_string(),
        reason,
    };
    let response = tokio::time::timeout(Duration::from_secs(10), client.get(uri))
        .await
        .map_err(|_| scrape_error("no answer within 10s".into()))?
        .map_err(|e| scrape_error(e.to_string()))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| scrape_error(e.to_string()))?
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    if status != 200 {
        return Err(MetricsError::Status {
            url: url.to_string(),
            status,
            body: text.chars().take(500).collect(),
        });
    }
    Metrics::parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_exposition_format() {
        let text = r#"
# HELP shardwise_shards_owned Shards owned by this replica.
# TYPE shardwise_shards_owned gauge
shardwise_shards_owned{replica="shardwise-0",pool="a b"} 12
shardwise_reconciles_total{result="ok"} 7 1700000000000
shardwise_reconciles_total{result="error", note="say \"hi\"\n"} 2
process_start_time_seconds 1.7e9
histo_bucket{le="+Inf"} +Inf
# EOF
"#;
        let m = Metrics::parse(text).unwrap();
        assert_eq!(m.samples().len(), 5);
        assert_eq!(
            m.get("shardwise_shards_owned", &[("replica", "shardwise-0")]),
            Some(12.0)
        );
        assert_eq!(m.sum("shardwise_reconciles_total", &[]), 9.0);
        assert_eq!(
            m.matching("shardwise_reconciles_total", &[("result", "error")])
                .next()
                .unwrap()
                .labels["note"],
            "say \"hi\"\n"
        );
        assert_eq!(m.get("process_start_time_seconds", &[]), Some(1.7e9));
        assert!(
            m.get("histo_bucket", &[("le", "+Inf")])
                .unwrap()
                .is_infinite()
        );
        assert_eq!(m.get("absent", &[]), None);
        // A sum of nothing is a zero a report prints as "0", not "-0".
        assert_eq!(format!("{:.0}", m.sum("absent", &[])), "0");
    }

    #[test]
    fn reports_bad_lines() {
        let err = Metrics::parse("ok 1\nbroken{a=\"1\" 2\n").unwrap_err();
        assert!(matches!(err, MetricsError::Parse { line: 2, .. }), "{err}");
        assert!(Metrics::parse("x notanumber").is_err());
    }
}
