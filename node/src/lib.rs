//! Skiff's node agent. Today it holds the host inspection the agent will start from (where
//! cgroup v2 is mounted and which controllers it offers); the pod runtime, pod networking
//! and the eBPF programs arrive with milestone M1-B.

pub mod host;
