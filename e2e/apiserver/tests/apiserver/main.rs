//! End-to-end tests of the test API server with real clients: kube-rs and kubectl.

mod apply;
mod binary;
mod certificates;
mod common;
mod crud;
mod kubectl;
mod latency;
mod rbac;
mod watch;
