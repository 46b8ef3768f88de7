//! `conclave-testkit`: the harness shared by Conclave's command line, its
//! benchmarks (`conclave-bench`) and its tests; not published.
//!
//! * [`netns`] (feature `netns`) — a Corosync cluster of Conclave daemons in
//!   network namespaces on one host, which can split, heal and take WAN
//!   delays: the cluster test and the cluster benchmarks run on it. The
//!   workspace's `unsafe` code for namespaces and packet sockets lives here.
//! * [`scripted`] — a secure session driven by commands, with its events
//!   reported on a channel: the member driver of `conclave demo` and of the
//!   daemon engine of `conclave bench events`.
//! * [`names`] — protocol, group and signature names given on the command
//!   line, with errors that list what is accepted.
#![warn(missing_docs)]

pub mod names;
#[cfg(feature = "netns")]
pub mod netns;
pub mod scripted;
