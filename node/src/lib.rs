//! Skiff's node agent: the agent loop (`agent`), the pod runtime (`runtime`), pod networking
//! (`net`), the eBPF loader (`bpf`) and host inspection (`host`). See ARCHITECTURE.md.

pub mod agent;
pub mod bpf;
pub mod host;
pub mod net;
pub mod purge;
pub mod runtime;
