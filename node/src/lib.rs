//! Skiff's node agent. Today it holds the host inspection the agent starts from (where
//! cgroup v2 is mounted and which controllers it offers) and the eBPF per-pod traffic
//! accounting loader; the pod runtime and pod networking arrive with the rest of M1-B.

pub mod bpf;
pub mod host;
