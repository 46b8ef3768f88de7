//! The session core: everything a secure session decides, with no I/O.
//!
//! [`SessionCore`] is a deterministic state machine in the quinn-proto
//! style. Its inputs are the daemon's deliveries
//! ([`SessionCore::handle_delivery`]), the application's commands
//! ([`SessionCore::join`], [`SessionCore::send`], [`SessionCore::leave`]) and
//! timer expiries ([`SessionCore::handle_timeout`]), each with `now` passed
//! in. Its outputs are polled: requests for the daemon
//! ([`SessionCore::poll_transmit`]), application events
//! ([`SessionCore::poll_event`]) and the next deadline
//! ([`SessionCore::poll_timeout`]). Randomness comes from the RNG it is given
//! and wall-clock time (for certificate validity) from its [`WallClock`]; it
//! reads neither a clock nor the operating system's randomness itself, and
//! spawns nothing. The tokio [`crate::Session`] is a thin shell around it;
//! tests and the simulator drive it directly.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use conclave_gcs::core::{ConnId, Delivery as Event, ErrorCode, GroupMode, Op, Service, ViewKey};
use conclave_gcs::{GroupName, MemberId, MemberMap, MemberSet, Members, View};
use conclave_gka::keyed::KeyedEngine;
use conclave_gka::suite::{Signer, Verifier};
use conclave_gka::{Config, Directory, Engine, Epoch, Output, ProtocolId, SecureView, StaticDirectory, ViewId};
use conclave_integrated::evs::{self as envelope, Envelope, NoticeReason, Writer};
use rand_core::CryptoRngCore;
use sha2::{Digest, Sha256};

use crate::confirm::{confirm_signed, policy_signed, timeout_signed, verdict_signed, Confirmer, ListDigest};
use crate::data::{DataError, DataHeader, EpochKeys, BUNDLE_ENTRY_OVERHEAD, TAG_LEN};
use crate::payload::{
    cert_body, decode_policy, split_cert, split_timeout, timeout_body, timeout_names, timeout_names_part, Frame,
    TrustKind,
};
use crate::trust::{Authority, Identity, Refusal};
use crate::{Policy, RejectReason, SecureEvent, SecureViewInfo, SessionError};

/// How long a view waits by default for certificates before the members
/// that presented none are refused — provisionally: a certificate that comes
/// later readmits its member with one rekey. Honest members present theirs
/// as soon as the view arrives, so one second is plenty, and it bounds what a
/// joiner without a certificate can hold up.
pub const DEFAULT_CERT_TIMEOUT: Duration = Duration::from_secs(1);

/// Certified mode: who this member is and whom it trusts.
struct Certified {
    identity: Identity,
    authority: Arc<Authority>,
    timeout: Duration,
    /// Wall-clock time for certificate validity (injected).
    clock: Arc<dyn WallClock>,
}

/// A member's standing in the current view (certified mode).
///
/// Only a certificate message that proves its sender (a chain to this
/// member's authority, the sender's name, a proof over this view) yields a
/// verdict, `Accepted`. A message that fails any check proves nothing about
/// who sent it — a compromised link can deliver anything under any name —
/// so it yields no verdict, only a *doubt* kept for reporting. Members
/// without a verdict are refused by the first signed timeout notice of an
/// accepted member, which every member sees at the same point of the agreed
/// stream; such a refusal is provisional (a valid certificate later readmits
/// its member with one rekey).
#[derive(Clone)]
enum Verdict {
    Accepted(Arc<dyn Verifier>),
    /// Refused by a timeout notice; the reason is this member's doubt about
    /// the certificate it saw, or `NoCertificate` (it is for reporting only).
    Refused(Refusal),
}

/// Largest number of messages held for a view whose key (or, certified, whose
/// verdicts) are not there yet: data that came before its key, and key
/// agreement messages that came while the view waits for certificates.
const MAX_EARLY: usize = 4096;

/// What a three-step group's secure views show for a key fingerprint: it has
/// no key.
pub const THREE_STEP_FINGERPRINT: &str = "none (three-step)";

/// Earlier views of a group a member remembers, so that a message that
/// crossed up to this many view changes is dropped quietly (its sender sends
/// it again) rather than reported as from another view.
const EARLIER_VIEWS: usize = 64;
/// Sends to open groups a member remembers, for reporting refusals.
const MAX_OPEN_PENDING: usize = 64;
/// Optimized EVS: the daemon's view keys a member keeps (see
/// `GroupState::evs_keys`).
const EVS_KEYS: usize = 3;
/// Largest number of bytes so held per group, from all senders together.
pub const MAX_HELD_BYTES: usize = 8 << 20;
/// Largest number of bytes so held per group from one sender, so that one
/// member (certified or not) cannot take the whole budget.
pub const MAX_HELD_BYTES_PER_SENDER: usize = 2 << 20;

/// Most of a member's own data bundles on their way back to it in one group
/// ([`crate::data`], "Bundles"), when what waited is more than one bundle
/// takes. Four keep the daemon busy while a bundle travels.
const BUNDLES_IN_FLIGHT: usize = 4;
/// Most bytes of messages in one bundle (a single larger message goes
/// alone): four in flight stay well within what a receiver holds per sender
/// before a key is confirmed ([`MAX_HELD_BYTES_PER_SENDER`]).
const BUNDLE_BYTES: usize = 256 << 10;
/// The most a data payload adds to its messages besides their bundle
/// lengths: frame tag, header (at most 1 + 128 + 20 + 16 + 1 + 255 + 8), their
/// count, AEAD tag, signature (at most RSA-2048's) and its length.
const LAYERED_OVERHEAD: usize = 1 + 429 + 4 + TAG_LEN + 256 + 2;
/// The same for an Optimized EVS envelope: its header and AEAD tag, then the
/// sender, origin, count, signature and the bundle's count inside.
const EVS_OVERHEAD: usize = envelope::MAX_HEADER + envelope::AEAD_TAG_LEN + 1 + 255 + 16 + 8 + 2 + 256 + 4;

/// Messages held for later, bounded in count, in bytes and per sender.
#[derive(Default)]
struct Held {
    /// Sender, the daemon view it was delivered in, payload.
    items: Vec<(MemberId, ViewId, Bytes)>,
    bytes: usize,
    per_sender: BTreeMap<MemberId, usize>,
    /// Messages dropped because a bound was reached, since the group was joined.
    dropped: u64,
}

impl Held {
    /// Holds `payload` from `sender` if the bounds allow; says whether it did.
    fn push(&mut self, sender: MemberId, view: ViewId, payload: Bytes) -> bool {
        let mine = self.per_sender.get(&sender).copied().unwrap_or(0);
        if self.items.len() >= MAX_EARLY
            || self.bytes + payload.len() > MAX_HELD_BYTES
            || mine + payload.len() > MAX_HELD_BYTES_PER_SENDER
        {
            self.dropped += 1;
            tracing::warn!(%sender, len = payload.len(), held = self.bytes, "held-message budget exhausted; message dropped");
            return false;
        }
        self.bytes += payload.len();
        self.per_sender.insert(sender.clone(), mine + payload.len());
        self.items.push((sender, view, payload));
        true
    }

    fn take(&mut self) -> Vec<(MemberId, ViewId, Bytes)> {
        self.bytes = 0;
        self.per_sender.clear();
        std::mem::take(&mut self.items)
    }

    fn clear(&mut self) {
        self.take();
    }
}

/// Key confirmations received for the current run: those accepted (their
/// MAC matches this member's key, or their signature was checked), and the
/// pending ones, at most [`MAX_CONFIRM_CANDIDATES`] per sender, settled when
/// every member's is in. Only pending confirmations whose MAC does not match
/// have their signatures checked, in one batch (see [`crate::confirm`] for
/// why that suffices).
#[derive(Default)]
struct Confirmations {
    /// The run they confirm: confirmations of another are forgotten when
    /// the first of a new one comes (interval rekeying: two rekeys may follow
    /// each other without a view between them).
    epoch: Option<Epoch>,
    accepted: BTreeMap<MemberId, [u8; 32]>,
    /// The accepted senders whose MAC did not match this member's key
    /// (accepted on their signature, in [`Confirmations::settle`]): every
    /// other accepted MAC was matched against the key as it came in, and is
    /// not computed again when the run is decided.
    unmatched: BTreeSet<MemberId>,
    pending: BTreeMap<MemberId, Vec<Unchecked>>,
}

/// Confirmations kept per sender and run before they can be settled: the
/// sender's own and one forgery in its name; more are dropped (a sender
/// sends one per run, so the real one is among the first two unless a link
/// forges ahead of it twice, and then the member waits for the next run).
const MAX_CONFIRM_CANDIDATES: usize = 2;

/// A confirmation whose signature is not checked yet.
struct Unchecked {
    mac: [u8; 32],
    signature: Vec<u8>,
    /// What the sender signed.
    signed: Vec<u8>,
    /// The sender's identity key.
    key: Arc<dyn Verifier>,
}

impl Unchecked {
    fn verify(&self) -> bool {
        self.key.verify(&self.signed, &self.signature).is_ok()
    }
}

impl Confirmations {
    /// Settles every pending confirmation against this member's key: a
    /// matching MAC is accepted as it is; for a sender with none, the
    /// signatures are checked (together, then one by one if the batch
    /// fails), the first valid one is accepted (it shows another key), and
    /// the forged ones are dropped and returned.
    fn settle(&mut self, confirmer: &Confirmer) -> Vec<MemberId> {
        let mut to_check = Vec::new();
        for (sender, candidates) in std::mem::take(&mut self.pending) {
            match candidates.iter().find(|u| confirmer.matches(&sender, &u.mac)) {
                Some(u) => {
                    self.accepted.insert(sender, u.mac);
                }
                None => to_check.extend(candidates.into_iter().map(|u| (sender.clone(), u))),
            }
        }
        let items: Vec<(&dyn Verifier, &[u8], &[u8])> =
            to_check.iter().map(|(_, u)| (u.key.as_ref(), u.signed.as_slice(), u.signature.as_slice())).collect();
        let all_valid = items.is_empty() || conclave_gka::suite::verify_batch(&items).is_ok();
        let mut forged = Vec::new();
        for (sender, u) in to_check {
            if self.accepted.contains_key(&sender) {
                continue; // an earlier candidate of this sender's was valid
            }
            if all_valid || u.verify() {
                self.accepted.insert(sender.clone(), u.mac);
                self.unmatched.insert(sender);
            } else {
                forged.push(sender);
            }
        }
        forged
    }

    fn has(&self, member: &MemberId) -> bool {
        self.accepted.contains_key(member) || self.pending.contains_key(member)
    }

    fn clear(&mut self) {
        self.epoch = None;
        self.accepted.clear();
        self.unmatched.clear();
        self.pending.clear();
    }

    /// Makes these the confirmations of `epoch`.
    fn of(&mut self, epoch: Epoch) -> &mut Self {
        if self.epoch != Some(epoch) {
            self.clear();
            self.epoch = Some(epoch);
        }
        self
    }
}

/// A key installed by the engine, waiting for the collector's verdict on
/// every member's confirmation (see [`crate::confirm`]).
struct Confirming {
    view: SecureView,
    confirmer: Confirmer,
    /// This member's own MAC.
    own_mac: [u8; 32],
    /// This member's confirmation as sent (`tag ‖ epoch ‖ MAC ‖ signature`).
    frame: Bytes,
    /// The collector it was sent to, if it was: with interval rekeying, a
    /// view that takes that collector makes the member send it again, to
    /// the next.
    sent_to: Option<MemberId>,
    /// The view in which this member, as collector, last multicast its
    /// verdict: a verdict counts only in the view it was sent in, so a view
    /// change before the members decided makes the collector send it again.
    verdict_sent: Option<ViewId>,
}

impl Confirming {
    /// The collector: the first of the key's members still in the view
    /// (with interval rekeying, some may have left; otherwise all are in).
    fn collector<'a>(&'a self, interval: bool, in_view: &MemberSet) -> Option<&'a MemberId> {
        self.view.members.iter().find(|m| !interval || in_view.contains(*m))
    }
}

/// A request for the daemon, as [`SessionCore::poll_transmit`] hands it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transmit {
    /// Join the group in the mode of its policy ([`Policy::mode`]).
    Join {
        /// The group.
        group: GroupName,
        /// Who protects its traffic.
        mode: GroupMode,
        /// Whether non-members may send to it, if this join creates it.
        open: bool,
    },
    /// Leave the group.
    Leave(GroupName),
    /// An agreed multicast to the group.
    Multicast(GroupName, Bytes),
    /// A unicast to one member of the group.
    Unicast(GroupName, MemberId, Bytes),
}

impl Transmit {
    /// The daemon operation that carries this request on connection `conn`
    /// (what a daemon in the same process, real or simulated, is handed).
    pub fn into_op(self, conn: ConnId) -> Op {
        match self {
            Transmit::Join { group, mode, open } => Op::Join { conn, group, open, mode },
            Transmit::Leave(group) => Op::Leave { conn, group },
            Transmit::Multicast(group, payload) => Op::Multicast { conn, group, service: Service::Agreed, payload },
            Transmit::Unicast(group, to, payload) => Op::Unicast { conn, group, to, payload },
        }
    }
}

/// Wall-clock time, for what certificates need (validity periods). Injected,
/// like rustls's `TimeProvider`, so that a simulation controls it.
pub trait WallClock: Send + Sync {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// Certified mode: the admission of the current view's members, a small
/// state machine of its own beside [`Phase`].
enum Admission {
    /// Every member of the view has a verdict (or the group is not
    /// certified): key agreement runs among the accepted ones.
    Decided,
    /// The view waits for verdicts. At `deadline` (until it passes) an
    /// accepted member names those that presented nothing.
    Waiting { deadline: Option<Instant> },
}

impl Admission {
    fn is_waiting(&self) -> bool {
        matches!(self, Admission::Waiting { .. })
    }

    fn deadline(&self) -> Option<Instant> {
        match self {
            Admission::Waiting { deadline } => *deadline,
            Admission::Decided => None,
        }
    }
}

/// Where a group's key stands in the current view: one state at a time.
enum Phase {
    /// Key agreement runs (or waits for the view's verdicts, see [`Admission`]).
    Agreeing,
    /// The engine installed a key; every member's confirmation is awaited.
    Confirming(Box<Confirming>),
    /// The key is confirmed: data flows under it.
    Secure(EpochKeys),
    /// This member takes no part in key agreement in the current view
    /// (refused, or told that it was).
    Aside,
    /// Taken out for a policy mismatch: every input is ignored, for good.
    Ousted,
    /// A three-step group's view: no key; the daemons protect the traffic.
    Carried,
}

impl Phase {
    fn keys(&self) -> Option<&EpochKeys> {
        match self {
            Phase::Secure(k) => Some(k),
            _ => None,
        }
    }

    fn confirming(&self) -> Option<&Confirming> {
        match self {
            Phase::Confirming(c) => Some(c),
            _ => None,
        }
    }

    fn is_aside(&self) -> bool {
        matches!(self, Phase::Aside)
    }
}

struct GroupState {
    policy: Policy,
    engine: Box<dyn Engine>,
    /// The daemon's current view of the group.
    view: Option<View>,
    /// The digest of `view`'s member list, for key confirmation, taken when
    /// a run starts in the view ([`GroupState::digest_view`]); none in
    /// groups the daemons key, which confirm nothing, and for a view
    /// superseded when it came.
    view_digest: Option<ListDigest>,
    /// The members of `view`, to look a sender up in O(1): every member
    /// checks every confirmation's sender, n per run, and a scan of the
    /// view's list made that O(n²) per member.
    in_view: MemberSet,
    /// The views of the group this member was in before the current one,
    /// latest last (at most [`EARLIER_VIEWS`]): a message sent in one of
    /// them crossed a view change. View ids carry no order, so this is how
    /// an earlier view is told from another component's or lifetime's.
    earlier_views: VecDeque<ViewId>,
    /// When the first view not yet secured arrived.
    rekey_since: Option<Instant>,
    /// Where the group's key stands in the current view.
    phase: Phase,
    members: Members,
    next_seq: u64,
    /// Plaintexts waiting for a key, in send order.
    queue: VecDeque<Vec<u8>>,
    /// Own bundles sent whose delivery back to us is pending: (epoch, seq,
    /// their messages, the payload as sent). Epochs never decrease from front
    /// to back: each is the key's when it was sent. At most
    /// [`BUNDLES_IN_FLIGHT`].
    in_flight: VecDeque<(Epoch, u64, Vec<Vec<u8>>, Bytes)>,
    /// Own messages that must go out again under the next key, in send order.
    resend: VecDeque<Vec<u8>>,
    /// Data messages of the current epoch that came before its key was confirmed.
    early: Held,
    /// Key confirmations received for the current run.
    confirms: Confirmations,
    /// Next acceptable sequence number per sender, in the current epoch.
    next_from: BTreeMap<MemberId, u64>,
    /// Whether this member has ever installed a key in the group.
    established: bool,
    /// Asked to leave: no more sends. Until the leave takes effect the
    /// member still takes part in key agreement (so nobody waits for it) and
    /// receives what is sent in its views.
    leaving: bool,
    /// Certified mode: each member's standing in the current view.
    verdicts: BTreeMap<MemberId, Verdict>,
    /// Certified mode: why a certificate message in a member's name did not
    /// verify in the current view. It yields no verdict (see [`Verdict`]).
    doubts: BTreeMap<MemberId, Refusal>,
    /// Certified mode: whether the current view's key agreement waits for verdicts.
    admission: Admission,
    /// Key agreement messages that came while the view was held.
    held_ka: Held,
    /// The run of the current view that the engine runs (0 for the view's own;
    /// one more at each rekey or readmission, decided by the agreed stream).
    run: u32,
    /// Members readmitted in the current view (see `readmit`).
    readmissions: u32,
    /// Interval rekeying: when this member, the view's leader, next gives
    /// the engine the interval's tick.
    next_tick: Option<Instant>,
    /// Interval rekeying: a tick came while the view waited for verdicts;
    /// it is given as soon as the engine runs the view.
    tick_due: bool,
    /// Interval rekeying: the waiting members last reported
    /// ([`SecureEvent::Waiting`]).
    waiting_reported: Vec<MemberId>,
    /// Optimized EVS: the keys the daemon gave for the latest views (at
    /// most [`EVS_KEYS`], latest last): data of a view whose key was not
    /// confirmed before the next view came is still read under it.
    evs_keys: VecDeque<(ViewId, ViewKey)>,
    /// Optimized EVS: this member's count of messages sealed under the key
    /// of a view (never reset within a view: a rekey of the same view keeps
    /// its key, and a count must not repeat under one key).
    evs_seq: Option<(ViewId, u64)>,
    /// Optimized EVS: what each sender's messages have been so far (replays).
    evs_seen: MemberMap<crate::evs::Seen>,
    /// Optimized EVS: messages delivered that a daemon had re-encrypted
    /// (they crossed a view change).
    evs_reencrypted: u64,
    /// Optimized EVS: this member's envelopes sent and not yet back (as
    /// themselves, re-encrypted, or as a daemon's notice), at most
    /// [`BUNDLES_IN_FLIGHT`]: what it sends meanwhile waits for the next
    /// bundle. Set to zero at every view, so that an envelope the daemons
    /// never deliver back cannot hold sends for longer than its view.
    evs_in_flight: usize,
    #[cfg(feature = "test-hooks")]
    captured: Vec<(MemberId, Bytes)>,
    /// Test hook: an insider's tampering with its own key agreement messages.
    #[cfg(feature = "test-hooks")]
    tamper: Option<Tamper>,
}

/// Whether the daemons key `mode`'s groups (Integrated VS, Optimized EVS):
/// then the members confirm nothing, as the daemons confirm among
/// themselves the key every view's key is derived from (see
/// `crate::confirm`).
fn daemon_keyed(mode: GroupMode) -> bool {
    matches!(mode, GroupMode::Keyed | GroupMode::OptimizedEvs)
}

/// Optimized EVS: the key the daemon gave for view `view`, if `keys` (a
/// group's `evs_keys`) still has it.
fn evs_key(keys: &VecDeque<(ViewId, ViewKey)>, view: ViewId) -> Option<&ViewKey> {
    keys.iter().find(|(v, _)| *v == view).map(|(_, k)| k)
}

impl GroupState {
    /// Enters the daemon's next view of the group; returns the one left.
    fn enter_view(&mut self, view: View) -> Option<View> {
        match &self.view {
            Some(old) => update_members(&mut self.in_view, old, &view),
            None => self.in_view.extend(view.ids().cloned()),
        }
        // Optimized EVS: replay records of members gone from the view go
        // (one that comes back starts from new origins).
        let in_view = &self.in_view;
        self.evs_seen.retain(|m, _| in_view.contains(m));
        self.evs_in_flight = 0;
        self.view_digest = None;
        let previous = self.view.replace(view);
        if let Some(p) = &previous {
            if self.earlier_views.len() == EARLIER_VIEWS {
                self.earlier_views.pop_front();
            }
            self.earlier_views.push_back(p.id);
        }
        previous
    }

    /// Takes the current view's digest for key confirmation (see
    /// [`ListDigest`]), in a group whose members confirm their keys: when a
    /// run starts in the view, right after its names were read. A view
    /// already superseded when it came starts none and is not digested.
    fn digest_view(&mut self) {
        if !daemon_keyed(self.policy.mode) {
            self.view_digest = self.view.as_ref().map(|v| ListDigest::of(v.members.iter().map(|m| &m.id)));
        }
    }

    /// The digest of `members`, a key's member list: a key of the whole
    /// view (every protocol's but an interval's between views) has the
    /// view's own list, digested as it came.
    fn members_digest(&self, members: &Members) -> ListDigest {
        match (&self.view, self.view_digest) {
            (Some(view), Some(digest)) if members.is_list_of(view) => digest,
            _ => ListDigest::of(members.iter()),
        }
    }

    /// A new view starts its own admission and its run 0: what the last
    /// view decided (readmissions, doubts, held key agreement) is dropped.
    fn new_view_admission(&mut self) {
        self.readmissions = 0;
        self.held_ka.clear();
        self.doubts.clear();
        self.admission = Admission::Decided;
        self.run = 0;
    }
}

/// Makes `set`, the members of view `old`, those of view `new`, touching
/// only what changed when the two list their common members in the same
/// order (views do; a view read as changes to the last one shares the
/// last one's names, as names read through a cache do: the same
/// allocations, which `==` on a `MemberId` compares by address before it
/// reads the text). Walking both lists, a member of
/// `old` not matched in order is removed and a member of `new` not matched
/// is added, removals first: whatever the order, the set ends as `new`'s.
fn update_members(set: &mut MemberSet, old: &View, new: &View) {
    let (mut removed, mut added) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < old.members.len() && j < new.members.len() {
        let (o, n) = (&old.members[i], &new.members[j]);
        if o.id == n.id {
            i += 1;
            j += 1;
        } else if n.prev != Some(old.id) {
            added.push(&n.id);
            j += 1;
        } else {
            removed.push(&o.id);
            i += 1;
        }
    }
    removed.extend(old.members[i..].iter().map(|m| &m.id));
    added.extend(new.members[j..].iter().map(|m| &m.id));
    for m in removed {
        set.remove(m);
    }
    set.extend(added.into_iter().cloned());
}

/// A key agreement message as [`Engine::preverify`] takes it: sender, the
/// view it was delivered in, the engine's bytes.
type KeyAgreementIn<'a> = (&'a MemberId, ViewId, &'a [u8]);

/// Test hook: see [`SessionCore::tamper_key_agreement`].
#[cfg(feature = "test-hooks")]
type Rewrite = Box<dyn FnMut(u8, &mut Vec<u8>) -> bool + Send>;

/// Test hook: rewrites this member's outgoing key agreement bodies (given the
/// round), re-signed so that they verify; its own engine still sees the
/// original, as an insider that lies to the others would arrange.
#[cfg(feature = "test-hooks")]
struct Tamper {
    rewrite: Rewrite,
    /// Tampered bytes as sent → the original, for when they come back.
    sent: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// One member's secure groups over one daemon connection, with no I/O (see
/// the module doc).
pub struct SessionCore {
    me: MemberId,
    signer: Arc<dyn Signer>,
    directory: Arc<dyn Directory>,
    certified: Option<Certified>,
    transmits: VecDeque<Transmit>,
    rng: Box<dyn CryptoRngCore + Send>,
    /// The `now` of the input being handled.
    now: Instant,
    groups: BTreeMap<GroupName, GroupState>,
    events: VecDeque<SecureEvent>,
    max_payload: usize,
    /// The group whose key agreement and confirmation messages are not sent
    /// while the delivery being handled is: a later view of it has already
    /// arrived (see [`SessionCore::handle_deliveries`]).
    muted: Option<GroupName>,
    /// Sends to open groups ([`SessionCore::send_open`]) the daemon has not
    /// refused yet, by group: its refusals are reported, not taken for key
    /// agreement traffic racing a leave (the last [`MAX_OPEN_PENDING`]
    /// sends kept).
    open_sends: VecDeque<GroupName>,
}

impl std::fmt::Debug for SessionCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionCore").field("me", &self.me).field("groups", &self.groups.keys()).finish()
    }
}

impl SessionCore {
    /// The core of member `me` (the name its connection has): `identity`
    /// signs its messages, `directory` says whose messages to trust, `rng`
    /// is its only source of randomness, and `now` is the present.
    pub fn new(
        me: MemberId,
        identity: Arc<dyn Signer>,
        directory: Arc<dyn Directory>,
        rng: Box<dyn CryptoRngCore + Send>,
        now: Instant,
    ) -> SessionCore {
        SessionCore {
            me,
            signer: identity,
            directory,
            certified: None,
            transmits: VecDeque::new(),
            muted: None,
            open_sends: VecDeque::new(),
            rng,
            now,
            groups: BTreeMap::new(),
            events: VecDeque::new(),
            max_payload: conclave_gcs::wire::DEFAULT_MAX_PAYLOAD,
        }
    }

    /// The core of a member in *certified mode*: it presents `identity`'s
    /// certificate in every view that needs it, and takes part in key
    /// agreement only with members whose certificates `authority` accepts
    /// (see the crate doc, "Certified identities") at the time `clock` tells.
    pub fn new_certified(
        me: MemberId,
        identity: Identity,
        authority: Arc<Authority>,
        clock: Arc<dyn WallClock>,
        rng: Box<dyn CryptoRngCore + Send>,
        now: Instant,
    ) -> SessionCore {
        let signer = identity.signer();
        let mut s = Self::new(me, signer, Arc::new(conclave_gka::StaticDirectory::new()), rng, now);
        s.certified = Some(Certified { identity, authority, timeout: DEFAULT_CERT_TIMEOUT, clock });
        s
    }

    /// Certified mode: how long a view waits for a member's certificate
    /// before it is refused for presenting none (default 10 s).
    pub fn set_certificate_timeout(&mut self, timeout: Duration) {
        if let Some(c) = self.certified.as_mut() {
            c.timeout = timeout;
        }
    }

    /// This member.
    pub fn me(&self) -> &MemberId {
        &self.me
    }

    /// Joins `group` with `policy`. The group's first member fixes the
    /// policy; a joiner whose policy differs gets
    /// [`SecureEvent::PolicyMismatch`] and is taken out of the group.
    pub fn join(&mut self, now: Instant, group: &str, policy: Policy) -> Result<(), SessionError> {
        self.now = now;
        let name = GroupName::new(group)?;
        match self.groups.get(&name) {
            Some(g) if g.leaving => return Err(SessionError::StillLeaving(name)),
            Some(_) => return Err(SessionError::AlreadyJoined(name)),
            None => {}
        }
        if policy.open && policy.mode != GroupMode::ThreeStep {
            return Err(SessionError::Unsupported("open groups are three-step only: a non-member holds no group key"));
        }
        // Certified, every run is started with its admitted members' keys
        // (`Engine::start`); the engine's own directory serves no run.
        let directory = match &self.certified {
            Some(_) => Arc::new(StaticDirectory::new()) as Arc<dyn Directory>,
            None => self.directory.clone(),
        };
        let config = Config {
            protocol: policy.protocol,
            group_id: policy.group_id,
            group: engine_context(&name, &policy),
            me: self.me.clone(),
            signer: self.signer.clone(),
            directory,
        };
        let engine = match (policy.mode, policy.interval) {
            // A three-step group has no key: its engine is never driven.
            (GroupMode::Keyed | GroupMode::ThreeStep | GroupMode::OptimizedEvs, _) => {
                Box::new(KeyedEngine::new(config.me, config.group, config.directory))
            }
            (GroupMode::Members, None) => conclave_gka::new_engine(config),
            (GroupMode::Members, Some(interval)) => {
                conclave_gka::new_interval_engine(config, interval.algorithm, interval.rekey_on_leave)
                    .ok_or(SessionError::Unsupported("interval rekeying with another protocol than TGDH"))?
            }
        };
        self.groups.insert(
            name.clone(),
            GroupState {
                policy,
                engine,
                view: None,
                view_digest: None,
                in_view: MemberSet::default(),
                earlier_views: VecDeque::new(),
                rekey_since: None,
                phase: Phase::Agreeing,
                members: Members::default(),
                next_seq: 0,
                queue: VecDeque::new(),
                in_flight: VecDeque::new(),
                resend: VecDeque::new(),
                early: Held::default(),
                confirms: Confirmations::default(),
                next_from: BTreeMap::new(),
                established: false,
                leaving: false,
                verdicts: BTreeMap::new(),
                doubts: BTreeMap::new(),
                admission: Admission::Decided,
                held_ka: Held::default(),
                run: 0,
                readmissions: 0,
                next_tick: None,
                tick_due: false,
                waiting_reported: Vec::new(),
                evs_keys: VecDeque::new(),
                evs_seq: None,
                evs_seen: MemberMap::default(),
                evs_reencrypted: 0,
                evs_in_flight: 0,
                #[cfg(feature = "test-hooks")]
                captured: Vec::new(),
                #[cfg(feature = "test-hooks")]
                tamper: None,
            },
        );
        self.push(Transmit::Join { group: name, mode: policy.mode, open: policy.open })
    }

    /// Sends `data` to the group, encrypted under the current key. During a
    /// rekey (or before the first secure view) the message waits and goes
    /// out under the next key; it is not lost. While this member's own
    /// messages are on their way back, it waits for one of them to come back
    /// ([`SessionCore::handle_deliveries`]) and goes out with the others sent
    /// meanwhile, in one bundle ([`crate::data`]); an idle member's message
    /// goes out at once.
    pub fn send(&mut self, now: Instant, group: &str, data: &[u8]) -> Result<(), SessionError> {
        self.now = now;
        let name = GroupName::new(group)?;
        // tag + header (at most 1 + 128 + 20 + 16 + 1 + 255 + 8) + signature
        // (length and at most an RSA-2048 signature) + AEAD tag.
        let layered = LAYERED_OVERHEAD + BUNDLE_ENTRY_OVERHEAD;
        // Optimized EVS: envelope header and AEAD tag, then the sender,
        // origin, count, signature and the bundle's count and length inside.
        let evs = EVS_OVERHEAD + BUNDLE_ENTRY_OVERHEAD;
        let overhead = layered.max(evs);
        if data.len() + overhead > self.max_payload {
            return Err(SessionError::TooLarge { len: data.len(), max: self.max_payload.saturating_sub(overhead) });
        }
        let gs = self.groups.get_mut(&name).filter(|g| !g.leaving).ok_or(SessionError::NotJoined(name.clone()))?;
        if gs.policy.mode == GroupMode::ThreeStep {
            // No key to wait for: the daemon orders it after this member's
            // join, and delivers it in whatever view it is ordered in.
            let payload = Frame::Plain(data).encode();
            return self.push(Transmit::Multicast(name, payload.into()));
        }
        gs.queue.push_back(data.to_vec());
        // An idle sender's message goes out at once. One with bundles on
        // their way sends what it has queued when the next comes back, as one
        // bundle: sent at once, a message would travel alone and pay a
        // signature of its own.
        let idle = match gs.policy.mode {
            GroupMode::OptimizedEvs => gs.evs_in_flight == 0,
            _ => gs.in_flight.is_empty(),
        };
        if !idle {
            return Ok(());
        }
        let sends = flush(&self.me, self.signer.as_ref(), &name, gs, self.max_payload);
        self.push_all(sends)
    }

    /// Sends `data` to an open three-step group ([`Policy::open`]) that this
    /// member is not in: in clear to its daemon, which refuses it
    /// ([`SecureEvent::DaemonError`], `NotMember`) if the group is not open,
    /// and the group's members refuse it if the group is not three-step. In
    /// a group it is in, a member sends with [`SessionCore::send`].
    pub fn send_open(&mut self, now: Instant, group: &str, data: &[u8]) -> Result<(), SessionError> {
        self.now = now;
        let name = GroupName::new(group)?;
        if self.groups.contains_key(&name) {
            return self.send(now, group, data);
        }
        if data.len() + 1 > self.max_payload {
            return Err(SessionError::TooLarge { len: data.len(), max: self.max_payload.saturating_sub(1) });
        }
        let payload = Frame::Plain(data).encode();
        // One entry per send: the daemon refuses each (a refusal names the
        // group last), or delivers it (no answer; the entry ages out).
        if self.open_sends.len() == MAX_OPEN_PENDING {
            self.open_sends.pop_front();
        }
        self.open_sends.push_back(name.clone());
        self.push(Transmit::Multicast(name, payload.into()))
    }

    /// Whether a refusal whose text is `text` answers a send to an open
    /// group (the daemon's refusals name the group last); forgets it if so.
    fn take_open_refusal(&mut self, text: &str) -> bool {
        let Some(i) = self.open_sends.iter().position(|g| text.ends_with(&format!(" {g}"))) else { return false };
        self.open_sends.remove(i);
        true
    }

    /// Messages dropped in `group` because a bound on held messages was
    /// reached (see [`MAX_HELD_BYTES`]); each is also logged.
    pub fn dropped(&self, group: &str) -> u64 {
        GroupName::new(group).ok().and_then(|g| self.groups.get(&g)).map_or(0, |g| g.early.dropped + g.held_ka.dropped)
    }

    /// Optimized EVS: messages of `group` delivered here since this member
    /// joined that a daemon had re-encrypted, having been sealed under the
    /// key of an earlier view (0 for other modes).
    pub fn reencrypted(&self, group: &str) -> u64 {
        GroupName::new(group).ok().and_then(|g| self.groups.get(&g)).map_or(0, |g| g.evs_reencrypted)
    }

    /// Leaves the group; [`SecureEvent::Left`] confirms it. Messages still
    /// waiting for a key are dropped.
    pub fn leave(&mut self, now: Instant, group: &str) -> Result<(), SessionError> {
        self.now = now;
        let name = GroupName::new(group)?;
        let gs = self.groups.get_mut(&name).filter(|g| !g.leaving).ok_or(SessionError::NotJoined(name.clone()))?;
        leave_group(gs);
        self.push(Transmit::Leave(name))
    }

    /// The current secure view of a group (`None` before the first one and
    /// while a rekey runs).
    pub fn secure_members(&self, group: &str) -> Option<&Members> {
        let gs = self.groups.get(&GroupName::new(group).ok()?)?;
        gs.phase.keys().map(|_| &gs.members)
    }

    /// Interval rekeying: the members of the group's current view that wait
    /// for the next rekey, oldest first — those not in the key this member
    /// holds (joiners since its last rekey); while this member holds no key
    /// it cannot tell who does, and names only itself. Empty for groups
    /// rekeyed on every view (their views are shown only with their key) and
    /// for groups this member is not in.
    pub fn waiting_members(&self, group: &str) -> Vec<MemberId> {
        let Some(gs) = GroupName::new(group).ok().and_then(|g| self.groups.get(&g)) else { return Vec::new() };
        if !gs.engine.interval() {
            return Vec::new();
        }
        waiting_members(&self.me, gs)
    }

    /// The epoch of the key this member installed in `group` and is
    /// confirming (waiting for the collector's verdict), if any: for
    /// benchmarks, which time when a member holds its key.
    pub fn confirming_epoch(&self, group: &str) -> Option<Epoch> {
        let group = GroupName::new(group).ok()?;
        self.groups.get(&group)?.phase.confirming().map(|c| c.view.epoch)
    }

    /// What this member's key agreement engine has spent in `group` since
    /// it joined (it starts afresh at every join), `None` if not in it.
    pub fn meter(&self, group: &str) -> Option<crate::Meter> {
        let gs = self.groups.get(&GroupName::new(group).ok()?)?;
        Some(crate::Meter { costs: gs.engine.costs(), interval: gs.engine.interval_stats() })
    }

    /// A delivery from the daemon.
    pub fn handle_delivery(&mut self, now: Instant, delivery: Event) -> Result<(), SessionError> {
        self.now = now;
        self.handle(delivery)
    }

    /// Deliveries that had all arrived from the daemon when the first of
    /// them was handled, in order: as [`SessionCore::handle_delivery`] for
    /// each, except that a view that is *superseded* in the batch only
    /// moves the session and its engine on (the view, who came from where),
    /// without starting its key agreement run.
    ///
    /// A view is superseded when another view of its group follows it in
    /// the batch and no message of the group lies between them. Its run
    /// could not have installed a key anywhere: a key is installed only on
    /// the delivery of a key agreement message of the run's view, every
    /// member of the view is delivered the same messages in it (virtual
    /// synchrony), and this member saw that there were none; the next view,
    /// already here, abandons the run at every member. So skipping it
    /// changes no member's state that the next run reads, and saves this
    /// member the run's work and its messages to all. A member that falls
    /// behind a burst of views (n members joining one group at once: n
    /// views of up to n members each) starts a run only for the last view
    /// it has. Groups whose runs read more of the view history are left
    /// as they are: certified admission (verdicts per view), interval
    /// rekeying, and CKD (its pairwise channels follow every run's members).
    ///
    /// Every other delivery of a group whose next view is already in the
    /// batch is handled as usual (so this member installs exactly when the
    /// others do), but the key agreement messages and the confirmation it
    /// makes are not sent: they would reach the daemon after that next
    /// view, be delivered in it, and be dropped by every member as messages
    /// of an earlier view. Data is sent as always.
    pub fn handle_deliveries(&mut self, now: Instant, deliveries: Vec<Event>) -> Result<(), SessionError> {
        self.now = now;
        let mut superseded = vec![false; deliveries.len()];
        // Per group: the batch index of its last view with no message since.
        let mut open_view: HashMap<&GroupName, usize> = HashMap::new();
        // Per group: the batch index of its last view.
        let mut last_view: HashMap<&GroupName, usize> = HashMap::new();
        for (i, d) in deliveries.iter().enumerate() {
            match d {
                Event::View { group, .. } => {
                    if let Some(j) = open_view.insert(group, i) {
                        superseded[j] = true;
                    }
                    last_view.insert(group, i);
                }
                Event::Message { group, .. } | Event::Unicast { group, .. } => {
                    open_view.remove(group);
                }
                _ => {}
            }
        }
        let stale: Vec<Option<GroupName>> = deliveries
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let group = match d {
                    Event::View { group, .. } | Event::Message { group, .. } | Event::Unicast { group, .. } => group,
                    _ => return None,
                };
                last_view.get(group).is_some_and(|&l| l > i).then(|| group.clone())
            })
            .collect();
        self.preverify(&deliveries);
        for ((d, superseded), stale) in deliveries.into_iter().zip(superseded).zip(stale) {
            // What this member would send in answer to a delivery of a view
            // already followed by the next one could reach the daemon only in
            // that next view, where every member drops key agreement and
            // confirmations of the earlier one: it is not sent.
            self.muted = stale;
            let r = match d {
                Event::View { group, view } if superseded => self.on_superseded_view(group, view),
                d => self.handle(d),
            };
            self.muted = None;
            r?;
        }
        Ok(())
    }

    /// Time passed: acts on every deadline at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), SessionError> {
        self.now = now;
        self.on_deadline(now)
    }

    /// The next request for the daemon, in order.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event for the application, in order.
    pub fn poll_event(&mut self) -> Option<SecureEvent> {
        self.events.pop_front()
    }

    /// When [`SessionCore::handle_timeout`] is next due, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.groups.values().flat_map(|g| [g.admission.deadline(), g.next_tick]).flatten().min()
    }

    fn push(&mut self, o: Transmit) -> Result<(), SessionError> {
        self.transmits.push_back(o);
        Ok(())
    }

    fn push_all(&mut self, os: Vec<Transmit>) -> Result<(), SessionError> {
        self.transmits.extend(os);
        Ok(())
    }

    fn handle(&mut self, d: Event) -> Result<(), SessionError> {
        match d {
            Event::View { group, view } => self.on_view(group, view),
            Event::Message { group, sender, view, payload, .. } => self.on_payload(group, sender, view, payload, false),
            Event::Unicast { group, sender, view, payload } => self.on_payload(group, sender, view, payload, true),
            Event::Left { group } => {
                if self.groups.remove(&group).is_some() {
                    self.events.push_back(SecureEvent::Left { group });
                }
                Ok(())
            }
            Event::Error { code: code @ (ErrorCode::NotMember | ErrorCode::UnknownGroup), text }
                if self.take_open_refusal(&text) =>
            {
                self.events.push_back(SecureEvent::DaemonError { code, text });
                Ok(())
            }
            Event::Error {
                code: ErrorCode::NotMember | ErrorCode::UnknownRecipient | ErrorCode::UnknownGroup,
                text,
            } => {
                // Only key agreement traffic can cause these: data is sent only
                // while the daemon counts us a member, but a key agreement
                // message may race with our own leave, or be a unicast to a
                // member who just left. The next view restarts the run.
                tracing::debug!(%text, "key agreement message refused by the daemon");
                Ok(())
            }
            Event::Error { code, text } => {
                self.events.push_back(SecureEvent::DaemonError { code, text });
                Ok(())
            }
            Event::GroupKey { group, view, key } => {
                // The daemons give keys only to members of keyed groups; an
                // engine that agrees its own keys refuses one.
                if let Some(gs) = self.groups.get_mut(&group) {
                    if let Err(e) = gs.engine.daemon_key(view, key.expose_secret()) {
                        tracing::warn!(%group, error = %e, "a key from the daemon for a group it does not key");
                    }
                    if gs.policy.mode == GroupMode::OptimizedEvs {
                        if gs.evs_keys.len() == EVS_KEYS {
                            gs.evs_keys.pop_front();
                        }
                        gs.evs_keys.push_back((view, key));
                    }
                }
                Ok(())
            }
            Event::Welcome { .. } | Event::ViewChangeBegins { .. } => Ok(()),
        }
    }

    /// Hands each group's engine the key agreement messages of `deliveries`
    /// to check their signatures in one batch ([`Engine::preverify`]).
    fn preverify(&mut self, deliveries: &[Event]) {
        let mut by_group: BTreeMap<&GroupName, Vec<KeyAgreementIn<'_>>> = BTreeMap::new();
        for d in deliveries {
            let (Event::Message { group, sender, view, payload, .. } | Event::Unicast { group, sender, view, payload }) =
                d
            else {
                continue;
            };
            let Some(gs) = self.groups.get(group) else { continue };
            if let Ok(Frame::KeyAgreement { policy, body }) = Frame::parse(payload) {
                if policy == gs.policy.codes() && sender != &self.me {
                    by_group.entry(group).or_default().push((sender, *view, body));
                }
            }
        }
        for (group, msgs) in by_group {
            if msgs.len() >= 2 {
                if let Some(gs) = self.groups.get_mut(group) {
                    gs.engine.preverify(&msgs);
                }
            }
        }
    }

    /// A view superseded by a later one already received, with no message
    /// between (see [`SessionCore::handle_deliveries`]): as [`Self::on_view`]
    /// up to the start of the run, which the next view would abandon.
    fn on_superseded_view(&mut self, group: GroupName, view: View) -> Result<(), SessionError> {
        let plain = |g: &GroupState| {
            !g.engine.interval() && g.policy.protocol != ProtocolId::Ckd && !matches!(g.phase, Phase::Ousted)
        };
        if self.certified.is_some() || !self.groups.get(&group).is_some_and(plain) {
            return self.on_view(group, view);
        }
        self.release_evs_early(&group);
        let gs = self.groups.get_mut(&group).expect("checked above");
        gs.phase = Phase::Agreeing;
        gs.early.clear();
        gs.confirms.clear();
        gs.next_from.clear();
        gs.rekey_since.get_or_insert(self.now);
        tracing::debug!(%group, view = %view.id, n = view.members.len(), "view superseded by one already here");
        let res = gs.engine.observe(&view).map(|()| Vec::new());
        gs.enter_view(view);
        gs.new_view_admission();
        self.engine_result(&group, None, res)
    }

    fn on_view(&mut self, group: GroupName, view: View) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(&group).filter(|g| !matches!(g.phase, Phase::Ousted)) else { return Ok(()) };
        if gs.policy.mode == GroupMode::ThreeStep {
            // No key to agree: the view is the secure view. Who may be in it
            // is the daemons' to check (each member's certificate on its TLS
            // connection, or its Unix user), not the members'.
            gs.enter_view(view.clone());
            gs.members = Members::of_view(&view);
            gs.phase = Phase::Carried;
            self.events.push_back(SecureEvent::View(SecureViewInfo {
                group,
                members: gs.members.clone(),
                epoch: Epoch::new(view.id, 0),
                protocol: gs.policy.protocol,
                fingerprint: THREE_STEP_FINGERPRINT.to_owned(),
                rekey_time: Duration::ZERO,
            }));
            return Ok(());
        }
        if gs.engine.interval() {
            return self.on_interval_view(group, view);
        }
        if gs.policy.mode == GroupMode::OptimizedEvs {
            self.release_evs_early(&group);
        }
        let Some(gs) = self.groups.get_mut(&group) else { return Ok(()) };
        // A new view ends the epoch: its keys are erased now (messages
        // delivered from here on are of the new view), and sends wait.
        gs.phase = Phase::Agreeing;
        gs.early.clear();
        gs.confirms.clear();
        gs.next_from.clear();
        gs.rekey_since.get_or_insert(self.now);
        tracing::debug!(%group, view = %view.id, n = view.members.len(), "view; rekeying");
        gs.new_view_admission();
        if self.certified.is_none() {
            // The engine reads the view where the group keeps it: no copy of
            // a list of hundreds per view.
            gs.enter_view(view);
            gs.digest_view();
            let view = gs.view.as_ref().expect("just entered");
            let res = gs.engine.on_view(view, &mut *self.rng);
            return self.engine_result(&group, None, res);
        }
        let previous = gs.enter_view(view.clone());
        gs.digest_view();
        self.admit(group, previous, view)
    }

    /// Certified mode: key agreement waits for the view's verdicts; the
    /// engine follows the view now (it derives who stays with it from every
    /// view), and this member presents its certificate if the view needs it.
    fn admit(&mut self, group: GroupName, previous: Option<View>, view: View) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(&group) else { return Ok(()) };
        let Some(cert) = self.certified.as_ref() else { return Ok(()) };
        if let Err(e) = gs.engine.observe(&view) {
            return self.engine_result(&group, None, Err(e));
        }
        // Verdicts carry over only into a view that every member entered
        // from this member's previous view, all of them decided there: all
        // members then hold the same verdicts. Any other view (a join or a
        // merge) is decided afresh from the certificates presented in it.
        // Refusals never carry over: they are decided afresh, so a refusal
        // (perhaps from a forged certificate message) lasts one view at most.
        let shrink = previous.is_some_and(|p| view.members.iter().all(|m| m.prev == Some(p.id)))
            && view.ids().all(|m| matches!(gs.verdicts.get(m), Some(Verdict::Accepted(_))));
        gs.admission = Admission::Waiting { deadline: None };
        if shrink {
            let members: BTreeSet<&MemberId> = view.ids().collect();
            gs.verdicts.retain(|m, _| members.contains(m));
        } else {
            // Members begin this view's run as their verdicts come in, at
            // different points of the stream: nothing goes on across it.
            gs.engine.admitting();
            gs.verdicts.clear();
            gs.admission = Admission::Waiting { deadline: Some(self.now + cert.timeout) };
            let cert_der = cert.identity.cert_der();
            let sig = self.signer.sign(&proof_transcript(&group, view.id, &self.me, cert_der));
            let body = cert_body(cert_der, &sig);
            let p = Frame::Trust { kind: TrustKind::Cert, view: view.id, body: &body }.encode();
            self.push(Transmit::Multicast(group.clone(), p.into()))?;
        }
        self.try_start(&group)
    }

    /// A view of a group with interval rekeying (SEAL): the key in use, and
    /// a confirmation under way, outlive it; the engine follows the view
    /// (and may restart an abandoned rekey) among the members it admits —
    /// certified, once every member has a verdict, as for any view — and the
    /// leader's ticks are scheduled ([`Self::interval_started`]).
    fn on_interval_view(&mut self, group: GroupName, view: View) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(&group) else { return Ok(()) };
        tracing::debug!(%group, view = %view.id, n = view.members.len(), "view; the key in use stays until the next rekey");
        if gs.phase.is_aside() {
            gs.phase = Phase::Agreeing; // set aside in the last view only
        }
        let previous = gs.enter_view(view.clone());
        gs.digest_view();
        gs.new_view_admission();
        if self.certified.is_none() {
            let res = gs.engine.on_view(&view, &mut *self.rng);
            self.engine_result(&group, None, res)?;
            return self.interval_started(&group);
        }
        self.admit(group, previous, view)
    }

    /// Interval rekeying, once the engine runs the view: the leader (the
    /// first member the engine admits) ticks every period — at once if it
    /// holds no key, so a new group gets its first key without waiting —
    /// and confirmations of members that left are no longer awaited.
    fn interval_started(&mut self, group: &GroupName) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let (Some(interval), Some(view)) = (gs.policy.interval, gs.view.as_ref()) else { return Ok(()) };
        let certified = self.certified.is_some();
        let leader = view
            .ids()
            .find(|m| !certified || matches!(gs.verdicts.get(*m), Some(Verdict::Accepted(_))))
            .is_some_and(|m| *m == self.me);
        let keyed = matches!(gs.phase, Phase::Secure(_) | Phase::Confirming(_));
        // Views do not move the leader's ticks: churn never postpones a rekey.
        gs.next_tick = match (leader, gs.next_tick) {
            (false, _) => None,
            (true, Some(t)) => Some(t),
            (true, None) => Some(self.now + interval.period),
        };
        // A key holder gone from the view, with rekey_on_leave: rekey now.
        let holder_left = interval.rekey_on_leave
            && matches!(gs.phase, Phase::Secure(_))
            && gs.members.iter().any(|m| !view.contains(m));
        let due = std::mem::take(&mut gs.tick_due) || !keyed || holder_left;
        if leader && due && !gs.phase.is_aside() {
            let res = gs.engine.tick(&mut *self.rng);
            self.engine_result(group, None, res)?;
        }
        self.check_confirmed(group)?;
        self.report_waiting(group);
        Ok(())
    }

    /// Interval rekeying: reports [`SecureEvent::Waiting`] if the members of
    /// the view waiting for the next rekey are not those reported last.
    fn report_waiting(&mut self, group: &GroupName) {
        let Some(gs) = self.groups.get_mut(group) else { return };
        if !gs.engine.interval() {
            return;
        }
        let waiting = waiting_members(&self.me, gs);
        if waiting != gs.waiting_reported {
            gs.waiting_reported = waiting.clone();
            self.events.push_back(SecureEvent::Waiting { group: group.clone(), members: waiting });
        }
    }

    /// Starts key agreement on the current view once every member has a
    /// verdict: refused members are reported, told (by the oldest accepted
    /// member) and left out of the engine's view.
    fn try_start(&mut self, group: &GroupName) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let Some(view) = gs.view.clone() else { return Ok(()) };
        if !gs.admission.is_waiting() || !view.ids().all(|m| gs.verdicts.contains_key(m)) {
            return Ok(());
        }
        gs.admission = Admission::Decided;
        let refused: Vec<(MemberId, Refusal)> = view
            .ids()
            .filter_map(|m| match &gs.verdicts[m] {
                Verdict::Refused(r) => Some((m.clone(), r.clone())),
                Verdict::Accepted(_) => None,
            })
            .collect();
        let oldest = &view.members[0].id;
        let foreign = foreign_authority(&self.me, &view, gs);
        let me_ok = matches!(gs.verdicts.get(&self.me), Some(Verdict::Accepted(_)));
        let oldest_accepted = view.ids().find(|m| matches!(gs.verdicts[*m], Verdict::Accepted(_))).cloned();
        for (member, reason) in &refused {
            if member != &self.me {
                tracing::info!(%group, %member, %reason, "member refused");
                self.events.push_back(SecureEvent::Refused {
                    group: group.clone(),
                    member: member.clone(),
                    reason: reason.clone(),
                });
            }
        }
        let gs = self.groups.get_mut(group).expect("checked above");
        // Already told that it is refused in this view: it stays aside.
        if !me_ok || foreign || gs.phase.is_aside() {
            gs.phase = Phase::Aside;
            gs.engine.stand_aside();
            gs.held_ka.clear();
            if foreign {
                self.events.push_back(SecureEvent::Excluded {
                    group: group.clone(),
                    by: oldest.clone(),
                    reason: Refusal::UnknownIssuer,
                });
            }
            return Ok(());
        }
        if oldest_accepted.as_ref() == Some(&self.me) {
            for (member, reason) in &refused {
                let mut body = Vec::new();
                reason.encode(&mut body);
                let p = Frame::Trust { kind: TrustKind::Refused, view: view.id, body: &body }.encode();
                self.push(Transmit::Unicast(group.clone(), member.clone(), p.into()))?;
            }
        }
        let gs = self.groups.get_mut(group).expect("checked above");
        let held = gs.held_ka.take();
        let interval = gs.engine.interval();
        let res = gs.engine.start(&admitted(gs), &mut *self.rng);
        self.engine_result(group, None, res)?;
        if interval {
            self.interval_started(group)?;
        }
        for (sender, _, bytes) in held {
            let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
            if gs.phase.is_aside() || !matches!(gs.verdicts.get(&sender), Some(Verdict::Accepted(_))) {
                continue;
            }
            let res = gs.engine.on_message(&sender, &bytes, &mut *self.rng);
            self.engine_result(group, Some(&sender), res)?;
        }
        Ok(())
    }

    /// A certificate deadline passed: an accepted member names the members
    /// still without a verdict; the first such notice in the agreed order
    /// refuses them at every member.
    fn on_deadline(&mut self, now: Instant) -> Result<(), SessionError> {
        let ticks: Vec<GroupName> =
            self.groups.iter().filter(|(_, g)| g.next_tick.is_some_and(|t| t <= now)).map(|(n, _)| n.clone()).collect();
        for group in ticks {
            let gs = self.groups.get_mut(&group).expect("listed above");
            let period = gs.policy.interval.map_or(Duration::MAX, |i| i.period);
            gs.next_tick = now.checked_add(period);
            if gs.admission.is_waiting() {
                gs.tick_due = true; // given when the view's verdicts are in
                continue;
            }
            let res = gs.engine.tick(&mut *self.rng);
            self.engine_result(&group, None, res)?;
        }
        let due: Vec<GroupName> = self
            .groups
            .iter()
            .filter(|(_, g)| g.admission.deadline().is_some_and(|d| d <= now))
            .map(|(n, _)| n.clone())
            .collect();
        for group in due {
            let gs = self.groups.get_mut(&group).expect("listed above");
            gs.admission = Admission::Waiting { deadline: None };
            let Some(view) = gs.view.as_ref() else { continue };
            if !matches!(gs.verdicts.get(&self.me), Some(Verdict::Accepted(_))) {
                continue;
            }
            let names = timeout_names_part(view.ids().filter(|m| !gs.verdicts.contains_key(*m)));
            if !names.is_empty() {
                tracing::info!(%group, "certificates missing at the deadline");
                let signature = self.signer.sign(&timeout_signed(&group, view.id, &self.me, &names));
                let body = timeout_body(&names, &signature);
                let p = Frame::Trust { kind: TrustKind::Timeout, view: view.id, body: &body }.encode();
                self.push(Transmit::Multicast(group.clone(), p.into()))?;
            }
        }
        Ok(())
    }

    /// A member's certificate, presented in the current view.
    fn on_cert(
        &mut self,
        group: &GroupName,
        sender: MemberId,
        view: ViewId,
        payload: &[u8],
    ) -> Result<(), SessionError> {
        let Some(cert) = self.certified.as_ref() else { return Ok(()) };
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        // A refusal is provisional: the certificate, coming late (or after
        // an early timeout notice), still counts.
        let provisional = matches!(gs.verdicts.get(&sender), Some(Verdict::Refused(_)));
        let wanted = provisional || (gs.admission.is_waiting() && !gs.verdicts.contains_key(&sender));
        if gs.view.as_ref().map(|v| v.id) != Some(view) || !wanted {
            return Ok(());
        }
        // This member's own verdict comes only from its own certificate, as
        // it sent it: anything else in its name was not sent by it (a link
        // injecting another's certificate under its name must not make it
        // refuse itself and stand aside).
        if sender == self.me {
            let mine = split_cert(payload).is_ok_and(|(der, _)| der == cert.identity.cert_der());
            if !mine {
                tracing::debug!(%group, "a certificate in this member's name that is not its own; dropped");
                return Ok(());
            }
        }
        let checked = split_cert(payload).and_then(|(der, sig)| {
            let c = cert.authority.verify(der, &sender, cert.clock.now())?;
            c.verifier.verify(&proof_transcript(group, view, &sender, der), sig).map_err(|_| Refusal::BadProof)?;
            Ok(c.verifier)
        });
        let verifier = match checked {
            Ok(v) => v,
            Err(doubt) => {
                // Proves nothing about its sender: no verdict (see `Verdict`).
                tracing::debug!(%group, member = %sender, %doubt, "certificate message that does not verify; no verdict");
                gs.doubts.insert(sender, doubt);
                return Ok(());
            }
        };
        gs.verdicts.insert(sender.clone(), Verdict::Accepted(verifier));
        if gs.admission.is_waiting() {
            return self.try_start(group);
        }
        tracing::info!(%group, member = %sender, "certificate came after the member was refused; readmitted");
        self.readmit(group)
    }

    /// A member refused for presenting no certificate presented a valid one
    /// after key agreement started: every member (all see the certificate at
    /// the same point of the agreed stream) runs the view again, from
    /// scratch, with it. So an early or malicious timeout notice costs a
    /// member one extra rekey, never its place in the group.
    fn readmit(&mut self, group: &GroupName) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let Some(view) = gs.view.clone() else { return Ok(()) };
        // Every member counts readmissions alike, standing aside or not (the
        // certificates are in the agreed stream); the k-th starts run k·2^16,
        // above any rekeys after a failed confirmation (which only the
        // members taking part see), so members set aside until now start
        // the same run as the others.
        gs.readmissions += 1;
        let accepted = |m: &MemberId| matches!(gs.verdicts.get(m), Some(Verdict::Accepted(_)));
        if !accepted(&self.me) || foreign_authority(&self.me, &view, gs) {
            return Ok(()); // still refused here: stays aside
        }
        if gs.engine.interval() {
            // A rekey restarts nothing here: the readmitted member joins at
            // the next view's rekey.
            tracing::info!(%group, "member readmitted; it joins the key at the next view");
            return Ok(());
        }
        gs.phase = Phase::Agreeing;
        gs.confirms.clear();
        gs.early.clear();
        gs.rekey_since.get_or_insert(self.now);
        gs.run = gs.readmissions << 16;
        let res = gs.engine.restart(&admitted(gs), gs.run, &mut *self.rng);
        self.engine_result(group, None, res)
    }

    /// An accepted member's notice that some members presented no certificate.
    fn on_timeout(
        &mut self,
        group: &GroupName,
        sender: &MemberId,
        view: ViewId,
        body: &[u8],
    ) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        if self.certified.is_none() || !gs.admission.is_waiting() || gs.view.as_ref().map(|v| v.id) != Some(view) {
            return Ok(());
        }
        let Some(Verdict::Accepted(key)) = gs.verdicts.get(sender) else { return Ok(()) };
        // Signed by its sender: one forged on a member's link (which can
        // deliver anything under any name) must not refuse anyone there.
        let Some((names, signature)) = split_timeout(body) else { return Ok(()) };
        if key.verify(&timeout_signed(group, view, sender, names), signature).is_err() {
            tracing::debug!(%group, %sender, "timeout notice whose signature does not verify; ignored");
            return Ok(());
        }
        let Some(view) = gs.view.as_ref() else { return Ok(()) };
        for name in timeout_names(names) {
            if let Some(m) = view.ids().find(|m| m.as_str().as_bytes() == name) {
                let reason = gs.doubts.get(m).cloned().unwrap_or(Refusal::NoCertificate);
                gs.verdicts.entry(m.clone()).or_insert(Verdict::Refused(reason));
            }
        }
        self.try_start(group)
    }

    /// A notice that this member was refused in the current view. Believed
    /// only from a member of the view (uncertified), or (certified) from a
    /// member this member accepts, and only while this member has not seen
    /// its own certificate verify: every refusal is provisional, and a
    /// member whose certificate verified was (or will be, at the same point
    /// of the agreed stream) readmitted by every member of its authority.
    /// Believing a late notice would make it stand aside from a run that
    /// waits for it.
    fn on_refused(
        &mut self,
        group: &GroupName,
        sender: MemberId,
        view: ViewId,
        body: &[u8],
    ) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let Some(v) = gs.view.as_ref().filter(|v| v.id == view) else { return Ok(()) };
        let believed = match &self.certified {
            Some(_) => {
                matches!(gs.verdicts.get(&sender), Some(Verdict::Accepted(_)))
                    && !matches!(gs.verdicts.get(&self.me), Some(Verdict::Accepted(_)))
            }
            None => v.contains(&sender),
        };
        let Some(reason) = Refusal::decode(body).filter(|_| believed && sender != self.me) else {
            tracing::debug!(%group, %sender, "refusal notice ignored");
            return Ok(());
        };
        tracing::warn!(%group, by = %sender, %reason, "refused by the group");
        gs.phase = Phase::Aside;
        gs.engine.stand_aside();
        gs.held_ka.clear();
        self.events.push_back(SecureEvent::Excluded { group: group.clone(), by: sender, reason });
        Ok(())
    }

    fn engine_result(
        &mut self,
        group: &GroupName,
        from: Option<&MemberId>,
        res: Result<Vec<Output>, conclave_gka::Error>,
    ) -> Result<(), SessionError> {
        let outputs = match res {
            Ok(o) => o,
            Err(e) => {
                use conclave_gka::Error as E;
                match (&e, from) {
                    // Errors that name who sent the message; an invalid
                    // element (Crypto) in a validly signed message is an
                    // insider's, and the run cannot end without it: the
                    // application must hear of it.
                    (
                        E::BadSignature(_) | E::UnknownSender(_) | E::Decode(_) | E::NotAMember(_) | E::Crypto(_),
                        Some(from),
                    ) => self.events.push_back(SecureEvent::Rejected {
                        group: group.clone(),
                        sender: from.clone(),
                        reason: RejectReason::KeyAgreement(e.to_string()),
                    }),
                    // The member the error names: usually the message's
                    // sender, but not always (BD finds an element outside
                    // the group when the last round-2 value comes).
                    (E::Misbehaved { sender, what }, Some(_)) => self.events.push_back(SecureEvent::Rejected {
                        group: group.clone(),
                        sender: sender.clone(),
                        reason: RejectReason::Misbehaved(*what),
                    }),
                    _ => tracing::debug!(%group, error = %e, "key agreement input dropped"),
                }
                return Ok(());
            }
        };
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let mut sends = Vec::new();
        let mut installed = None;
        let muted = self.muted.as_ref() == Some(group);
        for o in outputs {
            match o {
                Output::Send { .. } if muted => {}
                Output::Send { to, bytes } => {
                    #[cfg(feature = "test-hooks")]
                    let bytes = tampered(gs, self.signer.as_ref(), bytes);
                    let p = Frame::KeyAgreement { policy: gs.policy.codes(), body: &bytes }.encode();
                    sends.push(match to {
                        None => Transmit::Multicast(group.clone(), p.into()),
                        Some(to) => Transmit::Unicast(group.clone(), to, p.into()),
                    });
                }
                Output::Installed(sv) => installed = Some(sv),
            }
        }
        self.push_all(sends)?;
        if let Some(sv) = installed {
            self.install(group, sv)?;
        }
        Ok(())
    }

    /// The engine installed a key: hold it until every member confirms it
    /// (see [`crate::confirm`]), and send this member's confirmation.
    fn install(&mut self, group: &GroupName, sv: SecureView) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        if gs.engine.current_epoch() != Some(sv.epoch) {
            tracing::debug!(%group, "key for a superseded run dropped");
            return Ok(());
        }
        if daemon_keyed(gs.policy.mode) {
            // The daemons confirmed the key they derived this one from
            // among themselves (see `conclave_integrated`'s `confirm`): the
            // view's key is the same at every member.
            return self.deliver_secure_view(group, sv);
        }
        let members = gs.members_digest(&sv.members);
        let confirmer = Confirmer::new(sv.key.expose_secret(), group, sv.epoch, sv.protocol, &members);
        let mac = confirmer.mac(&self.me);
        // A member alone signs nothing: it is its own collector.
        let unsigned = sv.members.len() == 1;
        let sig =
            if unsigned { Vec::new() } else { self.signer.sign(&confirm_signed(group, &self.me, sv.epoch, &mac)) };
        let frame = Frame::Confirm { epoch: sv.epoch, mac: &mac, signature: &sig }.encode().into();
        gs.confirms.of(sv.epoch);
        gs.phase = Phase::Confirming(Box::new(Confirming {
            view: sv,
            confirmer,
            own_mac: mac,
            frame,
            sent_to: None,
            verdict_sent: None,
        }));
        self.check_confirmed(group)
    }

    /// A member's key confirmation for the current run.
    fn on_confirm(
        &mut self,
        group: &GroupName,
        sender: MemberId,
        epoch: Epoch,
        mac: &[u8; 32],
        signature: &[u8],
    ) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        // Interval rekeying: the key being confirmed outlives views, and so
        // does its confirmation. A confirmation of the key already confirmed
        // here (a replay, or one that came after the last one awaited) is
        // another run's too: the run is over.
        let confirming = gs.phase.confirming().map(|c| c.view.epoch);
        let expected = gs.engine.current_epoch() == Some(epoch) || (gs.engine.interval() && confirming == Some(epoch));
        let confirmed = gs.phase.keys().is_some_and(|k| k.epoch() == epoch);
        if gs.phase.is_aside() || !expected || confirmed || gs.confirms.of(epoch).accepted.contains_key(&sender) {
            tracing::debug!(%group, %sender, %epoch, "confirmation of another run, or a second one, dropped");
            return Ok(());
        }
        if !gs.in_view.contains(&sender) {
            return Ok(());
        }
        if sender == self.me {
            // A member never sends its confirmation to itself.
            tracing::debug!(%group, "a confirmation in this member's name that it did not send; dropped");
            return Ok(());
        }
        // A MAC that matches this member's key is accepted as it is, without
        // the sender's identity key (see `crate::confirm`): with interval
        // rekeying the key, agreed among the members admitted in an earlier
        // view, is confirmed in a later one, whose certificates may come
        // after the confirmations in the agreed stream (a join or a merge
        // decides every verdict afresh). The others wait until every
        // member's confirmation is in (a second one in the same name means
        // one of them is forged).
        if gs.phase.confirming().is_some_and(|c| c.confirmer.matches(&sender, mac)) {
            gs.confirms.pending.remove(&sender);
            gs.confirms.accepted.insert(sender, *mac);
            return self.check_confirmed(group);
        }
        let Some(key) = sender_key(&self.certified, self.directory.as_ref(), gs, &sender) else {
            // Refused, or no identity (yet): its signature cannot be checked.
            tracing::debug!(%group, %sender, %epoch, "unmatched confirmation from a member with no key here; dropped");
            return Ok(());
        };
        let candidates = gs.confirms.pending.entry(sender.clone()).or_default();
        if candidates.iter().any(|u| u.mac == *mac && u.signature == signature) {
            tracing::debug!(%group, %sender, "a copy of a confirmation held already; dropped");
            return Ok(());
        }
        if candidates.len() >= MAX_CONFIRM_CANDIDATES {
            tracing::debug!(%group, %sender, "a third confirmation in one name in one run; dropped");
            return Ok(());
        }
        let signed = confirm_signed(group, &sender, epoch, mac);
        candidates.push(Unchecked { mac: *mac, signature: signature.to_vec(), signed, key });
        self.check_confirmed(group)
    }

    /// Moves the current run's confirmation on (see [`crate::confirm`]): a
    /// member sends its confirmation to the collector (again, if a view took
    /// the one it had sent it to); the collector, once every member's
    /// confirmation is in, multicasts its verdict, on which every member
    /// decides ([`Self::on_verdict`]).
    fn check_confirmed(&mut self, group: &GroupName) -> Result<(), SessionError> {
        let muted = self.muted.as_ref() == Some(group);
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        // A confirmation that outlives views (interval rekeying) goes on in
        // a new view once its admission is decided (`interval_started`), not
        // before: what a member sends in a view, to whom, and which members
        // it awaits follow from the view's verdicts, and nothing that comes
        // meanwhile (a confirmation, perhaps forged) moves it earlier.
        if gs.admission.is_waiting() {
            return Ok(());
        }
        // Interval rekeying: the key's members that have left since will
        // never confirm, and need not.
        let interval = gs.engine.interval();
        let Phase::Confirming(c) = &mut gs.phase else { return Ok(()) };
        let Some(collector) = c.collector(interval, &gs.in_view).cloned() else { return Ok(()) };
        if collector != self.me {
            if c.sent_to.as_ref() != Some(&collector) && !muted {
                c.sent_to = Some(collector.clone());
                let frame = c.frame.clone();
                self.push(Transmit::Unicast(group.clone(), collector, frame))?;
            }
            return Ok(());
        }
        let Some(current) = gs.view.as_ref().map(|v| v.id) else { return Ok(()) };
        if c.verdict_sent == Some(current) || muted {
            return Ok(());
        }
        gs.confirms.accepted.insert(self.me.clone(), c.own_mac);
        // This runs at every confirmation: while fewer confirmations (of
        // distinct senders: `accepted` and `pending` never share one) are in
        // than the key has members, some member's is missing, and the check
        // costs nothing.
        let received = gs.confirms.accepted.len() + gs.confirms.pending.len();
        if !interval && received < c.view.members.len() {
            return Ok(());
        }
        let awaited: Vec<MemberId> =
            c.view.members.iter().filter(|m| !interval || gs.in_view.contains(*m)).cloned().collect();
        if !awaited.iter().all(|m| gs.confirms.has(m)) {
            return Ok(());
        }
        let forged = gs.confirms.settle(&c.confirmer);
        for forged in forged {
            self.events.push_back(SecureEvent::Rejected {
                group: group.clone(),
                sender: forged,
                reason: RejectReason::BadSignature,
            });
        }
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let Phase::Confirming(c) = &mut gs.phase else { return Ok(()) };
        let accepted = &gs.confirms.accepted;
        if !awaited.iter().all(|m| accepted.contains_key(m)) {
            return Ok(()); // a forged one was dropped: wait for the real one
        }
        let unmatched: Vec<MemberId> = awaited.iter().filter(|m| gs.confirms.unmatched.contains(*m)).cloned().collect();
        if awaited.len() == 1 {
            // Alone: nobody to tell.
            return self.decide(group, unmatched);
        }
        let names = crate::payload::timeout_names_part(&unmatched);
        let mac = c.confirmer.verdict_mac(&self.me, current, &names);
        let epoch = c.view.epoch;
        let signature = self.signer.sign(&verdict_signed(group, &self.me, epoch, current, &mac, &names));
        c.verdict_sent = Some(current);
        let p = Frame::Verdict { epoch, view: current, mac: &mac, signature: &signature, names: &names }.encode();
        self.push(Transmit::Multicast(group.clone(), p.into()))
    }

    /// The collector's verdict on the current run's confirmations. Its MAC
    /// shows whether the collector holds this member's key; if it does not,
    /// the signature tells a collector with another key (a split, reported)
    /// from a forgery in its name (dropped: the real verdict is awaited).
    fn on_verdict(
        &mut self,
        group: &GroupName,
        sender: MemberId,
        epoch: Epoch,
        sent_in: ViewId,
        mac: &[u8; 32],
        signature: &[u8],
        names: &[u8],
    ) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let interval = gs.engine.interval();
        if gs.view.as_ref().map(|v| v.id) != Some(sent_in) {
            // Sent in another view (a copy replayed from another view or
            // component, or ordered after a view change): not this view's
            // decision. The collector sends it again in this view.
            tracing::debug!(%group, %sender, %epoch, %sent_in, "verdict of another view; dropped");
            return Ok(());
        }
        let Some(c) = gs.phase.confirming().filter(|c| c.view.epoch == epoch) else {
            tracing::debug!(%group, %sender, %epoch, "verdict on no run this member confirms; dropped");
            return Ok(());
        };
        if !gs.in_view.contains(&sender) || c.collector(interval, &gs.in_view) != Some(&sender) {
            tracing::debug!(%group, %sender, %epoch, "verdict from a member that does not collect; dropped");
            return Ok(());
        }
        let listed = crate::payload::verdict_names(names).unwrap_or_default();
        if c.confirmer.verdict_matches(&sender, sent_in, names, mac) {
            let unconfirmed: Vec<MemberId> =
                c.view.members.iter().filter(|m| listed.contains(&m.as_str().as_bytes())).cloned().collect();
            if unconfirmed.len() != listed.len() {
                // A key holder made it: a list that names others than the
                // key's members is a lie, taken as a failed confirmation.
                tracing::warn!(%group, %sender, "verdict lists members the key does not have");
                return self.decide(group, vec![sender]);
            }
            return self.decide(group, unconfirmed);
        }
        let valid = sender_key(&self.certified, self.directory.as_ref(), gs, &sender)
            .is_some_and(|k| k.verify(&verdict_signed(group, &sender, epoch, sent_in, mac, names), signature).is_ok());
        if !valid {
            tracing::debug!(%group, %sender, %epoch, "verdict whose MAC and signature do not hold; dropped");
            self.events.push_back(SecureEvent::Rejected {
                group: group.clone(),
                sender,
                reason: RejectReason::BadSignature,
            });
            return Ok(());
        }
        self.decide(group, vec![sender])
    }

    /// Ends the run's confirmation: delivers the secure view if no member's
    /// key is known to differ, or reports the mismatch and rekeys the view
    /// from scratch (every member decides on the same verdict).
    fn decide(&mut self, group: &GroupName, unconfirmed: Vec<MemberId>) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let interval = gs.engine.interval();
        let Phase::Confirming(c) = std::mem::replace(&mut gs.phase, Phase::Agreeing) else { return Ok(()) };
        gs.confirms.clear();
        if unconfirmed.is_empty() {
            return self.deliver_secure_view(group, c.view);
        }
        tracing::warn!(%group, epoch = %c.view.epoch, ?unconfirmed, "key confirmation failed; rekeying");
        self.events.push_back(SecureEvent::KeyMismatch { group: group.clone(), epoch: c.view.epoch, unconfirmed });
        gs.early.clear();
        if interval {
            // Every member saw the same verdict: all forget the tree, and
            // the next view rebuilds it with every member a joiner.
            gs.engine.stand_aside();
            return Ok(());
        }
        gs.run += 1;
        let res = gs.engine.rekey(&mut *self.rng);
        self.engine_result(group, None, res)
    }

    /// The key is confirmed: the application gets the secure view, and what
    /// waited for the key (data received early, own sends) goes on.
    fn deliver_secure_view(&mut self, group: &GroupName, sv: SecureView) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let epoch = sv.epoch;
        gs.phase = Phase::Secure(EpochKeys::new(group.clone(), epoch, &sv.key));
        gs.members = sv.members.clone();
        gs.next_seq = 0;
        gs.next_from.clear();
        gs.established = true;
        let rekey_time = gs.rekey_since.take().map(|t| self.now.saturating_duration_since(t)).unwrap_or(Duration::ZERO);
        tracing::debug!(%group, %epoch, fp = %sv.key.fingerprint(), ?rekey_time, "secure view confirmed");
        self.events.push_back(SecureEvent::View(SecureViewInfo {
            group: group.clone(),
            members: sv.members,
            epoch,
            protocol: sv.protocol,
            fingerprint: sv.key.fingerprint(),
            rekey_time,
        }));
        self.report_waiting(group);
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let early = gs.early.take();
        for (sender, view, payload) in early {
            if payload.first() == Some(&crate::payload::tag::EVS) {
                self.on_evs(group, sender, view, payload)?;
            } else {
                self.on_data(group, sender, view, payload)?;
            }
        }
        self.flush_group(group)
    }

    /// A payload from the daemon (wire format in [`crate::payload`]):
    /// framing, then the handler of its kind, which decodes the body.
    fn on_payload(
        &mut self,
        group: GroupName,
        sender: MemberId,
        view: ViewId,
        payload: Bytes,
        unicast: bool,
    ) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(&group) else { return Ok(()) };
        if matches!(gs.phase, Phase::Ousted) {
            return Ok(());
        }
        // The framing step, shared with `payload::parse_payload`.
        let frame = match Frame::parse(&payload) {
            Ok(frame) => frame,
            Err(e) => {
                tracing::debug!(%group, %sender, error = %e, "malformed payload");
                self.events.push_back(SecureEvent::Rejected { group, sender, reason: RejectReason::Malformed });
                return Ok(());
            }
        };
        // A three-step group carries data in clear and nothing else; an
        // Optimized EVS group's data comes in envelopes. No other group
        // takes either.
        let three_step = gs.policy.mode == GroupMode::ThreeStep;
        let evs = gs.policy.mode == GroupMode::OptimizedEvs;
        let wrong_mode = match frame {
            Frame::Plain(data) if three_step && !unicast => {
                // The data is the payload's tail: shared, not copied.
                let data = payload.slice(payload.len() - data.len()..);
                self.events.push_back(SecureEvent::Message { group, sender, epoch: Epoch::new(view, 0), data });
                return Ok(());
            }
            Frame::Evs(_) if evs && !unicast => return self.on_evs(&group, sender, view, payload),
            Frame::Evs(_) if evs => false, // on the wrong channel: below
            _ if three_step => true,
            Frame::Plain(_) | Frame::Evs(_) => true,
            Frame::Data(_) => evs,
            _ => false,
        };
        if wrong_mode {
            tracing::debug!(%group, %sender, "a message of another mode than the group's");
            self.events.push_back(SecureEvent::Rejected { group, sender, reason: RejectReason::WrongMode });
            return Ok(());
        }
        match frame {
            Frame::KeyAgreement { policy, body } => {
                if policy != gs.policy.codes() {
                    return self.on_foreign_key_agreement(group, sender, view, policy, body);
                }
                if gs.phase.is_aside() || matches!(gs.verdicts.get(&sender), Some(Verdict::Refused(_))) {
                    return Ok(()); // from a refused member, or while standing aside
                }
                // Interval rekeying: a rekeying operation starts at the first
                // rekey message received since the last install (SEAL §6).
                if gs.engine.interval() && is_rekey_message(body) {
                    gs.rekey_since.get_or_insert(self.now);
                }
                if gs.admission.is_waiting() {
                    gs.held_ka.push(sender, view, payload.slice_ref(body));
                    return Ok(());
                }
                #[cfg(feature = "test-hooks")]
                let original =
                    (sender == self.me).then(|| gs.tamper.as_mut().and_then(|t| t.sent.remove(body))).flatten();
                #[cfg(feature = "test-hooks")]
                let body = original.as_deref().unwrap_or(body);
                let res = gs.engine.on_message(&sender, body, &mut *self.rng);
                self.engine_result(&group, Some(&sender), res)
            }
            Frame::Policy { view: made_for, policy, signature } if unicast => {
                let Some(gs) = self.groups.get(&group) else { return Ok(()) };
                let verified = made_for == view
                    && gs.view.as_ref().is_some_and(|v| v.id == view)
                    && sender_key(&self.certified, self.directory.as_ref(), gs, &sender).is_some_and(|k| {
                        k.verify(&policy_signed(&group, view, &sender, &self.me, policy), signature).is_ok()
                    });
                if !verified {
                    tracing::debug!(%group, %sender, "policy notice not signed by a known member of this view; ignored");
                    return Ok(());
                }
                self.on_foreign_policy(group, sender, policy)
            }
            Frame::Confirm { epoch, mac, signature } if unicast => {
                self.on_confirm(&group, sender, epoch, mac, signature)
            }
            Frame::Verdict { epoch, view: sent_in, mac, signature, names } if !unicast => {
                self.on_verdict(&group, sender, epoch, sent_in, mac, signature, names)
            }
            Frame::Trust { kind, view: made_for, body } => {
                if made_for != view {
                    tracing::debug!(%group, %sender, %made_for, %view, "trust message of an earlier view dropped");
                    return Ok(());
                }
                match (kind, unicast) {
                    (TrustKind::Cert, false) => self.on_cert(&group, sender, view, body),
                    (TrustKind::Timeout, false) => self.on_timeout(&group, &sender, view, body),
                    (TrustKind::Refused, true) => self.on_refused(&group, sender, view, body),
                    _ => {
                        self.events.push_back(SecureEvent::Rejected { group, sender, reason: RejectReason::Malformed });
                        Ok(())
                    }
                }
            }
            Frame::Data(_) if !unicast => {
                #[cfg(feature = "test-hooks")]
                gs.captured.push((sender.clone(), payload.slice(1..)));
                self.on_data(&group, sender, view, payload)
            }
            // On the wrong channel (or a three-step or EVS group's, taken above).
            Frame::Policy { .. }
            | Frame::Data(_)
            | Frame::Confirm { .. }
            | Frame::Verdict { .. }
            | Frame::Plain(_)
            | Frame::Evs(_) => {
                self.events.push_back(SecureEvent::Rejected { group, sender, reason: RejectReason::Malformed });
                Ok(())
            }
        }
    }

    /// A key agreement message made under another policy. Acted on only if
    /// it is a well-formed engine message of this view, signed by the member
    /// the daemon names, whose identity this member knows: anyone else's
    /// claim about the group's policy is ignored.
    fn on_foreign_key_agreement(
        &mut self,
        group: GroupName,
        sender: MemberId,
        view: ViewId,
        policy: (u8, u8),
        body: &[u8],
    ) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get(&group) else { return Ok(()) };
        let genuine = conclave_gka::message::Envelope::decode(body).is_ok_and(|env| {
            env.sender == sender
                && env.view == view
                && decode_policy(policy).is_some_and(|p| {
                    (p.protocol, p.group_id) == (env.protocol, env.group_id) && env.group == engine_context(&group, &p)
                })
                && gs.view.as_ref().is_some_and(|v| v.id == view)
                && sender_key(&self.certified, self.directory.as_ref(), gs, &sender)
                    .is_some_and(|k| k.verify(&env.signed_bytes(), &env.signature).is_ok())
        });
        if !genuine {
            tracing::debug!(%group, %sender, "unverifiable key agreement message under another policy; ignored");
            return Ok(());
        }
        self.on_foreign_policy(group, sender, policy)
    }

    /// A member's verified claim that the group runs another policy. The
    /// older member's policy wins: a newcomer that hears from an older
    /// member learns that it is the odd one out and leaves; the oldest
    /// member tells a newer member with another policy so, signed.
    fn on_foreign_policy(&mut self, group: GroupName, sender: MemberId, theirs: (u8, u8)) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(&group) else { return Ok(()) };
        let Some(view) = gs.view.as_ref() else { return Ok(()) };
        let view_id = view.id;
        let pos = |m: &MemberId| view.members.iter().position(|v| &v.id == m);
        let (Some(me), Some(them)) = (pos(&self.me), pos(&sender)) else { return Ok(()) };
        if them < me && !gs.established {
            let theirs = decode_policy(theirs);
            tracing::warn!(%group, %sender, "the group runs another key agreement policy; leaving");
            let ours = gs.policy;
            leave_group(gs);
            gs.phase = Phase::Ousted;
            self.events.push_back(SecureEvent::PolicyMismatch { group: group.clone(), ours, theirs, from: sender });
            return self.push(Transmit::Leave(group));
        }
        if me == 0 {
            let ours = gs.policy.codes();
            let sig = self.signer.sign(&policy_signed(&group, view_id, &self.me, &sender, ours));
            let p = Frame::Policy { view: view_id, policy: ours, signature: &sig }.encode();
            self.push(Transmit::Unicast(group.clone(), sender.clone(), p.into()))?;
        }
        self.events.push_back(SecureEvent::Rejected { group, sender, reason: RejectReason::PolicyMismatch });
        Ok(())
    }

    fn on_data(
        &mut self,
        group: &GroupName,
        sender: MemberId,
        view: ViewId,
        payload: Bytes,
    ) -> Result<(), SessionError> {
        let in_flight = |me: &Self| me.groups.get(group).map(|g| g.in_flight.len());
        let before = in_flight(self);
        let res = self.open_data(group, &sender, view, payload);
        self.report(group, sender, res);
        // One of ours came back: what waited for it goes. Nothing else
        // (least of all a forgery) makes this member send.
        if in_flight(self) < before {
            self.flush_group(group)?;
        }
        Ok(())
    }

    /// Sends what waits in `group`, if it may go now (see [`flush`]).
    fn flush_group(&mut self, group: &GroupName) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let sends = flush(&self.me, self.signer.as_ref(), group, gs, self.max_payload);
        self.push_all(sends)
    }

    /// An Optimized EVS group's data message (an envelope): opened, checked
    /// and delivered, or held until this view's key is confirmed.
    fn on_evs(
        &mut self,
        group: &GroupName,
        sender: MemberId,
        view: ViewId,
        payload: Bytes,
    ) -> Result<(), SessionError> {
        #[cfg(feature = "test-hooks")]
        if let Some(gs) = self.groups.get_mut(group) {
            gs.captured.push((sender.clone(), payload.clone()));
        }
        let notice = matches!(Envelope::decode(&payload), Ok(Envelope::Notice { .. }));
        let res = self.open_evs(group, &sender, view, payload, false);
        // One of ours is back, read (or a daemon's notice in its place): the
        // next bundle may go. Nothing else (least of all a payload put in our
        // name) makes this member send.
        let back = sender == self.me && (notice || matches!(&res, Ok(events) if !events.is_empty()));
        self.report(group, sender, res);
        if back {
            if let Some(gs) = self.groups.get_mut(group) {
                gs.evs_in_flight = gs.evs_in_flight.saturating_sub(1);
            }
            self.flush_group(group)?;
        }
        Ok(())
    }

    /// Reports what checking a data message from `sender` gave: the message,
    /// nothing (held, or dropped quietly), or why it was refused.
    fn report(
        &mut self,
        group: &GroupName,
        sender: MemberId,
        res: Result<impl IntoIterator<Item = SecureEvent>, RejectReason>,
    ) {
        match res {
            Ok(events) => self.events.extend(events),
            Err(reason) => self.events.push_back(SecureEvent::Rejected { group: group.clone(), sender, reason }),
        }
    }

    /// A view of an Optimized EVS group ends before its key was confirmed
    /// here: the data held for it was delivered in it, by the daemons'
    /// promise sealed under its key, and no one will send it again, so it
    /// is read now under that key (each message's AEAD and its sender's
    /// signature prove it; the confirmation only held it back).
    ///
    /// Certified sessions cannot: in a view that re-decides its members,
    /// a sender's certificate may not have arrived before the view ended,
    /// and whether it had differs from member to member (each lacks the
    /// others' certificates, not its own), so some would read a message and
    /// others not. Every member reports each such message instead
    /// ([`RejectReason::CutShort`]); whether a view ended before its key
    /// was confirmed is the same for all that move on together (the last
    /// confirmation is a point in the agreed order).
    fn release_evs_early(&mut self, group: &GroupName) {
        let Some(gs) = self.groups.get_mut(group) else { return };
        if gs.policy.mode != GroupMode::OptimizedEvs || gs.phase.keys().is_some() {
            return;
        }
        let certified = self.certified.is_some();
        for (sender, view, payload) in gs.early.take() {
            let res = match self.cut_short(group, &sender, view, &payload) {
                Some(reason) if certified => Err(reason),
                _ => self.open_evs(group, &sender, view, payload, true),
            };
            self.report(group, sender, res);
        }
    }

    /// [`RejectReason::CutShort`] for an Optimized EVS message of `sender`
    /// sealed under the key of `view`, as the sealed envelope says inside
    /// (its AEAD checked, not its signature); `None` for a notice, or
    /// anything that does not open or names another sender inside
    /// ([`Self::open_evs`] refuses it).
    fn cut_short(&self, group: &GroupName, sender: &MemberId, view: ViewId, payload: &[u8]) -> Option<RejectReason> {
        let env @ Envelope::Sealed { key_view, .. } = Envelope::decode(payload).ok()? else { return None };
        let key = evs_key(&self.groups.get(group)?.evs_keys, view).filter(|_| key_view == view)?;
        let opened = envelope::open(key, group, &env).ok()?;
        let inner = crate::evs::decode(&opened).filter(|inner| inner.sender == *sender)?;
        let messages = u32::try_from(crate::evs::unbundle(inner.data)?.len()).ok()?;
        Some(RejectReason::CutShort { key_view: inner.origin, seq: inner.seq, messages })
    }

    /// The checks on an Optimized EVS data message delivered in daemon view
    /// `delivered_in`, in order: a well-formed envelope; sealed under the
    /// key of the view it is delivered in (the daemons re-encrypt anything
    /// else), or a daemon's notice for that view; that key confirmed here
    /// (else held, unless `unconfirmed_ok`); a notice is reported then, in
    /// its place among the messages; AEAD; the sender inside is
    /// the one the daemon names, and a member's own envelope says what its
    /// inside says; membership; the sender's signature; replay.
    fn open_evs(
        &mut self,
        group: &GroupName,
        sender: &MemberId,
        delivered_in: ViewId,
        payload: Bytes,
        unconfirmed_ok: bool,
    ) -> Result<Vec<SecureEvent>, RejectReason> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(Vec::new()) };
        let env = Envelope::decode(&payload).map_err(|_| RejectReason::Malformed)?;
        // A daemon's notice stands in the place of the message it replaces:
        // held and reported in order with the messages around it.
        let (key_view, notice) = match &env {
            Envelope::Notice { delivered_in: d, .. } if *d != delivered_in => return Err(RejectReason::OtherView(*d)),
            Envelope::Notice { reason: NoticeReason::KeyGone, key_view, seq, messages, .. } => {
                (delivered_in, Some(RejectReason::KeyGone { key_view: *key_view, seq: *seq, messages: *messages }))
            }
            Envelope::Notice { reason: NoticeReason::Unreadable, .. } => (delivered_in, Some(RejectReason::AuthFailed)),
            Envelope::Sealed { key_view, .. } => (*key_view, None),
        };
        if key_view != delivered_in {
            return Err(RejectReason::OtherView(key_view));
        }
        if matches!(gs.verdicts.get(sender), Some(Verdict::Refused(_))) {
            return Ok(Vec::new()); // a refused member's data is ignored
        }
        let confirmed = gs.phase.keys().is_some() && gs.view.as_ref().is_some_and(|v| v.id == delivered_in);
        if !confirmed && !unconfirmed_ok {
            if !gs.early.push(sender.clone(), delivered_in, payload) {
                return Err(RejectReason::HeldBudget);
            }
            return Ok(Vec::new());
        }
        let (writer, seq, count) = match (&env, notice) {
            (_, Some(reason)) => return Err(reason),
            (Envelope::Sealed { writer, seq, messages, .. }, None) => (writer, *seq, *messages),
            (Envelope::Notice { .. }, None) => return Err(RejectReason::Malformed),
        };
        let Some(key) = evs_key(&gs.evs_keys, delivered_in) else {
            return Err(RejectReason::UnknownEpoch(Epoch::new(delivered_in, 0)));
        };
        let opened = envelope::open(key, group, &env).map_err(|_| RejectReason::AuthFailed)?;
        let inner = crate::evs::decode(&opened).ok_or(RejectReason::Malformed)?;
        let own_envelope = match writer {
            Writer::Member(w) => w == sender && inner.origin == key_view && inner.seq == seq,
            Writer::Daemon(_) => true,
        };
        if inner.sender != *sender || !own_envelope {
            return Err(RejectReason::UnknownSender);
        }
        let member = gs.view.as_ref().is_some_and(|v| v.id == delivered_in) && gs.in_view.contains(sender);
        if !member {
            return Err(RejectReason::UnknownSender);
        }
        if gs.policy.sender_signatures {
            let key = if sender == &self.me {
                Some(self.signer.verifier())
            } else {
                sender_key(&self.certified, self.directory.as_ref(), gs, sender)
            };
            let signed = crate::evs::signed(group, sender, inner.origin, inner.seq, inner.data);
            match key {
                Some(k) if k.verify(&signed, inner.signature).is_ok() => {}
                Some(_) => return Err(RejectReason::BadSignature),
                None => return Err(RejectReason::UnknownSender),
            }
        }
        // The bundle holds what the envelope says it does (which a notice
        // in its place would say).
        let ranges = crate::evs::unbundle(inner.data)
            .filter(|r| u32::try_from(r.len()).is_ok_and(|n| n == count))
            .ok_or(RejectReason::Malformed)?;
        if !gs.evs_seen.entry(sender.clone()).or_default().accept(inner.origin, inner.seq) {
            return Err(RejectReason::Replay(inner.seq));
        }
        gs.evs_reencrypted += ranges.len() as u64 * u64::from(matches!(writer, Writer::Daemon(_)));
        let data = Bytes::copy_from_slice(inner.data);
        let message = |r| SecureEvent::Message {
            group: group.clone(),
            sender: sender.clone(),
            epoch: Epoch::new(delivered_in, 0),
            data: data.slice(r),
        };
        Ok(ranges.into_iter().map(message).collect())
    }

    /// The checks on a data message delivered in daemon view `delivered_in`,
    /// in order: well formed, our own coming back, group and sender match
    /// what the daemon says, sent in this view, epoch, key, membership,
    /// authenticity (AEAD, then the sender's signature), replay.
    fn open_data(
        &mut self,
        group: &GroupName,
        sender: &MemberId,
        delivered_in: ViewId,
        payload: Bytes,
    ) -> Result<Vec<SecureEvent>, RejectReason> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(Vec::new()) };
        let (header, _, _) = DataHeader::decode(&payload[1..]).map_err(|_| RejectReason::Malformed)?;
        let current = current_epoch(gs);
        // Our own message coming back (in send order), byte for byte as sent:
        // its signature need not be checked. Anything else in our name is.
        let own = *sender == self.me
            && header.sender == self.me
            && gs.in_flight.front().is_some_and(|f| (f.0, f.1) == (header.epoch, header.seq) && f.3 == payload);
        // Our own bundle's messages, as we sent them: read from here, not
        // decrypted again.
        let mut own_messages = None;
        if own {
            let (epoch, _, messages, _) = gs.in_flight.pop_front().expect("front exists");
            if Some(epoch) != current || header.view != delivered_in {
                // Sent just before a view change (or a rekey) and delivered
                // after it, where nobody accepts it: send it again in this
                // view (under the next key), before anything sent later.
                gs.resend.extend(messages);
                return Ok(Vec::new());
            }
            own_messages = Some(messages);
        }
        if matches!(gs.verdicts.get(sender), Some(Verdict::Refused(_))) {
            return Ok(Vec::new()); // a refused member's data is ignored
        }
        if header.group != *group || header.sender != *sender {
            return Err(RejectReason::UnknownSender);
        }
        if header.view != delivered_in {
            // Sent in another view. One this member was in before the current
            // one, by a member that came along (a message that crossed a view
            // change): its sender sends it again here. Anything else is a
            // replay from another view, component or daemon lifetime.
            let earlier = gs.earlier_views.contains(&header.view);
            let was_here = gs.view.as_ref().and_then(|v| v.member(sender)).is_some_and(|m| m.prev.is_some());
            if earlier && was_here {
                tracing::debug!(%group, %sender, "message sent in an earlier view dropped");
                return Ok(Vec::new());
            }
            return Err(RejectReason::OtherView(header.view));
        }
        let Some(current) = current else {
            if gs.engine.interval() {
                // Waiting for the next rekey: the group's traffic is not for us yet.
                return Ok(Vec::new());
            }
            return Err(RejectReason::UnknownEpoch(header.epoch));
        };
        if header.epoch != current {
            // Earlier: an earlier run of this view, or a view this member was
            // in before.
            let (h, c) = (header.epoch, current);
            let earlier_run = h.view == c.view && h.run < c.run;
            let earlier_view = gs.earlier_views.contains(&h.view);
            let was_here = gs.view.as_ref().and_then(|v| v.member(sender)).is_some_and(|m| m.prev.is_some());
            if earlier_run || (earlier_view && was_here) {
                // Sent under an earlier key, delivered after a view change or
                // rekey: its sender sends it again under the new key.
                tracing::debug!(%group, %sender, "message of an earlier epoch dropped");
                return Ok(Vec::new());
            }
            return Err(RejectReason::UnknownEpoch(header.epoch));
        }
        let Some(keys) = gs.phase.keys() else {
            // Of this epoch, but its key is not confirmed here yet.
            if !gs.early.push(sender.clone(), delivered_in, payload) {
                return Err(RejectReason::HeldBudget);
            }
            return Ok(Vec::new());
        };
        // The key's members are most often the view's own list: then the
        // view's member set answers, not a read of n names per message.
        let whole_view = gs.view.as_ref().is_some_and(|v| gs.members.is_list_of(v));
        let member = if whole_view { gs.in_view.contains(sender) } else { gs.members.contains(sender) };
        if !member {
            return Err(RejectReason::UnknownSender);
        }
        let key = match (own, sender == &self.me) {
            (true, _) => None,
            (false, true) => Some(self.signer.verifier()),
            (false, false) => sender_key(&self.certified, self.directory.as_ref(), gs, sender),
        };
        if !own && key.is_none() {
            return Err(RejectReason::UnknownSender);
        }
        // Without sender signatures (the group's policy), the key alone
        // authenticates: signatures are neither made nor checked.
        let key = key.filter(|_| gs.policy.sender_signatures);
        let messages = match (own_messages, phase_keys_match(keys, &header)) {
            (Some(messages), true) => messages.into_iter().map(Bytes::from).collect(),
            _ => {
                let opened = keys.open(&payload[1..], key.as_deref()).map_err(|e| match e {
                    DataError::Malformed => RejectReason::Malformed,
                    DataError::AuthFailed => RejectReason::AuthFailed,
                    DataError::BadSignature => RejectReason::BadSignature,
                })?;
                opened.1
            }
        };
        let next = gs.next_from.entry(sender.clone()).or_insert(0);
        if header.seq < *next {
            return Err(RejectReason::Replay(header.seq));
        }
        *next = header.seq + 1;
        let message =
            |data| SecureEvent::Message { group: group.clone(), sender: sender.clone(), epoch: header.epoch, data };
        Ok(messages.into_iter().map(message).collect())
    }
}

/// Whether `keys` are those `header`'s message was sealed under (its group
/// and epoch): only then is an own message, matched byte for byte with what
/// was sent, read from what was sent.
fn phase_keys_match(keys: &EpochKeys, header: &DataHeader) -> bool {
    (keys.group(), keys.epoch()) == (&header.group, header.epoch)
}

/// The context every key agreement envelope of the group signs (and every
/// key derives from): the group's name, whether its data messages are
/// signed, and its interval algorithm if any. The policy's codes travel unsigned before the envelope; without
/// this, flipping the sender-signatures bit on the way would make an honest
/// member's message pass for one of another policy (and talk newcomers out of
/// the group).
fn engine_context(group: &GroupName, policy: &Policy) -> String {
    let mut context = group.as_str().to_owned();
    if !policy.sender_signatures {
        context.push_str("\0unsigned-data");
    }
    if let Some(i) = policy.interval {
        context.push_str("\0interval:");
        context.push_str(i.algorithm.name());
    }
    context
}

/// Whether this member's authority is not the group's: the oldest member
/// fixes the group's authority (as it fixes the policy), so a member that
/// could verify nobody else, and doubts the oldest member's issuer, is the
/// odd one out and stands aside. Members that accept anyone else take part:
/// a forged certificate in the oldest's name (which only raises a doubt)
/// cannot talk them out of the group.
fn foreign_authority(me: &MemberId, view: &View, gs: &GroupState) -> bool {
    let oldest = &view.members[0].id;
    oldest != me
        && matches!(gs.verdicts.get(oldest), Some(Verdict::Refused(_)))
        && gs.doubts.get(oldest) == Some(&Refusal::UnknownIssuer)
        && !gs.verdicts.iter().any(|(m, v)| m != me && matches!(v, Verdict::Accepted(_)))
}

/// Certified mode: the members accepted in the current view with their
/// identity keys, and nobody else: the run's explicit admission.
/// Whether a key agreement body is an interval rekey message (SEAL's leader's).
fn is_rekey_message(body: &[u8]) -> bool {
    conclave_gka::message::Envelope::decode(body).is_ok_and(|e| e.round == conclave_gka::protocols::seal::ROUND_REKEY)
}

/// See [`SessionCore::waiting_members`] (interval groups).
fn waiting_members(me: &MemberId, gs: &GroupState) -> Vec<MemberId> {
    let Some(view) = gs.view.as_ref() else { return Vec::new() };
    let outside = |key: &Members| {
        if key.is_list_of(view) {
            return Vec::new();
        }
        let key: MemberSet = key.iter().cloned().collect();
        view.ids().filter(|m| !key.contains(*m)).cloned().collect()
    };
    match &gs.phase {
        Phase::Secure(_) => outside(&gs.members),
        Phase::Confirming(c) => outside(&c.view.members),
        _ if view.contains(me) => vec![me.clone()],
        _ => Vec::new(),
    }
}

fn admitted(gs: &GroupState) -> StaticDirectory {
    let mut d = StaticDirectory::new();
    for (m, v) in &gs.verdicts {
        if let Verdict::Accepted(k) = v {
            d.insert(m.clone(), k.clone());
        }
    }
    d
}

/// The epoch of the group's current view: the engine's run, or (while the
/// view is held for certificates, before the engine has it) its first run.
fn current_epoch(gs: &GroupState) -> Option<Epoch> {
    if gs.engine.interval() {
        // The key in use (or being confirmed), whatever the view.
        return match &gs.phase {
            Phase::Secure(keys) => Some(keys.epoch()),
            Phase::Confirming(c) => Some(c.view.epoch),
            _ => None,
        };
    }
    let view = gs.view.as_ref()?.id;
    Some(match gs.engine.current_epoch() {
        Some(e) if e.view == view => e,
        _ => Epoch::new(view, 0),
    })
}

/// The identity key that signs `member`'s messages in `gs`'s current view:
/// its accepted certificate's (certified mode), or the directory's.
fn sender_key(
    certified: &Option<Certified>,
    directory: &dyn Directory,
    gs: &GroupState,
    member: &MemberId,
) -> Option<Arc<dyn Verifier>> {
    match certified {
        Some(_) => match gs.verdicts.get(member) {
            Some(Verdict::Accepted(k)) => Some(k.clone()),
            _ => None,
        },
        None => directory.verifier(member),
    }
}

/// Sends what waits, if the group has a key and no older message of ours is
/// still on its way back (so resent messages keep their place in the order),
/// in bundles ([`crate::data`]): as many messages as fit in one bundle, and
/// more bundles while fewer than [`BUNDLES_IN_FLIGHT`] of this member's are
/// on their way back. It is called when sending would not wait for anything:
/// by [`SessionCore::send`] only for an idle sender, and when one of ours
/// comes back or a key arrives; so under load, bundles grow with what the
/// application sends while they travel, and the signature per bundle is paid
/// for many messages.
fn flush(
    me: &MemberId,
    signer: &dyn Signer,
    group: &GroupName,
    gs: &mut GroupState,
    max_payload: usize,
) -> Vec<Transmit> {
    if gs.policy.mode == GroupMode::OptimizedEvs {
        return flush_evs(me, signer, group, gs, max_payload);
    }
    let Some(keys) = gs.phase.keys() else { return Vec::new() };
    let Some(view) = gs.view.as_ref().map(|v| v.id) else { return Vec::new() };
    // The oldest message in flight has the oldest epoch (see `in_flight`).
    if gs.leaving || gs.in_flight.front().is_some_and(|f| f.0 != keys.epoch()) {
        return Vec::new();
    }
    // What a bundle's messages may take: what the daemon takes, less the
    // frame's and the data message's most (every message alone fits: `send`
    // checks it).
    let room = max_payload.saturating_sub(LAYERED_OVERHEAD).min(BUNDLE_BYTES);
    let mut out = Vec::new();
    while gs.in_flight.len() < BUNDLES_IN_FLIGHT && !(gs.resend.is_empty() && gs.queue.is_empty()) {
        let bundle = take_bundle(&mut gs.resend, &mut gs.queue, room);
        // The frame's tag, then the data message, written once.
        let mut p = vec![crate::payload::tag::DATA];
        keys.seal_into(&mut p, me, view, gs.next_seq, &bundle, gs.policy.sender_signatures.then_some(signer));
        let p = Bytes::from(p);
        gs.in_flight.push_back((keys.epoch(), gs.next_seq, bundle, p.clone()));
        gs.next_seq += 1;
        out.push(Transmit::Multicast(group.clone(), p));
    }
    out
}

/// The next bundle of what waits: messages to send again first, in their
/// order, then new ones, as many as fit in `room` bytes, and one at least.
fn take_bundle(resend: &mut VecDeque<Vec<u8>>, queue: &mut VecDeque<Vec<u8>>, room: usize) -> Vec<Vec<u8>> {
    let mut bundle = Vec::new();
    let mut bytes = 0;
    while let Some(m) = resend.front().or_else(|| queue.front()) {
        if !bundle.is_empty() && bytes + BUNDLE_ENTRY_OVERHEAD + m.len() > room {
            break;
        }
        bytes += BUNDLE_ENTRY_OVERHEAD + m.len();
        bundle.push(resend.pop_front().or_else(|| queue.pop_front()).expect("front exists"));
    }
    bundle
}

/// [`flush`] for an Optimized EVS group: messages sealed once, in bundles
/// as [`flush`] sends them, under the daemon's key of the current view, and
/// never sent again — the daemons re-encrypt a bundle if it is delivered in a
/// later view.
fn flush_evs(
    me: &MemberId,
    signer: &dyn Signer,
    group: &GroupName,
    gs: &mut GroupState,
    max_payload: usize,
) -> Vec<Transmit> {
    if gs.phase.keys().is_none() || gs.leaving {
        return Vec::new();
    }
    let Some(view) = gs.view.as_ref().map(|v| v.id) else { return Vec::new() };
    let Some(key) = evs_key(&gs.evs_keys, view) else { return Vec::new() };
    let writer = Writer::Member(me.clone());
    let room = max_payload.saturating_sub(EVS_OVERHEAD).min(BUNDLE_BYTES);
    let mut out = Vec::new();
    while gs.evs_in_flight < BUNDLES_IN_FLIGHT && !gs.queue.is_empty() {
        let bundle = take_bundle(&mut gs.resend, &mut gs.queue, room);
        let data = crate::evs::bundle(&bundle);
        let seq = match &mut gs.evs_seq {
            Some((v, next)) if *v == view => next,
            slot => &mut slot.insert((view, 0)).1,
        };
        let n = *seq;
        *seq += 1;
        let signature = if gs.policy.sender_signatures {
            signer.sign(&crate::evs::signed(group, me, view, n, &data))
        } else {
            Vec::new()
        };
        let inner = crate::evs::encode(me, view, n, &signature, &data);
        let count = u32::try_from(bundle.len()).expect("a bundle fits a payload");
        let sealed = envelope::seal(key, group, view, &writer, n, count, &inner);
        gs.evs_in_flight += 1;
        out.push(Transmit::Multicast(group.clone(), sealed.into()));
    }
    out
}

/// Stops sending (see [`GroupState::leaving`]). Data held for a key's
/// confirmation is dropped — its senders send it again in the next view —
/// except in Optimized EVS groups, where nobody sends anything twice and the
/// members that move on with this one read it when the next view comes:
/// this member, still in the group until the daemon says otherwise, reads
/// it too.
fn leave_group(gs: &mut GroupState) {
    gs.leaving = true;
    gs.queue.clear();
    gs.in_flight.clear();
    gs.resend.clear();
    if gs.policy.mode != GroupMode::OptimizedEvs {
        gs.early.clear();
    }
}

/// What a member signs to bind its certificate to a group and view, so a
/// certificate (public) cannot be presented by anyone but its holder.
pub(crate) fn proof_transcript(group: &GroupName, view: ViewId, member: &MemberId, cert_der: &[u8]) -> Vec<u8> {
    let mut t = b"conclave/secure/v1/cert\0".to_vec();
    for part in [group.as_str().as_bytes(), member.as_str().as_bytes()] {
        t.extend_from_slice(&(part.len() as u16).to_be_bytes());
        t.extend_from_slice(part);
    }
    t.extend_from_slice(&view.to_bytes());
    t.extend_from_slice(&Sha256::digest(cert_der));
    t
}

#[cfg(feature = "test-hooks")]
impl SessionCore {
    /// Test hook: a copy of the current epoch's data keys (to model a member
    /// that kept them after leaving).
    pub fn epoch_keys(&self, group: &str) -> Option<EpochKeys> {
        self.groups.get(&GroupName::new(group).ok()?)?.phase.keys().cloned()
    }

    /// Test hook: every data message received, raw (`header ‖ ciphertext`),
    /// with the sender the daemon named.
    pub fn captured(&self, group: &str) -> Vec<(MemberId, Bytes)> {
        GroupName::new(group).ok().and_then(|g| self.groups.get(&g)).map(|g| g.captured.clone()).unwrap_or_default()
    }

    /// Test hook: from now on, `rewrite` may change the body of this
    /// member's outgoing key agreement messages in `group` (it gets the round
    /// and the body, and says whether it changed it); changed messages are
    /// re-signed, and this member's own engine still sees the originals.
    pub fn tamper_key_agreement(
        &mut self,
        group: &str,
        rewrite: impl FnMut(u8, &mut Vec<u8>) -> bool + Send + 'static,
    ) -> Result<(), SessionError> {
        let name = GroupName::new(group)?;
        let gs = self.groups.get_mut(&name).ok_or(SessionError::NotJoined(name))?;
        gs.tamper = Some(Tamper { rewrite: Box::new(rewrite), sent: BTreeMap::new() });
        Ok(())
    }

    /// Test hook: multicasts any payload as is.
    pub fn send_raw(&mut self, group: &str, payload: &[u8]) -> Result<(), SessionError> {
        self.push(Transmit::Multicast(GroupName::new(group)?, Bytes::copy_from_slice(payload)))
    }

    /// Test hook: this member's certificate message for `view` of `group`
    /// (certified mode), as it would present it there.
    pub fn cert_message(&self, group: &str, view: ViewId) -> Option<Vec<u8>> {
        let cert = self.certified.as_ref()?;
        let group = GroupName::new(group).ok()?;
        let cert_der = cert.identity.cert_der();
        let sig = self.signer.sign(&proof_transcript(&group, view, &self.me, cert_der));
        let body = cert_body(cert_der, &sig);
        Some(Frame::Trust { kind: TrustKind::Cert, view, body: &body }.encode())
    }

    /// Test hook: a timeout notice of this member's naming `names` in `view`
    /// of `group`, signed as it would sign one there.
    pub fn timeout_message(&self, group: &str, view: ViewId, names: &[MemberId]) -> Option<Vec<u8>> {
        let group = GroupName::new(group).ok()?;
        let names = timeout_names_part(names);
        let signature = self.signer.sign(&timeout_signed(&group, view, &self.me, &names));
        let body = timeout_body(&names, &signature);
        Some(Frame::Trust { kind: TrustKind::Timeout, view, body: &body }.encode())
    }

    /// Test hook: multicasts a raw data message (`header ‖ ciphertext`) as is.
    pub fn send_raw_data(&mut self, group: &str, raw: &[u8]) -> Result<(), SessionError> {
        let p = Frame::Data(raw).encode();
        self.push(Transmit::Multicast(GroupName::new(group)?, p.into()))
    }
}

/// Test hook: applies the group's tampering, if any, to an engine message.
#[cfg(feature = "test-hooks")]
fn tampered(gs: &mut GroupState, signer: &dyn Signer, bytes: Vec<u8>) -> Vec<u8> {
    let Some(t) = gs.tamper.as_mut() else { return bytes };
    let Ok(mut env) = conclave_gka::message::Envelope::decode(&bytes) else { return bytes };
    if !(t.rewrite)(env.round, &mut env.body) {
        return bytes;
    }
    env.signature = signer.sign(&env.signed_bytes());
    let forged = env.encode();
    t.sent.insert(forged.clone(), bytes);
    forged
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever two views hold and in whatever order, the set updated
        /// from one to the other is the second's members; names shared by
        /// both are the same allocations or equal copies.
        #[test]
        fn a_views_member_set_follows_any_change(
            old in proptest::collection::vec(0u8..24, 0..16),
            new in proptest::collection::vec((0u8..24, proptest::bool::ANY, proptest::bool::ANY), 0..16),
        ) {
            let names: Vec<MemberId> = (0..24).map(|i| MemberId::new(format!("m{i}")).unwrap()).collect();
            let mut seen = std::collections::BTreeSet::new();
            let old: Vec<u8> = old.into_iter().filter(|i| seen.insert(*i)).collect();
            let mut seen = std::collections::BTreeSet::new();
            let new: Vec<(u8, bool, bool)> = new.into_iter().filter(|(i, ..)| seen.insert(*i)).collect();
            let old_view = View {
                id: ViewId::new(1, 1),
                members: old.iter().map(|&i| conclave_gcs::ViewMember { id: names[i as usize].clone(), prev: None }).collect(),
                cause: conclave_gcs::Cause::Join,
            };
            let new_view = View {
                id: ViewId::new(1, 2),
                members: new
                    .iter()
                    .map(|&(i, stayed, copy)| conclave_gcs::ViewMember {
                        id: if copy { MemberId::new(format!("m{i}")).unwrap() } else { names[i as usize].clone() },
                        prev: stayed.then_some(old_view.id),
                    })
                    .collect(),
                cause: conclave_gcs::Cause::Join,
            };
            let mut set: MemberSet = old_view.ids().cloned().collect();
            update_members(&mut set, &old_view, &new_view);
            let expected: MemberSet = new_view.ids().cloned().collect();
            proptest::prop_assert_eq!(set, expected);
        }
    }

    #[test]
    fn held_messages_are_bounded_in_bytes_per_sender_and_in_total() {
        let m = |s: &str| MemberId::new(s).unwrap();
        let mut held = Held::default();
        let chunk = Bytes::from(vec![0u8; 64 << 10]);
        let per_sender = MAX_HELD_BYTES_PER_SENDER / chunk.len();
        for _ in 0..per_sender {
            assert!(held.push(m("mallory"), ViewId::new(1, 1), chunk.clone()));
        }
        assert!(!held.push(m("mallory"), ViewId::new(1, 1), chunk.clone()), "one sender past its share");
        assert_eq!(held.dropped, 1);
        // Others still get in, until the total budget is spent.
        let mut others = 0;
        while held.push(m(&format!("m{}", others / per_sender)), ViewId::new(1, 1), chunk.clone()) {
            others += 1;
        }
        assert_eq!(held.bytes, MAX_HELD_BYTES);
        assert_eq!((per_sender + others) * chunk.len(), MAX_HELD_BYTES);
        assert_eq!(held.take().len(), per_sender + others);
        assert_eq!((held.bytes, held.per_sender.len()), (0, 0));
    }

    #[test]
    fn a_key_of_the_whole_view_confirms_over_the_digest_its_view_came_with() {
        use conclave_gka::suite::{generate_signer, SignatureId};
        use rand_core::SeedableRng;
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
        let signer = generate_signer(SignatureId::Ed25519, &mut rng).unwrap();
        let me = MemberId::new("m0").unwrap();
        let mut core = SessionCore::new(me, signer, Arc::new(StaticDirectory::new()), Box::new(rng), Instant::now());
        let policy = Policy::new(conclave_gka::ProtocolId::Tgdh, conclave_gka::GroupId::Ristretto255);
        core.join(Instant::now(), "g", policy).unwrap();
        let gs = core.groups.get_mut(&GroupName::new("g").unwrap()).unwrap();
        let view = |seq, names: &[&str]| View {
            id: ViewId::new(1, seq),
            members: names
                .iter()
                .map(|n| conclave_gcs::ViewMember { id: MemberId::new(*n).unwrap(), prev: None })
                .collect(),
            cause: conclave_gcs::Cause::Join,
        };
        let digest_of = |v: &View| ListDigest::of(v.members.iter().map(|m| &m.id));
        let (first, second) = (view(1, &["m0", "m1"]), view(2, &["m0", "m1", "m2"]));
        gs.enter_view(first.clone());
        gs.digest_view();
        gs.enter_view(second.clone());
        gs.digest_view();
        // The current view's list: its digest, as it came.
        assert_eq!(gs.members_digest(&Members::of_view(&second)), digest_of(&second));
        // Any other list (a key of an earlier view, or of part of one) is
        // digested from its own names, never given the current view's.
        assert_eq!(gs.members_digest(&Members::of_view(&first)), digest_of(&first));
        let copy = Members::from(second.ids().cloned().collect::<Vec<_>>());
        assert_eq!(gs.members_digest(&copy), digest_of(&second), "the same names, another list");
        assert_ne!(digest_of(&first), digest_of(&second));
        // A view entered without a run (superseded when it came) has no
        // digest of its own, and never the last view's.
        let third = view(3, &["m0", "m2"]);
        gs.enter_view(third.clone());
        assert_eq!(gs.view_digest, None);
        assert_eq!(gs.members_digest(&Members::of_view(&third)), digest_of(&third));
    }

    #[test]
    fn settling_accepts_matching_macs_and_checks_only_the_others_signatures() {
        use conclave_gka::suite::{generate_signer, SignatureId};
        use rand_core::SeedableRng;
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(9);
        let group = GroupName::new("g").unwrap();
        let epoch = Epoch { view: ViewId { incarnation: 1, seq: 2 }, run: 0 };
        let names: Vec<MemberId> = (0..6).map(|i| MemberId::new(format!("m{i}")).unwrap()).collect();
        let confirmer =
            Confirmer::new(&[7; 32], &group, epoch, conclave_gka::ProtocolId::Tgdh, &ListDigest::of(&names));
        let mut confirms = Confirmations::default();
        // (MAC matches this member's key, signature valid)
        let cases = [(true, true), (true, false), (false, true), (false, false), (false, true), (false, false)];
        for (sender, (matching, valid)) in names.iter().zip(cases) {
            let signer = generate_signer(SignatureId::Ed25519, &mut rng).unwrap();
            let mac = if matching { confirmer.mac(sender) } else { [9; 32] };
            let signed = confirm_signed(&group, sender, epoch, &mac);
            let mut signature = signer.sign(&signed);
            if !valid {
                signature[7] ^= 0x20;
            }
            confirms.pending.insert(sender.clone(), vec![Unchecked { mac, signature, signed, key: signer.verifier() }]);
        }
        let forged: Vec<String> = confirms.settle(&confirmer).iter().map(|m| m.to_string()).collect();
        assert_eq!(forged, ["m3", "m5"], "a MAC that does not match, under a signature that does not verify");
        let accepted: Vec<&str> = confirms.accepted.keys().map(|m| m.as_str()).collect();
        assert_eq!(accepted, ["m0", "m1", "m2", "m4"], "m1's MAC matches: its signature is never needed");
        assert!(confirms.pending.is_empty());
        assert!(!confirmer.matches(&names[2], &confirms.accepted[&names[2]]), "m2 holds another key");
        // The run is decided on the accepted MACs that did not match, which
        // settling recorded: no MAC is computed again.
        let unmatched: Vec<&str> = confirms.unmatched.iter().map(|m| m.as_str()).collect();
        assert_eq!(unmatched, ["m2", "m4"]);
        for m in confirms.accepted.keys() {
            assert_eq!(confirms.unmatched.contains(m), !confirmer.matches(m, &confirms.accepted[m]), "{m}");
        }
        confirms.clear();
        assert!(confirms.unmatched.is_empty());
    }
}
