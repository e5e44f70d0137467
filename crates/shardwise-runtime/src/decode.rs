//! Watches that survive objects they cannot read.
//!
//! A watch of `Lenient<K>` lists and watches like one of `K`, but an object that does not decode
//! as `K` no longer fails the whole list (see [`crate::lenient`]). [`decode_each`] turns
//! its events back into events of `K`: an object that cannot be read is treated as absent (if
//! the cache had an older, readable version, it leaves the cache as if deleted, so that no work
//! continues on a stale copy) and handed to `report`.

use crate::lenient::{Lenient, Undecodable};
use std::ops::ControlFlow;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube_runtime::reflector::{ObjectRef, Store};
use kube_runtime::watcher;
use tracing::warn;

/// Events of `K` from events of `Lenient<K>`; `cache` is the store these events feed (it tells
/// what an unreadable object replaces).
pub fn decode_each<K, S>(
    events: S,
    cache: Store<K>,
    mut report: impl FnMut(&Undecodable) + Send + 'static,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<Lenient<K>>, watcher::Error>> + Send,
{
    events.filter_map(move |event| {
        let decoded = match event {
            Err(e) => Some(Err(e)),
            Ok(event) => decode_event(event, &cache, &mut report).map(Ok),
        };
        futures::future::ready(decoded)
    })
}

fn decode_event<K>(
    event: watcher::Event<Lenient<K>>,
    cache: &Store<K>,
    report: &mut impl FnMut(&Undecodable),
) -> Option<watcher::Event<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    // What the cache holds under the name of an object that cannot be read.
    let cached = |bad: &Undecodable| {
        let name = bad.metadata.name.clone()?;
        let mut reference = ObjectRef::<K>::new(&name);
        if let Some(namespace) = &bad.metadata.namespace {
            reference = reference.within(namespace);
        }
        cache.get(&reference).map(|k| (*k).clone())
    };
    match event {
        watcher::Event::Init => Some(watcher::Event::Init),
        watcher::Event::InitDone => Some(watcher::Event::InitDone),
        watcher::Event::InitApply(object) => match object.decoded() {
            Ok(k) => Some(watcher::Event::InitApply(k)),
            Err(bad) => {
                // Left out of the new list, it is gone from the cache when the list ends.
                report(&bad);
                None
            }
        },
        watcher::Event::Apply(object) => match object.decoded() {
            Ok(k) => Some(watcher::Event::Apply(k)),
            Err(bad) => {
                report(&bad);
                cached(&bad).map(watcher::Event::Delete)
            }
        },
        watcher::Event::Delete(object) => match object.decoded() {
            Ok(k) => Some(watcher::Event::Delete(k)),
            Err(bad) => cached(&bad).map(watcher::Event::Delete),
        },
    }
}

/// Drains a watch stream into `handle`, logging its errors (`what` names the watch); a watch
/// stream with backoff retries after each.
pub async fn for_each_event<K, S, F>(stream: S, what: &'static str, mut handle: F)
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    F: FnMut(watcher::Event<K>),
{
    for_each_event_until(stream, what, |event| {
        handle(event);
        ControlFlow::Continue(())
    })
    .await;
}

/// [`for_each_event`] until `handle` breaks: the stream is dropped then, before it sends
/// another request.
pub async fn for_each_event_until<K, S, F>(stream: S, what: &'static str, mut handle: F)
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    F: FnMut(watcher::Event<K>) -> ControlFlow<()>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                if handle(event).is_break() {
                    return;
                }
            }
            Err(e) => warn!(what, error = %e, "watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use k8s_openapi::api::apps::v1::Deployment;
    use kube_runtime::reflector;
    use serde_json::json;

    use super::*;

    /// A Deployment that cannot be read when `replicas` is not a number.
    fn lenient(name: &str, replicas: serde_json::Value) -> Lenient<Deployment> {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "fleet"},
            "spec": {"replicas": replicas, "selector": {}, "template": {}},
        }))
        .unwrap()
    }

    fn names(store: &Store<Deployment>) -> Vec<String> {
        let mut names: Vec<String> = store
            .state()
            .iter()
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn unreadable_objects_are_reported_and_leave_the_cache() {
        let (reader, writer) = reflector::store();
        let reported = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(lenient("a", json!(1)))),
            Ok(watcher::Event::InitApply(lenient("bad", json!("many")))),
            Ok(watcher::Event::InitApply(lenient("b", json!(2)))),
            Ok(watcher::Event::InitDone),
        ]);
        let sink = reported.clone();
        let stream = decode_each(events, reader.clone(), move |bad| {
            sink.lock()
                .unwrap()
                .push(bad.metadata.name.clone().unwrap());
        });
        let stream = reflector::reflector(writer, stream);
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
        assert_eq!(names(&reader), ["a", "b"]);
        assert_eq!(*reported.lock().unwrap(), ["bad"]);
    }

    #[tokio::test]
    async fn an_object_that_turns_unreadable_is_dropped_not_kept_stale() {
        let (reader, writer) = reflector::store();
        let (sender, receiver) = futures::channel::mpsc::unbounded();
        let stream = decode_each(receiver, reader.clone(), |_| {});
        let mut stream = std::pin::pin!(reflector::reflector(writer, stream));
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(lenient("a", json!(1))),
            watcher::Event::InitDone,
        ] {
            sender.unbounded_send(Ok(event)).unwrap();
            stream.next().await;
        }
        assert_eq!(names(&reader), ["a"]);
        sender
            .unbounded_send(Ok(watcher::Event::Apply(lenient("a", json!("none")))))
            .unwrap();
        let event = stream.next().await.unwrap().unwrap();
        assert!(matches!(event, watcher::Event::Delete(_)), "{event:?}");
        assert!(names(&reader).is_empty());
        // Readable again: back in the cache.
        sender
            .unbounded_send(Ok(watcher::Event::Apply(lenient("a", json!(2)))))
            .unwrap();
        stream.next().await;
        assert_eq!(names(&reader), ["a"]);
    }
}
