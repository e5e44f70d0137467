//! What the planner tells people: a Warning event (and the controller's status, if it has one)
//! on every object it cannot read, and an event on every unit whose pin it cannot honour, each
//! once per situation.

use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::ApiResource;
use kube_runtime::events::{Event, EventType, Recorder};
use shard_assign::ShardId;
use shardwise_handoff::plan::ObjectKey;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::lenient::Undecodable;
use crate::objects::merge_patch_status;
use crate::sharded::{ObjectKind, Sharded};

type Queue = (ObjectKind, Undecodable);

/// Reports of one planner term.
pub(super) struct Reporter<C> {
    client: Client,
    recorder: Recorder,
    queue: mpsc::UnboundedSender<Queue>,
    pending: Mutex<Option<mpsc::UnboundedReceiver<Queue>>>,
    controller: PhantomData<fn() -> C>,
}

fn resource<C: Sharded>(kind: ObjectKind) -> ApiResource {
    match kind {
        ObjectKind::Unit => ApiResource::erase::<C::Unit>(&()),
        ObjectKind::Item => ApiResource::erase::<C::Item>(&()),
    }
}

fn reference(
    resource: &ApiResource,
    key: &ObjectKey,
    uid: Option<String>,
    version: Option<String>,
) -> ObjectReference {
    ObjectReference {
        api_version: Some(resource.api_version.clone()),
        kind: Some(resource.kind.clone()),
        name: Some(key.name.clone()),
        namespace: (!key.namespace.is_empty()).then(|| key.namespace.clone()),
        uid,
        resource_version: version,
        ..Default::default()
    }
}

impl<C: Sharded> Reporter<C> {
    pub(super) fn new(client: Client, recorder: Recorder) -> Self {
        let (queue, pending) = mpsc::unbounded_channel();
        Self {
            client,
            recorder,
            queue,
            pending: Mutex::new(Some(pending)),
            controller: PhantomData,
        }
    }

    /// Queues the report of an object that cannot be read (watch loops must not wait on it).
    pub(super) fn unreadable(&self, kind: ObjectKind, bad: Undecodable) {
        let _ = self.queue.send((kind, bad));
    }

    /// Reports the unreadable objects queued, once per generation and reason (the status write
    /// itself must not cause another report). Runs for the planner's term.
    pub(super) async fn report_unreadable(&self) {
        let taken = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(mut queue) = taken else {
            return;
        };
        let mut reported = BTreeSet::new();
        while let Some((kind, bad)) = queue.recv().await {
            let uid = bad.metadata.uid.clone().unwrap_or_default();
            if reported.insert((kind, uid, bad.metadata.generation, bad.reason.clone())) {
                self.report_one(kind, &bad).await;
            }
        }
    }

    async fn report_one(&self, kind: ObjectKind, bad: &Undecodable) {
        let Some(name) = &bad.metadata.name else {
            return;
        };
        let key = ObjectKey::new(bad.metadata.namespace.clone().unwrap_or_default(), name);
        let resource = resource::<C>(kind);
        warn!(kind = %resource.kind, object = %key, reason = %bad.reason, "object cannot be read: left out of planning");
        if let Some(status) = C::unreadable_status(kind, &bad.reason) {
            let patch = serde_json::json!({ "status": status });
            let result = match kind {
                ObjectKind::Unit => merge_patch_status::<C::Unit>(&self.client, &key, &patch).await,
                ObjectKind::Item => merge_patch_status::<C::Item>(&self.client, &key, &patch).await,
            };
            if let Err(e) = result {
                warn!(object = %key, error = %e, "could not report an unreadable object");
            }
        }
        let event = Event {
            type_: EventType::Warning,
            reason: "InvalidSpec".into(),
            note: Some(format!("cannot be read: {}", bad.reason)),
            action: "Read".into(),
            secondary: None,
        };
        let reference = reference(
            &resource,
            &key,
            bad.metadata.uid.clone(),
            bad.metadata.resource_version.clone(),
        );
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            debug!(object = %key, error = %e, "could not publish event");
        }
    }

    /// An event on each unit whose pin cannot be honoured, once per situation. `uid_of` gives
    /// the UID of a unit the planner knows.
    pub(super) async fn pins(
        &self,
        pins: &[(ObjectKey, ShardId, ShardId)],
        reported: &mut BTreeSet<(ObjectKey, ShardId, ShardId)>,
        uid_of: impl Fn(&ObjectKey) -> Option<String>,
    ) {
        let current: BTreeSet<(ObjectKey, ShardId, ShardId)> = pins.iter().cloned().collect();
        let resource = resource::<C>(ObjectKind::Unit);
        for (key, pin, placed) in current.difference(reported) {
            let Some(uid) = uid_of(key) else {
                continue;
            };
            let event = Event {
                type_: EventType::Warning,
                reason: "PinnedShardNotLive".into(),
                note: Some(format!(
                    "pinned to shard {pin}, which is not live; placed on shard {placed} until it returns"
                )),
                action: "Place".into(),
                secondary: None,
            };
            let reference = reference(&resource, key, Some(uid), None);
            if let Err(e) = self.recorder.publish(&event, &reference).await {
                debug!(unit = %key, error = %e, "could not publish event");
            }
        }
        *reported = current;
    }
}
