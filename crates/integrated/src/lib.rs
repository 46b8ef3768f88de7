//! The integrated architecture: the daemons agree one key among themselves,
//! and every view of a *keyed* group gets its own key from it.
//!
//! In the layered architecture (the rest of Conclave) every client group runs
//! its own contributory key agreement, so a change of the daemon group that
//! touches a thousand groups costs a thousand key agreements. In the
//! integrated architecture of Amir, Nita-Rotaru, Stanton and Tsudik
//! ("Scaling Secure Group Communication Systems: Beyond Peer-to-Peer",
//! DISCEX III, 2003), the daemons run one key agreement among themselves —
//! the *Servers Agreement Engine* — and derive each group view's key from
//! the result with one MAC — the *Group Keys Engine*. Its price is trust: a
//! daemon that is compromised reads the traffic of every keyed group, where
//! in the layered architecture it reads none.
//!
//! This crate is that pair as a [`Machine`] around the daemon [`Core`]
//! ([`KeyedDaemon`]), so that every daemon shell — the standalone daemon,
//! the simulated daemons of `conclave_gcs::daemon_sim` — runs it unchanged:
//!
//! * **Servers Agreement Engine.** Whenever the core installs a configuration
//!   of the daemon group (after the state exchange that follows every change,
//!   cascades included), the daemons run TGDH — the same `conclave-gka`
//!   engine the clients run, with the daemons' own identities — over the
//!   ordered stream ([`Op::DaemonKa`]). Its engine follows the
//!   configurations as a client's follows its group's views, so a change of
//!   the daemon group costs what the same change costs a TGDH client group:
//!   a partition is a leave (one sponsor refreshes its share and broadcasts
//!   its path: one round), a merge announces each part's tree and refreshes
//!   one path (two), where agreeing from scratch took a round per level of
//!   the tree. Each run has a sponsor's fresh share, so the key `K_s` of a
//!   configuration is new even if the same daemons had one before. A daemon
//!   alone has its key at once.
//! * **Group Keys Engine (Integrated VS, paper §4.3.2).** The key of view `v`
//!   of keyed group `g` is `HMAC-SHA256(K_s, label ‖ len(g) ‖ g ‖ v)` with
//!   `v` the 16-byte view id ([`view_key`]). The paper's construction is
//!   `HMAC(K_s, g ‖ view_id)`; `K_s` is already a uniform key (the TGDH
//!   engine derives it with HKDF), so one HMAC is the PRF call that is needed
//!   — HKDF-Expand with a one-block output would be the same HMAC — and the
//!   label and the length of `g` keep the input unambiguous. View ids are
//!   unique across daemon lifetimes, components and transitional sets, so no
//!   two views share a key. The key is delivered to each member of the view
//!   on its own connection just before the view ([`Delivery::GroupKey`]),
//!   never to anyone else.
//! * **Key confirmation among the daemons** ([`confirm`]): a key the
//!   daemons' engine installs keys nothing until every daemon of its run has
//!   confirmed, over the stream, that it holds the same one (a MAC under a
//!   key derived from it, signed); a split is found by every daemon at the
//!   same point of the stream and agreed again from scratch (once per
//!   configuration: a second one holds keyed views until the daemon group
//!   changes). So every member of every keyed group gets the same key for the
//!   same view, and the members confirm nothing themselves: one round among
//!   the daemons per key of theirs, not one per view of every keyed group.
//! * **Until it has agreed, no view that needs it is delivered** (§4.3.1):
//!   from a change of the daemon group until the new `K_s`, the deliveries of
//!   each keyed group are held from its first view on, in order, and released
//!   with their keys when the key is there. Other groups are not held.
//!
//! * **Who takes part** ([`DaemonTrust`]): after each change of the daemon
//!   group every daemon presents a credential over the stream (a certificate
//!   of the group authority in a cluster), and each admits to the agreement
//!   only the daemons its trust accepts. A daemon the others do not admit
//!   never holds their key.
//! * **Renewal by policy**: `K_s` is renewed after a number of bytes
//!   ([`KeyedDaemon::with_data_limit`]) or a time
//!   ([`KeyedDaemon::with_key_lifetime`]), and every keyed group gets an
//!   artificial view change.
//!
//! * **The sealed backbone (Three-Step client–server, §4.3.1)**
//!   ([`KeyedDaemon::with_sealed_backbone`]): every client operation that
//!   goes from one daemon to the others travels sealed with an AEAD key
//!   derived from `K_s` — control traffic (joins, leaves, connects) and data
//!   alike; see the [`seal`] module for what it covers and how every daemon
//!   makes the same decision about each sealed operation.
//!
//! * **Optimized EVS (paper §4.3.3)** ([`evs`]): groups keyed like Integrated
//!   VS whose messages, when delivered in a later view than the one whose
//!   key sealed them, are re-encrypted by the daemons under the delivery
//!   view's key; the daemons keep each such group's recent view keys, and
//!   drop them by key-out and time-out ([`KeyedDaemon::with_evs_expiry`]).

mod confirm;
pub mod evs;
pub mod seal;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use conclave_gcs::core::{ConnId, Core, DaemonId, Delivery, Machine, Op, Output, ViewKey};
use conclave_gcs::{Cause, GroupName, MemberId, View, ViewId, ViewMember};
use conclave_gka::suite::{Signer, Verifier};
use conclave_gka::{Engine, GroupId, GroupKey, Output as EngineOutput, ProtocolId, SecureView, StaticDirectory};
use hmac::{Hmac, Mac};
use rand_core::CryptoRngCore;
use sha2::Sha256;

/// The name the daemons' key agreement runs under (bound into its messages
/// and its key).
pub const DAEMON_GROUP: &str = "conclave/daemons";

/// How often (shell clock microseconds) the Optimized EVS key store is
/// swept for keys past their time-out: a key lives at most this much longer.
const EVS_SWEEP: u64 = 1_000_000;

/// The label of [`view_key`]'s input.
const VIEW_KEY_LABEL: &[u8] = b"conclave/integrated/v1/view-key";

/// Daemon `d`'s member name in the daemons' key agreement, and the name its
/// certificate of the group authority holds (`conclave keys issue daemon-N`).
pub fn daemon_member(d: DaemonId) -> MemberId {
    MemberId::new(format!("daemon-{}", d.0)).expect("a valid member name")
}

/// The daemon whose member name is `m` ([`daemon_member`]'s inverse).
pub fn daemon_of_member(m: &MemberId) -> Option<DaemonId> {
    let n = m.as_str().strip_prefix("daemon-")?;
    // Canonical numbers only: "daemon-01" is nobody.
    n.parse::<u16>().ok().filter(|d| d.to_string() == n).map(DaemonId)
}

/// The key of view `view` of keyed group `group` under the daemons' key
/// `server_key` (see the [crate docs](self)).
pub fn view_key(server_key: &GroupKey, group: &GroupName, view: ViewId) -> ViewKey {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(server_key.expose_secret()).expect("HMAC takes any key");
    mac.update(VIEW_KEY_LABEL);
    mac.update(&[0]);
    mac.update(&(group.as_str().len() as u16).to_be_bytes());
    mac.update(group.as_str().as_bytes());
    mac.update(&view.to_bytes());
    ViewKey::new(mac.finalize().into_bytes().into())
}

/// How a daemon proves who it is to the other daemons, and checks them: the
/// Servers Agreement Engine admits to its key agreement only the daemons
/// this accepts. The daemons of a configuration present their credentials
/// over the ordered stream, so each one judges the same credentials in the
/// same order; daemons configured with the same trust agree on whom they
/// admit.
pub trait DaemonTrust: Send {
    /// This daemon's signing key for the key agreement.
    fn signer(&self) -> Arc<dyn Signer>;
    /// What this daemon presents to the others (a certificate, say); at most
    /// [`MAX_CREDENTIAL`] bytes.
    fn credential(&self) -> Vec<u8>;
    /// Checks what daemon `daemon` presented; its verifying key if it is
    /// admitted, why not otherwise.
    fn verify(&self, daemon: DaemonId, credential: &[u8]) -> Result<Arc<dyn Verifier>, String>;
}

/// The largest credential a daemon presents (a certificate of the group
/// authority is well under it).
pub const MAX_CREDENTIAL: usize = 16 * 1024;

/// Who the daemons are, fixed in advance: this daemon's signing identity and
/// every daemon's verifying key (simulations and tests, and a standalone
/// daemon, which trusts only itself). Credentials are empty.
#[derive(Clone)]
pub struct DaemonIdentities {
    me: Arc<dyn Signer>,
    keys: BTreeMap<DaemonId, Arc<dyn Verifier>>,
}

impl DaemonIdentities {
    /// This daemon signs with `me`; daemon `d` is trusted with `keys[d]`.
    pub fn new(me: Arc<dyn Signer>, keys: impl IntoIterator<Item = (DaemonId, Arc<dyn Verifier>)>) -> Self {
        Self { me, keys: keys.into_iter().collect() }
    }

    /// A daemon that trusts no other: its configuration is itself alone, as
    /// a standalone daemon's always is.
    pub fn alone(me: DaemonId, signer: Arc<dyn Signer>) -> Self {
        let verifier = signer.verifier();
        Self::new(signer, [(me, verifier)])
    }
}

impl DaemonTrust for DaemonIdentities {
    fn signer(&self) -> Arc<dyn Signer> {
        self.me.clone()
    }

    fn credential(&self) -> Vec<u8> {
        Vec::new()
    }

    fn verify(&self, daemon: DaemonId, _credential: &[u8]) -> Result<Arc<dyn Verifier>, String> {
        self.keys.get(&daemon).cloned().ok_or_else(|| format!("daemon {} is not one of the known daemons", daemon.0))
    }
}

/// The kinds of [`Op::DaemonKa`] payloads: the first byte.
pub(crate) mod ka_kind {
    /// A daemon's credential for a configuration of the daemon group, sent
    /// when the daemon installs it: the configuration's id (16 bytes); the
    /// configuration whose key agreement its engine last followed (a byte 0
    /// for none, or 1 and its id, 16 bytes); then the credential.
    ///
    /// Not the backbone's number of the change ([`Op::Daemons`]'s `epoch`):
    /// each daemon counts the changes it was told of, and daemons that a
    /// cascade took through different configurations, or that restarted,
    /// number the same change differently (a credential judged by that
    /// number was refused by every other daemon, and no keyed view came
    /// again). A configuration's id is the same at every daemon of it and
    /// no other configuration's.
    pub const CREDENTIAL: u8 = 0;
    /// A message of the key agreement.
    pub const AGREEMENT: u8 = 1;
    /// A daemon's request to renew the key of an epoch (time-out): the
    /// epoch ([`conclave_gka::EPOCH_LEN`] bytes).
    pub const RENEW: u8 = 2;
    /// A client operation sealed under the daemons' key (see [`crate::seal`]).
    pub const SEALED: u8 = 3;
    /// Data-out: a daemon holds the key of an epoch, and its clients' keyed
    /// traffic from here on counts under that key: the epoch
    /// ([`conclave_gka::EPOCH_LEN`] bytes). See [`KeyedDaemon::with_data_limit`].
    pub const COUNTING: u8 = 4;
    /// A daemon's confirmation of the key its run installed (see
    /// [`crate::confirm`]): the epoch ([`conclave_gka::EPOCH_LEN`] bytes),
    /// a MAC (32) and the daemon's signature.
    pub const CONFIRM: u8 = 5;
}

/// A daemon admitted to a configuration's key agreement.
struct Admitted {
    key: Arc<dyn Verifier>,
    /// The configuration whose key agreement its engine last followed.
    came_from: Option<ViewId>,
}

/// A delivery of a keyed group waiting for the daemons' key: to whom, what,
/// and the configuration it was made in (`None`: during an exchange).
type Held = (Vec<ConnId>, Delivery, Option<ViewId>);

/// Where the daemons' key stands.
enum ServerKey {
    /// A change of the daemon group is being worked through: views of keyed
    /// groups wait.
    Changing,
    /// The daemons of configuration `id` present their credentials; `heard`
    /// holds each one's verdict so far (its key if admitted).
    Presenting { id: ViewId, daemons: Vec<DaemonId>, heard: BTreeMap<DaemonId, Option<Admitted>> },
    /// The admitted daemons run the key agreement, then confirm its key
    /// ([`KeyedDaemon::confirming`]).
    Agreeing,
    /// The key of the current configuration.
    Agreed(SecureView),
    /// This daemon was not admitted to its configuration's key agreement (or
    /// none of it could start): no keyed view is delivered until the next
    /// configuration.
    Refused,
}

/// A daemon [`Core`] with the integrated architecture's two engines around
/// it (see the [crate docs](self)). Deterministic: its randomness is the
/// injected RNG's.
pub struct KeyedDaemon {
    core: Core,
    me: DaemonId,
    /// How this daemon proves itself and checks the others.
    trust: Box<dyn DaemonTrust>,
    /// The daemons' key agreement, which follows the configurations (their
    /// admitted daemons) as a client session's engine follows views.
    engine: Option<Box<dyn Engine>>,
    /// The configuration the engine last followed.
    followed: Option<ViewId>,
    /// What this daemon presents as the state it comes from: the
    /// configuration it followed if, when the daemon group last changed,
    /// it held that configuration's first key and was not renewing it (so
    /// any daemon that presents the same holds the same key tree); none
    /// otherwise, and it takes part as a newcomer.
    came_from: Option<ViewId>,
    rng: Box<dyn CryptoRngCore + Send>,
    key: ServerKey,
    /// The daemons admitted to the current configuration's key agreement,
    /// with their verifying keys.
    admitted: BTreeMap<DaemonId, Arc<dyn Verifier>>,
    /// A key of the daemons installed by this daemon's engine, being
    /// confirmed among the daemons of its run before it keys anything (see
    /// [`confirm`]): after a change of the daemon group (the key is
    /// [`ServerKey::Agreeing`] meanwhile) or a renewal (the one before still
    /// keys views meanwhile).
    confirming: Option<(confirm::Confirming, SecureView)>,
    /// Confirmations ordered before this daemon confirms their run.
    early: confirm::Early,
    /// The current configuration's key was agreed again from scratch after
    /// its daemons were found holding different keys: a second split stops
    /// keyed views until the next configuration instead of looping.
    split_rekeyed: bool,
    /// Deliveries of keyed groups waiting for the key, by group, in order.
    /// Each with the configuration it was made in: a view is keyed only
    /// under that configuration's key (see [`KeyedDaemon::deliver_keyed`]).
    held: BTreeMap<GroupName, VecDeque<Held>>,
    /// Key agreements completed (for tests and benchmarks).
    agreements: u64,
    /// Data-out: the most payload bytes keyed groups may send under one
    /// key of the daemons before they renew it.
    data_limit: Option<u64>,
    /// Payload bytes keyed groups sent under the current key.
    data_under_key: u64,
    /// Data-out: the daemons that have said, through the stream, that they
    /// hold the current key ([`ka_kind::COUNTING`]); only their clients'
    /// keyed traffic after that point counts under it.
    counting: std::collections::BTreeSet<DaemonId>,
    /// Data-out: the bytes each connection had counted under the current
    /// key when its renewal started.
    counted_by: BTreeMap<ConnId, u64>,
    /// Data-out: what each connection may still send under the current key
    /// before its traffic counts: what it had counted under the one before.
    allowance: BTreeMap<ConnId, u64>,
    /// The daemons are renewing their key (data-out or time-out); views keep
    /// their keys meanwhile.
    refreshing: bool,
    /// Time-out: the longest a key of the daemons is used (shell clock
    /// microseconds).
    key_lifetime: Option<u64>,
    /// When this daemon asks for the current key to be renewed; `None` until
    /// the first `now` after the key was agreed, and after asking.
    renew_at: Option<u64>,
    /// The current key was agreed and its time-out not yet set.
    lifetime_starts: bool,
    /// The sealed backbone, if on.
    sealing: Option<seal::Sealing>,
    /// Optimized EVS groups' view keys.
    evs: evs::EvsKeys,
    /// Views of Optimized EVS groups installed while the daemons' key was
    /// changing: keyed (as their deliveries are) when it is agreed.
    evs_waiting: Vec<(GroupName, ViewId, Option<ViewId>)>,
    /// The shell's clock at the last input (microseconds).
    now: u64,
    /// When the EVS key store was last swept for time-outs.
    evs_swept: u64,
}

impl KeyedDaemon {
    /// Wraps `core`, fresh from [`Core::new`]; `trust` says who this daemon
    /// is and which daemons it admits to the key agreement. A fresh core is
    /// alone in its configuration, so this daemon has a key at once; the
    /// daemons agree one when the backbone puts them together.
    pub fn new(mut core: Core, trust: impl DaemonTrust + 'static, rng: Box<dyn CryptoRngCore + Send>) -> Self {
        core.key_groups();
        let me = core.me();
        let mut daemon = Self {
            core,
            me,
            trust: Box::new(trust),
            engine: None,
            followed: None,
            came_from: None,
            rng,
            key: ServerKey::Changing,
            admitted: BTreeMap::new(),
            confirming: None,
            early: confirm::Early::default(),
            split_rekeyed: false,
            held: BTreeMap::new(),
            agreements: 0,
            data_limit: None,
            data_under_key: 0,
            counting: std::collections::BTreeSet::new(),
            counted_by: BTreeMap::new(),
            allowance: BTreeMap::new(),
            refreshing: false,
            key_lifetime: None,
            renew_at: None,
            lifetime_starts: false,
            sealing: None,
            evs: evs::EvsKeys::new(me, evs::DEFAULT_KEY_OUT, evs::DEFAULT_TIME_OUT),
            evs_waiting: Vec::new(),
            now: 0,
            evs_swept: 0,
        };
        let mut out = Vec::new();
        daemon.configuration_installed(&mut out);
        assert!(out.is_empty(), "a fresh core is alone in its configuration");
        daemon
    }

    /// Data-out (paper §4.3): once keyed groups have sent `bytes` payload
    /// bytes under one key of the daemons, the daemons agree a new one, and
    /// every keyed group gets a new view with the same members
    /// ([`conclave_gcs::Cause::Refresh`]) and a key from it. Every daemon of
    /// a group must have the same limit: each counts the bytes of the one
    /// ordered stream, so all renew at the same point of it.
    ///
    /// **What counts under a key.** Two rules, both decided on the one
    /// ordered stream, so every daemon counts the same bytes and renews at
    /// the same point of it:
    ///
    /// 1. *The daemon's fence.* When a daemon has a new key it says so
    ///    through the stream ([`ka_kind::COUNTING`]), after everything it
    ///    passed on before. Its clients' keyed multicasts and unicasts count
    ///    under the key only if the stream orders them after that point.
    /// 2. *The allowance.* Each connection may send, under a key renewed
    ///    within a configuration, as many bytes uncounted as it had counted
    ///    under the key before (up to the point that one's renewal started);
    ///    under the first key of a configuration it has none (the daemons of
    ///    a new configuration did not all count the same history).
    ///
    /// Why: a renewal gives every keyed group a new view, and a member
    /// accepts a message only in the view it was made for, so what members
    /// sent for the old views and the stream orders after the new ones is
    /// dead: dropped by its receivers and sent again by its sender. Counted
    /// under the new key (as the first version did), the dead traffic alone
    /// could reach the limit; the renewal then ended before the copies sent
    /// again were ordered, those were dead in their turn, and the groups were
    /// refreshed without end (`conclave sim` seed 10533: some 39,000
    /// refreshes with a 2 KiB limit). Rule 1 leaves out the dead traffic its
    /// daemon passed on before holding the new key; rule 2 the dead traffic
    /// still on the member's link, or in a member slower than the daemons'
    /// key agreement, when its daemon got the key (at most what the member
    /// had counted under the old key, which is what it may have to send
    /// again). So after a renewal, the limit is left for what members send
    /// for the new views.
    ///
    /// **The bound.** Counted under a key: at most the limit plus one
    /// message (counting stops when the renewal starts). Sent for views of a
    /// key and not counted under it: the allowance (at most the limit plus
    /// one message, over all connections), what the stream orders while the
    /// daemons agree the next key, and what a member sent for a view of the
    /// key that its daemon passed on after it held the next key (counted
    /// under that one instead). So a key protects at most twice the limit
    /// plus two messages, plus the traffic of one key agreement among the
    /// daemons and of one client link. Without new traffic the renewals
    /// stop as long as what one member has to send again after a renewal
    /// fits under the limit plus the allowance; a member with more than that to
    /// send again, slower than the daemons agree a key, can still be
    /// refreshed again and again (the daemons cannot tell a message made for
    /// the old view from one made for the new: both are sealed by the
    /// members). A real limit (gigabytes) is far above what any member
    /// sends again.
    pub fn with_data_limit(mut self, bytes: u64) -> Self {
        self.data_limit = Some(bytes.max(1));
        if matches!(self.key, ServerKey::Agreed(_)) {
            // A fresh daemon alone has its key already, and has passed
            // nothing on.
            self.counting.insert(self.me);
        }
        self
    }

    /// Time-out (paper §4.3): a key of the daemons is used for at most
    /// `micros` of the shell's clock; then the daemons agree a new one, and
    /// every keyed group gets a new view with the same members and a key
    /// from it, as after the data-out limit. Each daemon asks for the renewal
    /// through the stream when its own clock says so; the first request
    /// ordered renews the key at every daemon at the same point of the
    /// stream, and the others are void.
    pub fn with_key_lifetime(mut self, micros: u64) -> Self {
        self.key_lifetime = Some(micros.max(1));
        self
    }

    /// The sealed backbone (Three-Step client–server, paper §4.3.1): this
    /// daemon's clients' operations go to the other daemons sealed under a
    /// key derived from the daemons' key, and wait while there is none (see
    /// [`seal`]). The shell routes its clients' operations through
    /// [`Machine::submit`]. Clients may create three-step groups
    /// ([`conclave_gcs::core::GroupMode::ThreeStep`]). Every daemon of a
    /// cluster must have it on, or none: a daemon without it ignores sealed
    /// operations.
    pub fn with_sealed_backbone(mut self) -> Self {
        self.core.seal_groups();
        self.sealing = Some(seal::Sealing::new(self.me));
        self
    }

    /// Optimized EVS key expiry (paper §4.3.3): at most `key_out` view keys
    /// kept per group (key-out), and a key dropped once no message sealed
    /// under it came for `time_out` microseconds of the shell's clock
    /// (time-out). Defaults: [`evs::DEFAULT_KEY_OUT`], [`evs::DEFAULT_TIME_OUT`].
    pub fn with_evs_expiry(mut self, key_out: usize, time_out: u64) -> Self {
        self.evs = evs::EvsKeys::new(self.me, key_out, time_out);
        self
    }

    /// What Optimized EVS fixing did on this daemon.
    pub fn evs_stats(&self) -> evs::EvsStats {
        self.evs.stats()
    }

    /// Operations of this daemon's clients waiting for the daemons' key
    /// (sealed backbone).
    pub fn waiting_for_key(&self) -> usize {
        self.sealing.as_ref().map_or(0, seal::Sealing::waiting)
    }

    /// This daemon's clients' operations that were void (sealed under a key
    /// that was gone when they were ordered) and sent again.
    pub fn sealed_resent(&self) -> u64 {
        self.sealing.as_ref().map_or(0, seal::Sealing::resent)
    }

    /// The daemons' key agreements this daemon completed.
    pub fn agreements(&self) -> u64 {
        self.agreements
    }

    /// Exponentiations this daemon's key agreement engine made so far, over
    /// every configuration (for benchmarks that charge them).
    pub fn agreement_exponentiations(&self) -> u64 {
        self.engine.as_ref().map_or(0, |e| e.costs().exps)
    }

    /// The epoch of the daemons' current key, if agreed.
    pub fn server_epoch(&self) -> Option<conclave_gka::Epoch> {
        match &self.key {
            ServerKey::Agreed(sv) => Some(sv.epoch),
            _ => None,
        }
    }

    /// The daemons that share the current key, if agreed (the admitted
    /// daemons of the configuration).
    pub fn keyed_daemons(&self) -> Option<Vec<DaemonId>> {
        match &self.key {
            ServerKey::Agreed(sv) => Some(sv.members.iter().filter_map(daemon_of_member).collect()),
            _ => None,
        }
    }

    /// This daemon presents its credential for configuration `id`, just
    /// installed, and the configuration its engine comes from.
    fn present(&mut self, id: ViewId, out: &mut Vec<Output>) {
        let mut payload = vec![ka_kind::CREDENTIAL];
        payload.extend_from_slice(&id.to_bytes());
        match self.came_from {
            Some(v) => {
                payload.push(1);
                payload.extend_from_slice(&v.to_bytes());
            }
            None => payload.push(0),
        }
        payload.extend_from_slice(&self.trust.credential());
        out.push(Output::Submit(Op::DaemonKa { from: self.me, payload: payload.into() }));
    }

    /// The core installed a configuration: its daemons' credentials, which
    /// each presents as it installs it, decide who takes part in the key
    /// agreement, or, alone, this daemon agrees with itself at once.
    ///
    /// Every daemon of the configuration installs it at the same point of
    /// the stream (the last state of the exchange), so every credential for
    /// it is ordered after that point, everywhere.
    fn configuration_installed(&mut self, out: &mut Vec<Output>) {
        let Some((id, daemons)) = self.core.configuration() else { return };
        if daemons == [self.me] {
            let me = Admitted { key: self.trust.signer().verifier(), came_from: self.came_from };
            self.start_agreement(id, BTreeMap::from([(self.me, me)]), out);
            return;
        }
        self.key = ServerKey::Presenting { id, daemons, heard: BTreeMap::new() };
        self.present(id, out);
    }

    /// A daemon's credential message (see [`ka_kind::CREDENTIAL`]), in
    /// stream order.
    fn credential_message(&mut self, from: DaemonId, body: &[u8], out: &mut Vec<Output>) {
        let Some((configuration, rest)) = body.split_first_chunk::<16>() else {
            tracing::warn!(daemon = from.0, "a malformed credential message; dropped");
            return;
        };
        let (came_from, credential) = match rest.split_first() {
            Some((0, credential)) => (None, credential),
            Some((1, rest)) if rest.len() >= 16 => {
                let (v, credential) = rest.split_at(16);
                (Some(ViewId::from_bytes(v.try_into().expect("16 bytes"))), credential)
            }
            _ => {
                tracing::warn!(daemon = from.0, "a malformed credential message; dropped");
                return;
            }
        };
        // Only for the configuration whose credentials are awaited: one
        // presented for an earlier configuration (ordered after the next
        // change began) answers nothing.
        let awaited = matches!(&self.key, ServerKey::Presenting { id, .. } if id.to_bytes() == *configuration);
        if awaited {
            self.credential(from, came_from, credential, out);
        }
    }

    /// Daemon `from` presented `credential` for the configuration being
    /// installed, coming from configuration `came_from`.
    fn credential(&mut self, from: DaemonId, came_from: Option<ViewId>, credential: &[u8], out: &mut Vec<Output>) {
        let ServerKey::Presenting { id, daemons, heard } = &mut self.key else { return };
        if !daemons.contains(&from) || heard.contains_key(&from) {
            return;
        }
        let verdict = if credential.len() > MAX_CREDENTIAL {
            Err(format!("a credential of {} bytes", credential.len()))
        } else {
            self.trust.verify(from, credential)
        };
        let verdict = match verdict {
            Ok(key) => Some(Admitted { key, came_from }),
            Err(why) => {
                tracing::warn!(daemon = from.0, %why, "a daemon is not admitted to the daemons' key agreement");
                None
            }
        };
        heard.insert(from, verdict);
        if heard.len() < daemons.len() {
            return;
        }
        let id = *id;
        let admitted: BTreeMap<DaemonId, Admitted> =
            std::mem::take(heard).into_iter().filter_map(|(d, a)| a.map(|a| (d, a))).collect();
        if !admitted.contains_key(&self.me) {
            tracing::error!(
                daemon = self.me.0,
                "this daemon was not admitted to the daemons' key agreement: keyed groups get no views here"
            );
            self.key = ServerKey::Refused;
            return;
        }
        self.start_agreement(id, admitted, out);
    }

    /// Starts the key agreement of configuration `id` among `admitted`.
    ///
    /// The engine follows the configurations as a client session's engine
    /// follows its group's views: the admitted daemons are the view, and
    /// each one's `prev` is the configuration it presented as the one it
    /// comes from: the last its engine followed, if it held that
    /// configuration's first key and was not renewing it when the change
    /// began (none otherwise: a newcomer). Daemons that present the same
    /// one hold the same key tree, and TGDH
    /// agrees the new key as it does for clients: a partition is a leave
    /// (one sponsor refreshes its share and broadcasts its path), a merge
    /// announces each part's tree and then refreshes one path. Every key is
    /// new: at least one sponsor brings a fresh share to every run. A
    /// daemon that restarted, or that its engine did not follow the
    /// configurations of, comes as a newcomer with a fresh share.
    fn start_agreement(&mut self, id: ViewId, admitted: BTreeMap<DaemonId, Admitted>, out: &mut Vec<Output>) {
        let mut directory = StaticDirectory::new();
        for (&d, a) in &admitted {
            directory.insert(daemon_member(d), a.key.clone());
        }
        let (me, signer) = (daemon_member(self.me), self.trust.signer());
        let engine = self.engine.get_or_insert_with(|| {
            conclave_gka::new_engine(conclave_gka::Config {
                protocol: ProtocolId::Tgdh,
                group_id: GroupId::Ristretto255,
                group: DAEMON_GROUP.to_string(),
                me,
                signer,
                directory: Arc::new(directory.clone()),
            })
        });
        let members = admitted.iter().map(|(&d, a)| ViewMember { id: daemon_member(d), prev: a.came_from }).collect();
        let view = View { id, members, cause: Cause::Network };
        let res = engine.observe(&view).and_then(|()| engine.start(&directory, &mut *self.rng));
        self.followed = Some(id);
        self.key = ServerKey::Agreeing;
        self.admitted = admitted.into_iter().map(|(d, a)| (d, a.key)).collect();
        self.confirming = None;
        self.early.clear();
        self.split_rekeyed = false;
        self.engine_result(res, out);
    }

    fn engine_result(&mut self, res: Result<Vec<EngineOutput>, conclave_gka::Error>, out: &mut Vec<Output>) {
        let outputs = match res {
            Ok(o) => o,
            Err(e) => {
                // A message of another run or configuration, or a forgery:
                // the engine changed nothing.
                tracing::debug!(error = %e, "daemons' key agreement input dropped");
                return;
            }
        };
        for o in outputs {
            match o {
                EngineOutput::Send { to: None, bytes } => {
                    let mut payload = Vec::with_capacity(1 + bytes.len());
                    payload.push(ka_kind::AGREEMENT);
                    payload.extend_from_slice(&bytes);
                    out.push(Output::Submit(Op::DaemonKa { from: self.me, payload: payload.into() }));
                }
                EngineOutput::Send { to: Some(to), .. } => {
                    // TGDH only broadcasts; the stream has no unicast.
                    tracing::warn!(%to, "daemons' key agreement asked for a unicast; dropped");
                }
                EngineOutput::Installed(sv) => self.installed(sv, out),
            }
        }
    }

    /// The engine installed a key: confirmed among the daemons of its run
    /// before it keys anything (at once for a daemon alone).
    fn installed(&mut self, sv: SecureView, out: &mut Vec<Output>) {
        tracing::debug!(epoch = ?sv.epoch, daemons = sv.members.len(), "daemons agreed a key; confirming it");
        if self.admitted.len() <= 1 {
            return self.confirmed(sv, out);
        }
        let signer = self.trust.signer();
        let (confirming, body) = confirm::Confirming::start(
            sv.epoch,
            sv.key.expose_secret(),
            self.admitted.clone(),
            self.me,
            signer.as_ref(),
        );
        self.confirming = Some((confirming, sv));
        let mut payload = Vec::with_capacity(1 + body.len());
        payload.push(ka_kind::CONFIRM);
        payload.extend_from_slice(&body);
        out.push(Output::Submit(Op::DaemonKa { from: self.me, payload: payload.into() }));
        for (from, body) in self.early.take() {
            self.confirmation(from, &body, out);
        }
    }

    /// Daemon `from`'s confirmation of a key of the daemons, in stream order.
    fn confirmation(&mut self, from: DaemonId, body: &[u8], out: &mut Vec<Output>) {
        let epoch = confirm::decode(body).map(|(epoch, ..)| epoch);
        let Some((confirming, _)) = self.confirming.as_mut().filter(|(c, _)| epoch == Some(c.epoch())) else {
            // Not (yet) confirming its run here: kept for the next key, a few
            // per daemon of the configuration.
            if self.admitted.contains_key(&from) {
                self.early.keep(from, body);
            }
            return;
        };
        match confirming.on_confirm(from, body) {
            confirm::Tally::Waiting => {}
            confirm::Tally::Confirmed => {
                let (_, sv) = self.confirming.take().expect("confirming");
                self.confirmed(sv, out);
            }
            confirm::Tally::Split(holders) => {
                // Every daemon of the run sees at least one such MAC, at this
                // same point of the stream: all agree again from scratch.
                self.confirming = None;
                self.early.clear();
                if std::mem::replace(&mut self.split_rekeyed, true) {
                    tracing::error!(
                        ?holders,
                        "the daemons hold different keys again: keyed groups get no views until the daemon group changes"
                    );
                    self.key = ServerKey::Refused;
                    self.refreshing = false;
                    return;
                }
                tracing::warn!(?holders, "the daemons hold different keys: agreeing again from scratch");
                let Some(engine) = &mut self.engine else { return };
                let res = engine.rekey(&mut *self.rng);
                self.engine_result(res, out);
            }
        }
    }

    /// A key of the daemons is confirmed: it keys views from now on.
    fn confirmed(&mut self, sv: SecureView, out: &mut Vec<Output>) {
        tracing::debug!(epoch = ?sv.epoch, daemons = sv.members.len(), "daemons confirmed their key");
        if let Some(sealing) = &mut self.sealing {
            sealing.key_agreed(sv.epoch, sv.key.expose_secret(), out);
        }
        let epoch = sv.epoch;
        self.key = ServerKey::Agreed(sv);
        self.agreements += 1;
        self.data_under_key = 0;
        self.counting.clear();
        self.allowance = std::mem::take(&mut self.counted_by);
        if self.data_limit.is_some() {
            // After anything this daemon passed on under the
            // last key (its sealed operations waiting for this
            // one included): from here its clients' keyed
            // traffic counts under this key.
            let mut payload = vec![ka_kind::COUNTING];
            payload.extend_from_slice(&epoch.to_bytes());
            out.push(Output::Submit(Op::DaemonKa { from: self.me, payload: payload.into() }));
        }
        self.lifetime_starts = true;
        self.renew_at = None;
        self.release(out);
        if std::mem::take(&mut self.refreshing) {
            // The artificial view change: every keyed group's next
            // view takes its key from the new one.
            let mut inner = Vec::new();
            self.core.refresh_keyed(&mut inner);
            self.pass(inner, out);
        }
    }

    /// A daemon key agreement message from `from`, in stream order (not a
    /// credential: [`Self::credential_message`] takes those).
    fn daemon_ka(&mut self, from: DaemonId, payload: &[u8], out: &mut Vec<Output>) {
        match payload.split_first() {
            Some((&ka_kind::RENEW, epoch)) => {
                // Only a request for the key in use counts: later ones for the
                // same key, and replays, find another epoch or a renewal under
                // way.
                if let ServerKey::Agreed(sv) = &self.key {
                    if epoch == sv.epoch.to_bytes().as_slice() {
                        tracing::debug!(daemon = from.0, "time-out: the daemons renew their key");
                        self.renew(out);
                    }
                }
            }
            Some((&ka_kind::COUNTING, epoch)) => {
                // Only for the key in use, from a daemon of this configuration.
                if let ServerKey::Agreed(sv) = &self.key {
                    let member = self.core.configuration().is_some_and(|(_, daemons)| daemons.contains(&from));
                    if member && epoch == sv.epoch.to_bytes().as_slice() {
                        self.counting.insert(from);
                    }
                }
            }
            Some((&ka_kind::CONFIRM, body)) => self.confirmation(from, body, out),
            Some((&ka_kind::AGREEMENT, message)) => {
                // Only while a run of this configuration is under way (or a
                // renewal of its key): a run of the last one, ordered after
                // the change, is over.
                if !matches!(self.key, ServerKey::Agreeing | ServerKey::Agreed(_)) {
                    return;
                }
                let Some(engine) = &mut self.engine else { return };
                let res = engine.on_message(&daemon_member(from), message, &mut *self.rng);
                self.engine_result(res, out);
            }
            _ => tracing::warn!(daemon = from.0, "a malformed daemons' key agreement message; dropped"),
        }
    }

    /// The payload bytes `op` sends to a keyed group that count under the
    /// current key: none unless its daemon passed it on after saying it
    /// holds the key (see [`KeyedDaemon::with_data_limit`]).
    fn keyed_payload(&self, op: &Op) -> Option<(ConnId, u64)> {
        let conn = op.conn().filter(|c| self.counting.contains(&c.daemon))?;
        let op = match op {
            Op::Numbered { op, .. } => op.as_ref(),
            op => op,
        };
        match op {
            Op::Multicast { group, payload, .. } | Op::Unicast { group, payload, .. } if self.core.keyed(group) => {
                Some((conn, payload.len() as u64))
            }
            _ => None,
        }
    }

    /// Counts `bytes` sent under the current key, and starts renewing it when
    /// they reach the data-out limit (at the same point of the stream at
    /// every daemon).
    fn count_data(&mut self, sent: Option<(ConnId, u64)>, out: &mut Vec<Output>) {
        let Some(limit) = self.data_limit else { return };
        let Some((conn, bytes)) = sent else { return };
        if bytes == 0 || !matches!(self.key, ServerKey::Agreed(_)) || self.refreshing {
            return;
        }
        let free = self.allowance.get_mut(&conn).map_or(0, |a| {
            let free = bytes.min(*a);
            *a -= free;
            free
        });
        let bytes = bytes - free;
        if bytes == 0 {
            return;
        }
        *self.counted_by.entry(conn).or_default() += bytes;
        self.data_under_key += bytes;
        if self.data_under_key >= limit {
            tracing::debug!(bytes = self.data_under_key, "data-out: the daemons renew their key");
            self.renew(out);
        }
    }

    /// Starts renewing the current key (at the same point of the stream at
    /// every daemon).
    fn renew(&mut self, out: &mut Vec<Output>) {
        if self.refreshing || !matches!(self.key, ServerKey::Agreed(_)) || self.core.configuration().is_none() {
            return;
        }
        let Some(engine) = &mut self.engine else { return };
        self.refreshing = true;
        self.renew_at = None;
        match engine.rekey(&mut *self.rng) {
            Ok(outputs) => self.engine_result(Ok(outputs), out),
            Err(e) => {
                tracing::warn!(error = %e, "the daemons' key cannot be renewed");
                self.refreshing = false;
            }
        }
    }

    /// Delivers everything held, keyed.
    fn release(&mut self, out: &mut Vec<Output>) {
        for (group, view, configuration) in std::mem::take(&mut self.evs_waiting) {
            let ServerKey::Agreed(sv) = &self.key else { break };
            // A view of a configuration whose key never came here has no key
            // here (see `deliver_keyed`): what is delivered in it is a notice.
            if configuration == Some(sv.epoch.view) {
                let key = view_key(&sv.key, &group, view);
                self.evs.installed(&group, view, key, self.now);
            }
        }
        for (_, deliveries) in std::mem::take(&mut self.held) {
            for (to, d, configuration) in deliveries {
                self.deliver_keyed(to, d, configuration, out);
            }
        }
    }

    /// Delivers `d`, made in `configuration`, to `to`: a view after its key;
    /// an Optimized EVS group's message fixed for the view it is delivered in.
    ///
    /// A view is keyed only under the key of the configuration it was made
    /// in. One that waited here for that key while the configuration ended
    /// (this daemon had not seen every daemon's confirmation of it, and
    /// others may have, and keyed the view under it) goes without a key: its
    /// members here install no key for it, rather than another key than
    /// their group's, and the change of the daemon group brings every group
    /// a new view.
    fn deliver_keyed(&mut self, to: Vec<ConnId>, d: Delivery, configuration: Option<ViewId>, out: &mut Vec<Output>) {
        let d = match d {
            Delivery::View { group, view } => {
                match &self.key {
                    ServerKey::Agreed(sv) if configuration == Some(sv.epoch.view) => {
                        let key = view_key(&sv.key, &group, view.id);
                        let delivery = Delivery::GroupKey { group: group.clone(), view: view.id, key };
                        out.push(Output::Deliver { to: to.clone(), delivery });
                    }
                    _ => {
                        tracing::debug!(%group, view = %view.id, "a view of an ended configuration goes without a key")
                    }
                }
                Delivery::View { group, view }
            }
            Delivery::Message { group, sender, service, view, payload } if self.evs_group(&group) => {
                let payload = self.evs.fix(&group, view, payload, self.now);
                Delivery::Message { group, sender, service, view, payload }
            }
            Delivery::Unicast { group, sender, view, payload } if self.evs_group(&group) => {
                let payload = self.evs.fix(&group, view, payload, self.now);
                Delivery::Unicast { group, sender, view, payload }
            }
            d => d,
        };
        out.push(Output::Deliver { to, delivery: d });
    }

    fn evs_group(&self, group: &GroupName) -> bool {
        self.core.mode(group) == Some(conclave_gcs::core::GroupMode::OptimizedEvs)
    }

    /// Keys view `view` of Optimized EVS group `group` in the store, under
    /// the daemons' current key (as its members get it).
    fn evs_view(&mut self, group: GroupName, view: ViewId) {
        match &self.key {
            ServerKey::Agreed(sv) => {
                let key = view_key(&sv.key, &group, view);
                self.evs.installed(&group, view, key, self.now);
            }
            // Its deliveries wait for the key too; keyed with them, and
            // marked if that is a later configuration's key.
            _ => {
                let configuration = self.core.configuration().map(|(id, _)| id);
                self.evs_waiting.push((group, view, configuration));
            }
        }
    }

    /// Passes the core's outputs on, after keying the Optimized EVS views
    /// it installed making them (so a message delivered in one finds its key).
    fn pass(&mut self, inner: Vec<Output>, out: &mut Vec<Output>) {
        for (group, view) in self.core.take_evs_views() {
            self.evs_view(group, view);
        }
        for o in inner {
            self.route(o, out);
        }
    }

    /// Passes one of the core's outputs on: a keyed group's view gets its
    /// key, or waits with everything after it until there is one.
    fn route(&mut self, o: Output, out: &mut Vec<Output>) {
        let (to, delivery) = match o {
            Output::Deliver { to, delivery } => (to, delivery),
            // The core submits its clients' held operations again after an
            // interrupted exchange: sealed like any other.
            Output::Submit(op) if op.conn().is_some() => return self.submit_op(op, out),
            o => return out.push(o),
        };
        let group = match &delivery {
            Delivery::View { group, .. }
            | Delivery::ViewChangeBegins { group }
            | Delivery::Left { group }
            | Delivery::Message { group, .. }
            | Delivery::Unicast { group, .. }
            | Delivery::GroupKey { group, .. } => Some(group.clone()),
            Delivery::Welcome { .. } | Delivery::Error { .. } => None,
        };
        let Some(group) = group else {
            out.push(Output::Deliver { to, delivery });
            return;
        };
        let waiting = self.held.get(&group).is_some_and(|h| !h.is_empty());
        let keyed = self.core.keyed(&group);
        let keyed_view = keyed && matches!(delivery, Delivery::View { .. });
        let configuration = self.core.configuration_id();
        if waiting || (keyed_view && !matches!(self.key, ServerKey::Agreed(_))) {
            self.held.entry(group).or_default().push_back((to, delivery, configuration));
        } else if keyed {
            self.deliver_keyed(to, delivery, configuration, out);
        } else {
            out.push(Output::Deliver { to, delivery });
        }
    }
}

impl Machine for KeyedDaemon {
    fn poll_timeout(&self) -> Option<u64> {
        self.renew_at
    }

    fn handle_timeout(&mut self, now: u64, out: &mut Vec<Output>) {
        let (Some(at), ServerKey::Agreed(sv)) = (self.renew_at, &self.key) else { return };
        if now < at || self.refreshing {
            return;
        }
        self.renew_at = None;
        let mut payload = vec![ka_kind::RENEW];
        payload.extend_from_slice(&sv.epoch.to_bytes());
        out.push(Output::Submit(Op::DaemonKa { from: self.me, payload: payload.into() }));
    }

    fn submit(&mut self, op: Op, _now: u64, out: &mut Vec<Output>) {
        self.submit_op(op, out);
    }

    fn routes_submissions(&self) -> bool {
        self.sealing.is_some()
    }

    fn handle(&mut self, op: Op, now: u64, out: &mut Vec<Output>) {
        self.now = self.now.max(now);
        self.handle_op(op, out);
        if self.now.saturating_sub(self.evs_swept) >= EVS_SWEEP && !self.evs.is_empty() {
            self.evs_swept = self.now;
            let core = &self.core;
            self.evs.expire(self.now, |g| core.mode(g).is_some());
        }
        // A key agreed since the last call is used from now on.
        if std::mem::take(&mut self.lifetime_starts) {
            self.renew_at = self.key_lifetime.map(|l| now.saturating_add(l));
        }
    }

    fn handle_joins(&mut self, ops: Vec<Op>, now: u64, out: &mut Vec<Output>) {
        // Only plain joins, and only with no change of the daemon group
        // under way, go through the core together: anything else takes the
        // way every operation takes.
        if self.core.exchanging() || !ops.iter().all(|op| matches!(op, Op::Join { .. })) {
            for op in ops {
                self.handle(op, now, out);
            }
            return;
        }
        self.now = self.now.max(now);
        let mut inner = Vec::new();
        self.core.handle_joins(ops, &mut inner);
        self.pass(inner, out);
    }

    fn core(&self) -> &Core {
        &self.core
    }
}

impl KeyedDaemon {
    /// One of this daemon's clients' operations for the backbone: sealed if
    /// the backbone is.
    fn submit_op(&mut self, op: Op, out: &mut Vec<Output>) {
        match &mut self.sealing {
            Some(sealing) => sealing.submit(op, out),
            None => out.push(Output::Submit(op)),
        }
    }

    fn handle_op(&mut self, op: Op, out: &mut Vec<Output>) {
        let op = match op {
            Op::DaemonKa { from, payload } if payload.first() == Some(&ka_kind::SEALED) => {
                // Decided at every daemon alike, exchange or not (see `seal`).
                let Some(sealing) = &mut self.sealing else {
                    tracing::warn!(daemon = from.0, "a sealed operation, and this daemon's backbone is not sealed");
                    return;
                };
                match sealing.open(from, &payload[1..], out) {
                    seal::Opened::Op(op) => op,
                    seal::Opened::Void => return,
                    seal::Opened::Refused(why) => {
                        tracing::warn!(daemon = from.0, why, "a sealed operation dropped");
                        return;
                    }
                }
            }
            Op::DaemonKa { from, payload } => {
                // Only the current configuration's run takes it: a message
                // ordered during an exchange is of a run that ended.
                if payload.first() == Some(&ka_kind::CREDENTIAL) {
                    self.credential_message(from, &payload[1..], out);
                } else if self.core.configuration().is_some() {
                    self.daemon_ka(from, &payload, out);
                }
                return;
            }
            Op::Daemons { .. } => {
                // Daemons that present the same configuration must hold the
                // same tree: one that had not installed its first key, or
                // had begun to renew it, might not (its run may have ended
                // elsewhere), and comes as a newcomer.
                let settled = matches!(&self.key, ServerKey::Agreed(sv) if sv.epoch.run == 0) && !self.refreshing;
                self.came_from = if settled { self.followed } else { None };
                // Views of the new configuration wait for its key, a new one
                // in any case.
                self.key = ServerKey::Changing;
                self.confirming = None;
                self.early.clear();
                if let Some(sealing) = &mut self.sealing {
                    sealing.configuration_changed();
                }
                self.refreshing = false;
                self.renew_at = None;
                // Data-out allowances hold within a configuration only: the
                // daemons of the next one counted different histories.
                self.counted_by.clear();
                self.allowance.clear();
                op
            }
            op => op,
        };
        let sent = self.keyed_payload(&op);
        let was_exchanging = self.core.exchanging();
        let mut inner = Vec::new();
        self.core.handle(op, &mut inner);
        self.pass(inner, out);
        if was_exchanging && !self.core.exchanging() {
            self.configuration_installed(out);
        }
        self.count_data(sent, out);
    }
}

impl DaemonTrust for Box<dyn DaemonTrust> {
    fn signer(&self) -> Arc<dyn Signer> {
        (**self).signer()
    }

    fn credential(&self) -> Vec<u8> {
        (**self).credential()
    }

    fn verify(&self, daemon: DaemonId, credential: &[u8]) -> Result<Arc<dyn Verifier>, String> {
        (**self).verify(daemon, credential)
    }
}
