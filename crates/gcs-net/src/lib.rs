//! Async shells around Conclave's group communication core.
//!
//! `conclave-gcs` holds the daemon core and the wire format as deterministic
//! code without I/O; this crate puts them on sockets with tokio:
//!
//! * [`daemon`] — the standalone daemon: clients connect over a Unix socket or
//!   TCP, their requests form one ordered stream into the core, and each
//!   client's deliveries go out through a bounded queue of its own, so a slow
//!   or misbehaving client never holds up the others.
//! * [`client`] — the client library applications use: connect, join, leave,
//!   multicast, unicast and receive views and messages.
//! * [`tls`] — TLS for remote clients, with optional client certificates
//!   issued by a group authority that bind a connection to a member name.
//!
//! * `cluster` (feature `cluster`) — the Corosync CPG backbone: daemons on
//!   many machines order their clients' operations through one CPG group.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod access;
pub mod client;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod daemon;
pub mod tls;

pub use access::{AccessPolicy, GroupRule, Who};
pub use client::{Client, ClientError, ClientReceiver, ClientSender, Event};
pub use conclave_gcs::core::{ErrorCode, Service};
pub use daemon::{Backbone, Daemon, DaemonConfig, DaemonError, Traffic, UncertifiedNames};
pub use tls::{ClientAuth, Identity, TlsClientOptions, TlsError, TlsListen};
