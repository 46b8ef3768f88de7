//! Contributory group key agreement for Conclave, as sans-IO state machines.
//!
//! This crate is the `gka` layer of DESIGN.md. It holds the five protocols
//! that the TISSEC paper measures — GDH, CKD, TGDH, STR and BD — each as an
//! [`Engine`]: fed membership views and signed protocol messages, it answers
//! with messages to broadcast or unicast and, when a run completes, a
//! [`SecureView`] carrying the new application key. There are no sockets,
//! threads, clocks or global randomness inside; the same engines run in unit
//! tests, in the seeded simulator, in client sessions and in daemons.
//!
//! * [`suite`]: the groups (ristretto255; MODP for reproducing the paper) and
//!   signature schemes (Ed25519; RSA for reproduction).
//! * [`engine`]: the engine interface and the shared plumbing (signed
//!   envelopes, replay and view checks, key installation, cascade handling).
//! * [`protocols`]: the five protocols.
//! * `tree`: the TGDH key tree, shared by the engines built on it (TGDH
//!   today; SEAL's interval-based rekeying and the daemon-level TGDH next).
//! * `interval`: SEAL's interval-based rekeying on that tree (Rebuild,
//!   Batch, Queue-batch) and its sponsor coordination, as pure functions.
//! * [`protocols::seal`]: the interval TGDH engine that drives them (leader,
//!   signed rekey message, sponsors' BKEY packets, restarts on cascades);
//!   not yet offered by [`new_engine`] or the secure layer.
//! * [`meter`]: the per-member cost meter that benchmarks and tests read.
//! * [`message`], [`codec`]: wire formats, whose decoders never panic.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod codec;
pub mod engine;
pub mod harness;
pub(crate) mod interval;
pub mod key;
pub mod keyed;
pub mod message;
pub mod meter;
pub mod protocols;
pub mod suite;
#[cfg(feature = "test-hooks")]
pub mod testing;
pub(crate) mod tree;

use std::sync::Arc;

pub use conclave_gcs::{Cause, MemberId, View, ViewId, ViewMember};
pub use engine::{Directory, Engine, Error, Misbehaved, Output, StaticDirectory};
pub use key::{Epoch, GroupKey, SecureView};
pub use meter::Costs;
pub use protocols::seal::IntervalAlgorithm;
pub use suite::{GroupId, SignatureId};

/// Hash domains for turning elements into exponents (see [`suite`]).
pub(crate) mod domains {
    pub const TGDH_NODE: &[u8] = b"tgdh/node-key";
    pub const STR_NODE: &[u8] = b"str/node-key";
    pub const CKD_CHANNEL: &[u8] = b"ckd/channel-key";
}

/// The key agreement protocols.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProtocolId {
    /// Group Diffie-Hellman (Steiner et al.).
    Gdh,
    /// Centralized key distribution with a dynamically chosen controller.
    Ckd,
    /// Tree-based group Diffie-Hellman.
    Tgdh,
    /// Steer et al.'s protocol: a maximally unbalanced key tree.
    Str,
    /// Burmester-Desmedt.
    Bd,
}

impl ProtocolId {
    /// Every protocol.
    pub const ALL: [ProtocolId; 5] = [Self::Gdh, Self::Ckd, Self::Tgdh, Self::Str, Self::Bd];

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Gdh => "gdh",
            Self::Ckd => "ckd",
            Self::Tgdh => "tgdh",
            Self::Str => "str",
            Self::Bd => "bd",
        }
    }

    /// Parses [`ProtocolId::name`] (case-insensitive).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(s))
    }

    /// Wire code.
    pub fn code(self) -> u8 {
        match self {
            Self::Gdh => 1,
            Self::Ckd => 2,
            Self::Tgdh => 3,
            Self::Str => 4,
            Self::Bd => 5,
        }
    }

    /// Parses [`ProtocolId::code`].
    pub fn from_code(c: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.code() == c)
    }
}

impl std::fmt::Display for ProtocolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name().to_uppercase())
    }
}

/// Everything needed to create an engine.
#[derive(Clone)]
pub struct Config {
    /// The protocol (fixed by the group's creator).
    pub protocol: ProtocolId,
    /// The group the protocol computes in.
    pub group_id: GroupId,
    /// The group's name (bound into every message and key).
    pub group: String,
    /// This member.
    pub me: MemberId,
    /// This member's identity key.
    pub signer: Arc<dyn suite::Signer>,
    /// Who may take part.
    pub directory: Arc<dyn Directory>,
}

/// Creates the engine a [`Config`] describes.
pub fn new_engine(c: Config) -> Box<dyn Engine> {
    use suite::memo::{self, Memo};
    match c.group_id {
        GroupId::Ristretto255 => engine_in(Memo::new(suite::ristretto::Ristretto255, memo::ENGINE_CAPACITY), c),
        id => engine_in(Memo::new(suite::modp::Modp::new(id), memo::ENGINE_CAPACITY), c),
    }
}

/// The engine of SEAL's interval rekeying ([`protocols::seal`]) with
/// `algorithm`, for a [`Config`] whose protocol is TGDH (the tree it keeps);
/// `None` for any other protocol. `rekey_on_leave`: the group rekeys at
/// once on a leave, so a rekey a view takes a member from is restarted, not
/// carried on (see [`protocols::seal::IntervalTgdh::rekey_on_leave`]).
pub fn new_interval_engine(
    c: Config,
    algorithm: protocols::seal::IntervalAlgorithm,
    rekey_on_leave: bool,
) -> Option<Box<dyn Engine>> {
    use suite::memo::{self, Memo};
    if c.protocol != ProtocolId::Tgdh {
        return None;
    }
    Some(match c.group_id {
        GroupId::Ristretto255 => {
            let g = Memo::new(suite::ristretto::Ristretto255, memo::ENGINE_CAPACITY);
            interval_engine_in(g, c, algorithm, rekey_on_leave)
        }
        id => {
            let g = Memo::new(suite::modp::Modp::new(id), memo::ENGINE_CAPACITY);
            interval_engine_in(g, c, algorithm, rekey_on_leave)
        }
    })
}

fn interval_engine_in<G: suite::Group>(
    g: G,
    c: Config,
    algorithm: protocols::seal::IntervalAlgorithm,
    rekey_on_leave: bool,
) -> Box<dyn Engine> {
    let Config { group, me, signer, directory, .. } = c;
    Box::new(protocols::seal::runner(g, group, me, signer, directory, algorithm, rekey_on_leave))
}

/// The engine a [`Config`] describes, computing in `g` (which must be the
/// group `c.group_id` names; the harness passes a wrapper of it).
pub(crate) fn engine_in<G: suite::Group>(g: G, c: Config) -> Box<dyn Engine> {
    use engine::Runner;
    use protocols::*;
    let Config { protocol, group, me, signer, directory, .. } = c;
    match protocol {
        ProtocolId::Gdh => Box::new(Runner::<G, gdh::Gdh<G>>::new(g, group, me, signer, directory)),
        ProtocolId::Ckd => Box::new(Runner::<G, ckd::Ckd<G>>::new(g, group, me, signer, directory)),
        ProtocolId::Tgdh => Box::new(Runner::<G, tgdh::Tgdh<G>>::new(g, group, me, signer, directory)),
        ProtocolId::Str => Box::new(Runner::<G, str::Str<G>>::new(g, group, me, signer, directory)),
        ProtocolId::Bd => Box::new(Runner::<G, bd::Bd<G>>::new(g, group, me, signer, directory)),
    }
}
