//! Group communication for Conclave: membership views and the backbones that
//! order traffic for them.
//!
//! This crate is the bottom layer of DESIGN.md, and it does no I/O. It holds
//! the view types that every layer above speaks ([`view`]); the daemon core
//! ([`core`]), a deterministic state machine that turns one totally ordered
//! stream of client and daemon-group operations into per-client deliveries
//! with lightweight groups and virtual synchrony; the client–daemon wire
//! format ([`wire`]); the daemon–daemon encoding of the core's operations for
//! cluster backbones ([`backbone`]); and the deterministic `sim` backbone in
//! two stages: [`sim`], an in-memory group communication layer driven by one
//! seed, which the key agreement tests and benchmarks run on, and
//! [`daemon_sim`], which runs real daemon cores on a simulated network
//! (virtual time, a virtual CPU per machine, latency, jitter, loss, partitions
//! and merges) from one seed. The async shells — the
//! standalone daemon and the client library — live in `conclave-gcs-net`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backbone;
pub mod core;
pub mod daemon_sim;
pub mod sim;
pub mod view;
pub mod wire;

pub use view::{
    kept_places, Cause, GroupName, MemberId, MemberMap, MemberSet, Members, NameCache, NameHasher, View, ViewId,
    ViewMember,
};
