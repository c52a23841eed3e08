//! Skiff's benchmarks live here: each one runs the baseline and Skiff side by side in one run
//! and reports ratios (see ARCHITECTURE.md). No benchmark has landed yet; the first ones
//! (pod start latency, scheduler throughput, the packet-path suites) come with the node
//! agent, the scheduler and the eBPF data plane.
