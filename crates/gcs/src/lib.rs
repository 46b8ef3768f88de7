//! Group communication for Conclave: membership views and the backbones that
//! order traffic for them.
//!
//! This crate is the bottom layer of DESIGN.md. Today it holds the view types
//! that every layer above speaks ([`view`]) and the first stage of the
//! deterministic `sim` backbone ([`sim`]), an in-memory group communication
//! layer driven by one seed, which the key agreement tests and benchmarks run
//! on. The daemon core, wire protocol and the standalone and cluster
//! backbones grow here too, sans-IO, with async shells in crates above.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod sim;
pub mod view;

pub use view::{Cause, MemberId, View, ViewId, ViewMember};
