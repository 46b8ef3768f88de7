//! Secure group sessions for Conclave: the `secure` layer of DESIGN.md.
//!
//! An application opens a [`Session`] over its connection to a Conclave
//! daemon (`conclave-gcs-net`), joins groups with a [`Policy`] (which key
//! agreement protocol and which group to compute in), sends data and receives
//! [`SecureEvent`]s: *secure views* — a membership view together with a fresh
//! key that the members agreed by contributory group key agreement — and the
//! decrypted messages sent in them. The session API follows SEAL's
//! (join / send / recv / leave).
//!
//! Everything a session decides is in [`SessionCore`] ([`core`]), a sans-IO
//! state machine (inputs with `now`, outputs polled, injected randomness and
//! wall clock); [`Session`] is its tokio shell, and [`sim`] runs cores on a
//! real daemon core from one seed, with an attacker (`conclave sim`).
//!
//! This is the *layered* architecture (Secure Spread): the daemon knows
//! nothing about keys. Each group's key agreement messages (from the sans-IO
//! engines of `conclave-gka`) and its encrypted data messages share the
//! daemon group; a one-byte tag in front of each payload tells them apart.
//!
//! * **Rekey on every view.** Every daemon view is fed to the group's engine;
//!   the view is shown to the application only once its key is installed
//!   and confirmed by every member (a signed MAC
//!   per member; a mismatch is reported as [`SecureEvent::KeyMismatch`] and
//!   the view is agreed again), so the application never sees a view without
//!   its key, nor a key its group does not share.
//! * **Fresh.** View ids carry the daemon's random per-boot incarnation and
//!   keys are bound to an [`Epoch`] (view and run), so nothing recorded in
//!   one daemon lifetime, view or run is accepted in another. A view that arrives
//!   during a rekey restarts it; the superseded view is never shown.
//! * **No message lost to a rekey.** Sends made while a key is being agreed
//!   wait and go out under the new key. A message sent just before a view
//!   change and delivered in the next view is refused by everybody and sent
//!   again by its sender under the next key.
//! * **Data messages** ([`data`]): AES-256-GCM under a key per epoch
//!   and sender, derived with HKDF-SHA256 from the group key; the header
//!   (group, epoch, sender, sequence number) is the associated data and the
//!   sequence number the nonce; the sender signs (the BLAKE3 digest of)
//!   header and ciphertext with its identity key. One message carries a
//!   bundle of the sender's messages that waited while its earlier ones
//!   travelled. Receivers reject altered messages, bad signatures, unknown
//!   epochs, replays and senders outside the secure view with
//!   [`SecureEvent::Rejected`]; the session goes on. By virtual synchrony a
//!   message is delivered in the view it was sent in, so only the current
//!   epoch's keys are ever needed: a view change erases them.
//! * **Policy.** The group's first member fixes the policy. Key agreement
//!   messages carry their sender's policy; a joiner that hears an older member
//!   speak another policy gets [`SecureEvent::PolicyMismatch`] and is taken
//!   out of the group, so the others can rekey without it.
//!
//! # Certified identities
//!
//! A session opened with [`Session::connect_certified`] trusts a group
//! authority ([`trust::Authority`]: an X.509 CA and its CRL, made by
//! `conclave keys`) instead of a fixed [`Directory`](conclave_gka::Directory).
//! Certificates travel in-band, and every decision depends only on the
//! agreed message stream, so all members of a view decide alike:
//!
//! * **Presenting.** On every view that is not a pure shrink (a join or a
//!   merge, and a member's first view), each member multicasts its
//!   certificate with a signature binding it to the group and the view (so a
//!   certificate, which is public, proves nothing without its key). A view
//!   that every member entered from the same previous view, all of them
//!   decided there, keeps the previous verdicts: leaves cost nothing extra.
//! * **Holding.** The view is held (no key agreement starts) until every
//!   member has a verdict: *accepted* (its certificate verifies: issued by the
//!   authority, valid now, not revoked, common name = member name, Ed25519,
//!   proof of possession) or *refused*. Key agreement messages that arrive
//!   meanwhile wait.
//! * **Only proof gives a verdict.** A certificate message that fails any of
//!   those checks proves nothing about who sent it (a compromised link can
//!   deliver anything under any name), so it gives no verdict; it only
//!   raises a *doubt* (a [`trust::Refusal`]), kept as the reason to report.
//! * **No valid certificate.** A member that presents none that verifies
//!   would hold the view forever, so each member has a deadline (1 s by
//!   default, [`Session::set_certificate_timeout`]). When an accepted member's
//!   deadline passes it multicasts a notice, signed with its identity key,
//!   naming the members still without a verdict; the first notice from an
//!   accepted member whose signature verifies in the
//!   agreed order refuses them at every member (reported with the doubt
//!   about each, or "no certificate"), *provisionally*: a valid
//!   certificate that comes later in the same view readmits its member, and
//!   every member (all see it at the same point) runs the view again with
//!   it. So an outsider without a certificate holds a view for at most the
//!   deadline, and an early (even malicious) notice costs an honest member
//!   one extra rekey, never its place. Only *when* the notice is sent is a
//!   local decision.
//! * **Running without the refused.** The engine runs on the view without
//!   the refused members (same view id and order), and verifies key agreement
//!   messages against the accepted certificates only; the refused members'
//!   key agreement and data messages are ignored. The application gets
//!   [`SecureEvent::Refused`] once per refused member per view, and secure
//!   views list accepted members only. The oldest accepted member unicasts
//!   each refused member the reason; a refused session whose own certificate
//!   did not verify reports it as [`SecureEvent::Excluded`] and stands aside
//!   until the next view (one whose own certificate verified ignores it: it
//!   was readmitted, or will be, at the same point everywhere).
//! * **One authority per group.** The oldest member fixes the authority, as
//!   it fixes the policy: a member that verifies nobody else and whose
//!   authority did not issue the oldest member's certificate stands aside ([`SecureEvent::Excluded`] with
//!   [`trust::Refusal::UnknownIssuer`]) instead of agreeing a key with the
//!   members it does accept.
//!
//! What remains local: each member's authority, CRL and clock. Members with
//! different CRLs (or a certificate that expires during a view change) can
//! disagree on a verdict; they then run key agreement on different member
//! lists, the run fails its signature checks or stalls, and the next view
//! (with the same configuration everywhere) heals it. A session that holds
//! an out-of-date CRL and accepts itself may also start key agreement before
//! the refusal notice reaches it; it cannot compute the group's key, since
//! the others' run does not include it.
//!
//! # Limitations (for now)
//!
//! * Only the layered mode; interval rekeying (SEAL) and the integrated
//!   architecture are later issues.
//! * The authority and CRL are read when the session is made; a new CRL
//!   takes effect for sessions made after it (and only at views that
//!   re-decide: joins and merges).
//! * Outgoing traffic is queued without bound (no backpressure to `send`).
//! * Data goes by agreed multicast only; there are no encrypted unicasts.
//! * A current member's message that names an earlier epoch is dropped
//!   without an event: it cannot be told apart from one sent just before a
//!   view change (which its sender sends again).
//! * A policy mismatch is detected when an older member's key agreement
//!   message (or the oldest member's notice) reaches the joiner; the policy
//!   covers the protocol and the group, not the signature scheme.
//!
//! # Parsing received payloads
//!
//! [`payload`] describes the wire format of what a session receives, and
//! [`payload::parse_payload`] runs every pure parsing step a session applies
//! to it (the same functions) without a daemon, session, key or authority:
//! the entry point of the `secure_payload` fuzz target and of
//! `tests/decoders.rs`.
//!
//! Above this crate: the `conclave` applications (chat, gauge, bench). Below
//! it: `conclave-gka` (engines, keys) and `conclave-gcs-net` (daemon client).
//!
//! The feature `tokio` (on by default) builds the [`Session`] shell and its
//! daemon client; without it the crate is the sans-IO core alone, with no
//! async runtime, no clock and no OS randomness in its dependency tree
//! (`cargo tree -p conclave-secure --no-default-features -e normal`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod confirm;
pub mod core;
pub mod data;
mod evs;
pub mod payload;
#[cfg(feature = "tokio")]
mod session;
pub mod sim;
pub mod trust;

use std::time::Duration;

pub use crate::core::{
    SessionCore, Transmit, WallClock, DEFAULT_CERT_TIMEOUT, MAX_HELD_BYTES, MAX_HELD_BYTES_PER_SENDER,
    THREE_STEP_FINGERPRINT,
};
pub use conclave_gcs::core::{ErrorCode, GroupMode};
pub use conclave_gcs::{GroupName, MemberId, Members};
pub use conclave_gka::protocols::seal::IntervalStats;
pub use conclave_gka::{Epoch, GroupId, IntervalAlgorithm, ProtocolId, ViewId};
pub use confirm::{confirmation_cost, ConfirmCost};
pub use data::{DataError, DataHeader, EpochKeys};
#[cfg(feature = "tokio")]
pub use session::{Session, SystemClock};
pub use trust::Refusal;

/// How a group agrees on its keys and protects its data; fixed by the
/// group's first member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    /// The key agreement protocol.
    pub protocol: ProtocolId,
    /// The group the protocol computes in.
    pub group_id: GroupId,
    /// Whether every data message carries its sender's signature (the
    /// default). Without, the group key only proves that *a member* wrote a
    /// message: any member can write in another's name. Turn it off only
    /// where every member trusts every other and throughput matters more.
    pub sender_signatures: bool,
    /// SEAL's interval rekeying (TGDH only), or `None` to rekey on every
    /// view (the default). See [`Interval`] for what it trades away.
    pub interval: Option<Interval>,
    /// Who protects the group's traffic (see `conclave-integrated`):
    /// * [`GroupMode::Members`] — the layered architecture: the members
    ///   agree their own keys with `protocol` (the default);
    /// * [`GroupMode::Keyed`] — the integrated architecture's Integrated VS:
    ///   the daemons key the group (they agree a key among themselves with
    ///   TGDH and give each view its own key derived from it), and the
    ///   members run no key agreement;
    /// * [`GroupMode::ThreeStep`] — Three-Step client–server: no group key
    ///   at all; each member reaches its daemon over TLS or the local
    ///   socket, and the daemons seal everything between them;
    /// * [`GroupMode::OptimizedEvs`] — Optimized EVS: keyed by the daemons
    ///   as Integrated VS, and a message sealed under an earlier view's key
    ///   is re-encrypted by the daemons under the key of the view it is
    ///   delivered in, so a view change costs no message sent twice (see
    ///   `conclave_integrated::evs`).
    ///
    /// The integrated modes trust the daemons with the group's traffic: a
    /// daemon that is compromised reads every such group's messages, where
    /// it reads no layered group's.
    pub mode: GroupMode,
    /// Whether clients that are not members may send to the group (an
    /// *open* group, [`SessionCore::send_open`]); three-step groups only,
    /// whose data goes in clear to each sender's daemon: anywhere else a
    /// non-member would hold no key to send under. The creator's choice.
    pub open: bool,
}

/// SEAL's interval rekeying: the joins and leaves of an interval are batched
/// into one TGDH rekey, which the view's leader (its longest-standing member)
/// starts at the end of every `period`
/// ([`conclave_gka::protocols::seal`]).
///
/// What it gives up, against rekeying on every view:
/// * **A joiner waits.** It holds no key, and reads and sends nothing, until
///   the next rekey: up to one `period` after its join (plus the rekey's
///   own time). Its sends wait, and go out under that key.
/// * **A leaver's last key stays in use** until the next rekey, up to one
///   `period` after the leave: a leaver that kept listening to the network
///   could read what the group sends in that time (the daemon no longer
///   delivers it to the leaver, but the packets are encrypted under a key it
///   knows). Forward secrecy holds from the next rekey on.
///
/// In return a burst of joins and leaves costs one rekey, not one per view.
/// A new group's first member, being the leader with no key, rekeys at once.
/// With `rekey_on_leave` the leader rekeys at once when a view drops a
/// member that holds the key (a leave, a crash, a partition), so a leaver's
/// key is never used after it, while joins still wait for the period (or ride
/// along with such a rekey). The period and `rekey_on_leave` are each
/// leader's own: only the algorithm is part of the group's policy on the
/// wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Interval {
    /// Rebuild, Batch or Queue-batch.
    pub algorithm: IntervalAlgorithm,
    /// Time between the leader's rekeys.
    pub period: Duration,
    /// Rekey at once when a key holder leaves the view (joins still batch).
    pub rekey_on_leave: bool,
}

impl Policy {
    /// `protocol` over `group_id`, data messages signed by their senders,
    /// rekeyed on every view.
    pub fn new(protocol: ProtocolId, group_id: GroupId) -> Self {
        Self { protocol, group_id, sender_signatures: true, interval: None, mode: GroupMode::Members, open: false }
    }

    /// TGDH over ristretto255 with SEAL's interval rekeying.
    pub fn interval(algorithm: IntervalAlgorithm, period: Duration) -> Self {
        let interval = Interval { algorithm, period, rekey_on_leave: false };
        Self { interval: Some(interval), ..Self::new(ProtocolId::Tgdh, GroupId::Ristretto255) }
    }

    /// Integrated VS: each view's key from the daemons (see [`Policy::mode`]).
    pub fn integrated() -> Self {
        Self { mode: GroupMode::Keyed, ..Self::new(ProtocolId::Tgdh, GroupId::Ristretto255) }
    }

    /// Three-Step client–server: no group key; the daemons protect the
    /// traffic (see [`Policy::mode`]).
    pub fn three_step() -> Self {
        Self { mode: GroupMode::ThreeStep, ..Self::new(ProtocolId::Tgdh, GroupId::Ristretto255) }
    }

    /// Optimized EVS: keyed by the daemons, messages that cross a view
    /// change re-encrypted by them (see [`Policy::mode`]).
    pub fn optimized_evs() -> Self {
        Self { mode: GroupMode::OptimizedEvs, ..Self::new(ProtocolId::Tgdh, GroupId::Ristretto255) }
    }

    /// The policy's two wire codes (see [`payload::tag::KA`]): the
    /// protocol's code (low four bits), the interval algorithm's code
    /// shifted left by four (0: rekeyed on every view; 7: keyed by the
    /// daemons), with
    /// [`payload::UNSIGNED_DATA`] set if data messages are not signed; and
    /// the group's code.
    pub fn codes(&self) -> (u8, u8) {
        let unsigned = if self.sender_signatures { 0 } else { payload::UNSIGNED_DATA };
        let interval = match (self.mode, self.interval) {
            (GroupMode::Keyed, _) => payload::KEYED << 4,
            (GroupMode::ThreeStep, _) => payload::THREE_STEP << 4,
            (GroupMode::OptimizedEvs, _) => payload::OPTIMIZED_EVS << 4,
            (GroupMode::Members, i) => i.map_or(0, |i| i.algorithm.code() << 4),
        };
        (self.protocol.code() | interval | unsigned, self.group_id.code())
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.interval {
            _ if self.mode == GroupMode::Keyed => f.write_str("integrated-vs")?,
            _ if self.mode == GroupMode::ThreeStep && self.open => f.write_str("three-step:open")?,
            _ if self.mode == GroupMode::ThreeStep => f.write_str("three-step")?,
            _ if self.mode == GroupMode::OptimizedEvs => f.write_str("optimized-evs")?,
            None => write!(f, "{}", self.protocol.name())?,
            Some(i) => {
                write!(f, "tgdh-interval:{}:{}s", i.algorithm.name(), i.period.as_secs_f64())?;
                if i.rekey_on_leave {
                    f.write_str(":rekey-on-leave")?;
                }
            }
        }
        if self.group_id != GroupId::Ristretto255 {
            write!(f, " over {:?}", self.group_id)?;
        }
        if !self.sender_signatures {
            f.write_str(" (data unsigned)")?;
        }
        Ok(())
    }
}

/// Why a policy name did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown key agreement policy {0:?}: expected gdh, ckd, tgdh, str or bd (also layered:gdh and so on: the \
     members agree a key on every view), tgdh-interval:ALGORITHM:PERIOD / ALGORITHM:PERIOD with ALGORITHM \
     rebuild, batch or queue-batch and PERIOD like 15s, 500ms or 2m (SEAL's interval rekeying), optionally \
     followed by :rekey-on-leave, integrated-vs (the daemons key the group), optimized-evs (the daemons key \
     the group and re-encrypt messages that cross a view change) or three-step (no group key: TLS or the local \
     socket to the daemon, sealed between the daemons; three-step:open lets non-members send)"
)]
pub struct PolicyParseError(String);

impl std::str::FromStr for Policy {
    type Err = PolicyParseError;

    /// `gdh`, `ckd`, `tgdh`, `str`, `bd`, or `tgdh-interval:queue-batch:15s`
    /// (also `queue-batch:15s`), either with `:rekey-on-leave` appended,
    /// over ristretto255, data signed.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PolicyParseError(s.to_owned());
        if s == "integrated-vs" {
            return Ok(Policy::integrated());
        }
        if s == "three-step" {
            return Ok(Policy::three_step());
        }
        if s == "three-step:open" {
            return Ok(Policy { open: true, ..Policy::three_step() });
        }
        if s == "optimized-evs" {
            return Ok(Policy::optimized_evs());
        }
        if let Some(p) = ProtocolId::from_name(s.strip_prefix("layered:").unwrap_or(s)) {
            return Ok(Policy::new(p, GroupId::Ristretto255));
        }
        let rest = s.strip_prefix("tgdh-interval:").unwrap_or(s);
        let (rest, rekey_on_leave) = match rest.strip_suffix(":rekey-on-leave") {
            Some(rest) => (rest, true),
            None => (rest, false),
        };
        let (algorithm, period) = rest.split_once(':').ok_or_else(err)?;
        let algorithm = IntervalAlgorithm::from_name(algorithm).ok_or_else(err)?;
        let period = parse_period(period).filter(|p| !p.is_zero()).ok_or_else(err)?;
        let mut policy = Policy::interval(algorithm, period);
        policy.interval = policy.interval.map(|i| Interval { rekey_on_leave, ..i });
        Ok(policy)
    }
}

/// `15s`, `500ms`, `2m`, or a bare number of seconds.
fn parse_period(s: &str) -> Option<Duration> {
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = number.parse().ok()?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

impl Default for Policy {
    /// TGDH over ristretto255, data messages signed.
    fn default() -> Self {
        Self::new(ProtocolId::Tgdh, GroupId::Ristretto255)
    }
}

/// What a member's key agreement engine has spent in one group so far
/// ([`Session::meter`]): its cost meter and, under interval rekeying, the
/// blinded keys and BKEY packets it broadcast and the rekeys it led.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meter {
    /// Exponentiations, signatures, verifications, messages, bytes.
    pub costs: conclave_gka::Costs,
    /// Interval rekeying only.
    pub interval: Option<conclave_gka::protocols::seal::IntervalStats>,
}

/// A membership view with its agreed key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecureViewInfo {
    /// The group.
    pub group: GroupName,
    /// Members, oldest first (shared with the session).
    pub members: Members,
    /// The key's epoch: the daemon view it was agreed in and the run in it.
    pub epoch: Epoch,
    /// The protocol that agreed the key.
    pub protocol: ProtocolId,
    /// A short public fingerprint of the key (equal at every member).
    pub fingerprint: String,
    /// From the first daemon view not yet secured to the key's
    /// installation (confirmed by every member). Under interval rekeying,
    /// SEAL's rekeying time (§6): from the first rekey message this member
    /// received since its last install (a joiner's wait for the rekey is not
    /// in it).
    pub rekey_time: Duration,
}

/// Why a message was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RejectReason {
    /// Not a well-formed message of this layer.
    #[error("malformed message")]
    Malformed,
    /// The sender is not in the secure view, or the header names someone
    /// other than who the daemon says sent it, or another group.
    #[error("unknown sender")]
    UnknownSender,
    /// The message names an epoch that is not the current one.
    #[error("unknown epoch {0}")]
    UnknownEpoch(Epoch),
    /// The message says it was sent in another daemon view than the one it
    /// was delivered in (a replay from another view, component or daemon
    /// lifetime).
    #[error("sent in another view ({0})")]
    OtherView(ViewId),
    /// Authentication failed: altered, or encrypted under another key.
    #[error("authentication failed")]
    AuthFailed,
    /// The sender's signature does not verify: another member (who holds
    /// the group key) wrote it in the sender's name, or it was altered.
    #[error("the sender's signature does not verify")]
    BadSignature,
    /// Held for a key not yet confirmed, but the bound on held messages
    /// (in bytes, per sender) was reached.
    #[error("too much held before the key; dropped")]
    HeldBudget,
    /// This sequence number (or a later one) was already accepted.
    #[error("replayed sequence number {0}")]
    Replay(u64),
    /// A key agreement message under another policy (from a newer member).
    #[error("key agreement message under another policy")]
    PolicyMismatch,
    /// A key agreement message that the engine refused.
    #[error("key agreement: {0}")]
    KeyAgreement(String),
    /// A validly signed key agreement message that no honest member would
    /// send: the sender misbehaved, as this proves.
    #[error("key agreement: the sender misbehaved: {0}")]
    Misbehaved(conclave_gka::Misbehaved),
    /// A message in clear (three-step data) in a group whose messages are
    /// encrypted, or anything else in a three-step group.
    #[error("not a message of this group's mode")]
    WrongMode,
    /// Optimized EVS: the daemon could not re-encrypt this message for the
    /// view it was delivered in: the key of the view it was sealed in
    /// (`key_view`) had expired there, or was never there (sealed on the
    /// other side of a partition). It is lost; the daemon said so instead
    /// of dropping it. With the sender, `key_view` and `seq` (the sender's
    /// count of bundles under that key) name it, e.g. to ask for it again;
    /// it was a bundle of `messages` messages, all lost.
    #[error(
        "{messages} message(s), bundle {seq} sealed under the key of view {key_view}, which the daemon no longer holds"
    )]
    KeyGone {
        /// The view whose key sealed it.
        key_view: ViewId,
        /// The sender's count of bundles under that key.
        seq: u64,
        /// The messages the bundle carried.
        messages: u32,
    },
    /// Optimized EVS, certified sessions: the message was delivered in a
    /// view that ended before its key was confirmed, where the sender's
    /// certificate may not have arrived; every member that moves on with
    /// this one reports it alike instead of reading it (the sender too). It
    /// is lost. `key_view`, `seq` and `messages` name it as in
    /// [`RejectReason::KeyGone`].
    #[error(
        "{messages} message(s), bundle {seq} sealed under the key of view {key_view}, in a view cut short before its key was confirmed"
    )]
    CutShort {
        /// The view whose key its sender sealed it under.
        key_view: ViewId,
        /// The sender's count of bundles under that key.
        seq: u64,
        /// The messages the bundle carried.
        messages: u32,
    },
}

/// What a [`Session`] delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecureEvent {
    /// A new secure view: from now on, messages are of this epoch.
    View(SecureViewInfo),
    /// A decrypted data message (own messages come back too).
    Message {
        /// The group.
        group: GroupName,
        /// Who sent it.
        sender: MemberId,
        /// The epoch it was sent and delivered in.
        epoch: Epoch,
        /// The plaintext (a slice of the buffer its bundle was decrypted
        /// into: no copy).
        data: bytes::Bytes,
    },
    /// A message was refused; the session goes on.
    Rejected {
        /// The group.
        group: GroupName,
        /// Who the daemon says sent it.
        sender: MemberId,
        /// Why.
        reason: RejectReason,
    },
    /// The group runs another policy than the one this member joined with;
    /// this member has been taken out of the group ([`SecureEvent::Left`] follows).
    PolicyMismatch {
        /// The group.
        group: GroupName,
        /// The policy this member asked for.
        ours: Policy,
        /// The group's policy, if this member knows it.
        theirs: Option<Policy>,
        /// The older member whose message showed the mismatch.
        from: MemberId,
    },
    /// Certified mode: a member of the view was refused a place in the
    /// group (it takes no part in key agreement and gets no key).
    Refused {
        /// The group.
        group: GroupName,
        /// Who was refused.
        member: MemberId,
        /// Why.
        reason: trust::Refusal,
    },
    /// This member was refused in the current view (told by `by`, the
    /// oldest member that accepts it; or it found that the group's oldest
    /// member is certified by another authority). It gets no key and stands
    /// aside until the next view.
    Excluded {
        /// The group.
        group: GroupName,
        /// The member that refused it.
        by: MemberId,
        /// Why.
        reason: trust::Refusal,
    },
    /// Key confirmation failed: after a run, some members' confirmations did
    /// not match the key this member holds (the members hold different keys,
    /// or those members lied). No key of this run was used; the view is
    /// being rekeyed from scratch. Every honest member reports it.
    KeyMismatch {
        /// The group.
        group: GroupName,
        /// The run whose key did not confirm.
        epoch: Epoch,
        /// The members whose confirmation did not match this member's key.
        unconfirmed: Vec<MemberId>,
    },
    /// Interval rekeying: the members of the current daemon view that hold
    /// no key of the group yet and wait for the next rekey (joiners since
    /// this member's last rekey; while this member holds no key, only
    /// itself). Reported when the list changes; empty once everyone is in
    /// the key. See [`Session::waiting_members`].
    Waiting {
        /// The group.
        group: GroupName,
        /// Who waits, oldest first.
        members: Vec<MemberId>,
    },
    /// The member left the group: nothing more comes from it.
    Left {
        /// The group.
        group: GroupName,
    },
    /// The daemon refused a request.
    DaemonError {
        /// What went wrong.
        code: ErrorCode,
        /// Details for people.
        text: String,
    },
}

/// Errors that end an operation (events that do not end the session are
/// [`SecureEvent`]s).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The daemon connection failed or closed.
    #[cfg(feature = "tokio")]
    #[error("daemon connection: {0}")]
    Client(#[from] conclave_gcs_net::ClientError),
    /// The session's writer stopped (the connection is gone).
    #[error("the session is closed")]
    Closed,
    /// A name breaks the naming rules.
    #[error("bad name: {0}")]
    Name(#[from] conclave_gcs::view::NameError),
    /// Not a member of the group (or leaving it).
    #[error("not joined to group {0}")]
    NotJoined(GroupName),
    /// Already a member of the group.
    #[error("already joined to group {0}")]
    AlreadyJoined(GroupName),
    /// The session is leaving the group and has not yet reported
    /// [`SecureEvent::Left`]; join again after it.
    #[error("still leaving group {0}: join again after its Left event")]
    StillLeaving(GroupName),
    /// The policy asks for something this version cannot do.
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// The message is too large.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The limit.
        max: usize,
    },
}
