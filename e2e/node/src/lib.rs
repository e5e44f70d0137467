//! The node agent of shardwise's end-to-end control plane: the one stand-in left for a
//! kubelet and its container runtime, since no container can run on the machines the suites
//! run on. It registers a Node, and runs each container of the Pods bound to it as a local
//! process, in a network namespace of the pod's own (with an address from Debian's CNI
//! plugins) and a mount namespace of its own (the pod's volumes at their paths, so that
//! kube-rs's in-cluster configuration is what the process uses).
//!
//! The pure part, tested without a control plane: [`plan()`] turns a pod spec into a
//! [`Launch`] per container (program, argv, environment, mounts, user), with the images of an
//! [`ImageTable`].

#![deny(missing_docs)]

pub mod agent;
pub mod container;
pub mod expand;
pub mod image;
pub mod launch;
pub mod plan;
mod pod;
pub mod probe;
pub mod quantity;
mod request;
pub mod sandbox;
pub mod status;
pub mod volumes;

pub use agent::{AgentConfig, AgentError, NodeAgent};
pub use container::{Exit, Launcher, Running};
pub use image::{Image, ImageTable, Programs};
pub use launch::{Launch, Mount, User};
pub use plan::{NodeFacts, PlanError, PodContext, plan};
pub use pod::ServiceEndpoint;
pub use sandbox::{Bridge, NetworkError, Sandbox};
