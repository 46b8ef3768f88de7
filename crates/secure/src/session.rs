//! The session: one daemon connection, any number of secure groups.
//!
//! [`Session::recv`] is the engine room: it reads the daemon's deliveries,
//! feeds views and key agreement messages to each group's [`Engine`], sends
//! what the engines ask for, installs keys, decrypts data messages and turns
//! all of that into [`SecureEvent`]s. Nothing happens while nobody calls
//! `recv`, so an application keeps calling it (it is cancel-safe: use it in
//! `tokio::select!`). Outgoing traffic goes through an internal writer task,
//! so [`Session::join`], [`Session::send`] and [`Session::leave`] never block.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use conclave_gcs::{GroupName, MemberId, View};
use conclave_gcs_net::{Client, ClientSender, ErrorCode, Event, Service};
use conclave_gka::suite::Signer;
use conclave_gka::{Config, Directory, Engine, GroupId, Output, ProtocolId, SecureView};
use rand_core::OsRng;
use tokio::sync::mpsc;

use crate::data::{DataError, DataHeader, EpochKeys, TAG_LEN};
use crate::{Policy, RejectReason, SecureEvent, SecureViewInfo, SessionError};

/// Payload tags: the first byte of every payload this layer puts on the daemon group.
pub(crate) mod tag {
    /// A key agreement message: `tag ‖ protocol code ‖ group code ‖ engine bytes`.
    pub const KA: u8 = 1;
    /// A data message: `tag ‖ header ‖ ciphertext`.
    pub const DATA: u8 = 2;
    /// The oldest member telling a newcomer the group's policy differs from
    /// its own: `tag ‖ protocol code ‖ group code`.
    pub const POLICY: u8 = 3;
}

/// Largest number of data messages held for a view whose key is not agreed yet.
const MAX_EARLY: usize = 4096;

enum Outgoing {
    Join(GroupName),
    Leave(GroupName),
    Multicast(GroupName, Bytes),
    Unicast(GroupName, MemberId, Bytes),
}

struct GroupState {
    policy: Policy,
    engine: Box<dyn Engine>,
    /// The daemon's current view of the group.
    view: Option<View>,
    /// When the first view not yet secured arrived.
    rekey_since: Option<Instant>,
    /// Keys of the current secure view; `None` while a rekey runs.
    keys: Option<EpochKeys>,
    members: Vec<MemberId>,
    next_seq: u64,
    /// Plaintexts waiting for a key, in send order.
    queue: VecDeque<Vec<u8>>,
    /// Own messages sent whose delivery back to us is pending: (epoch, plaintext).
    in_flight: VecDeque<(u64, u64, Vec<u8>)>,
    /// Own messages that must go out again under the next key, in send order.
    resend: VecDeque<Vec<u8>>,
    /// Data messages of the current view that came before its key.
    early: Vec<(MemberId, Bytes)>,
    /// Next acceptable sequence number per sender, in the current epoch.
    next_from: BTreeMap<MemberId, u64>,
    /// Whether this member has ever installed a key in the group.
    established: bool,
    /// Asked to leave: no more sends. Until the leave takes effect the
    /// member still takes part in key agreement (so nobody waits for it) and
    /// receives what is sent in its views.
    leaving: bool,
    /// Taken out for a policy mismatch: every input is ignored.
    ousted: bool,
    #[cfg(feature = "test-hooks")]
    captured: Vec<(MemberId, Bytes)>,
}

/// A connection to a daemon with secure groups over it. See the module doc.
pub struct Session {
    me: MemberId,
    signer: Arc<dyn Signer>,
    directory: Arc<dyn Directory>,
    out: mpsc::UnboundedSender<Outgoing>,
    rx: conclave_gcs_net::ClientReceiver,
    groups: BTreeMap<GroupName, GroupState>,
    events: VecDeque<SecureEvent>,
    max_payload: usize,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("me", &self.me).field("groups", &self.groups.keys()).finish()
    }
}

async fn writer(tx: ClientSender, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
    while let Some(o) = rx.recv().await {
        let res = match o {
            Outgoing::Join(g) => tx.join(g.as_str()).await,
            Outgoing::Leave(g) => tx.leave(g.as_str()).await,
            Outgoing::Multicast(g, b) => tx.multicast(g.as_str(), Service::Agreed, b).await,
            Outgoing::Unicast(g, to, b) => tx.unicast(g.as_str(), to.as_str(), b).await,
        };
        if let Err(e) = res {
            tracing::warn!(error = %e, "secure session: sending to the daemon failed; writer stops");
            return;
        }
    }
}

impl Session {
    /// Wraps a connected client. `me` must be the name the client connected
    /// with; `identity` signs this member's key agreement messages and
    /// `directory` says whose messages to trust. Must be called inside a
    /// tokio runtime (it spawns the writer task).
    pub fn connect(client: Client, me: MemberId, identity: Arc<dyn Signer>, directory: Arc<dyn Directory>) -> Session {
        let (tx, rx) = client.split();
        let (out, out_rx) = mpsc::unbounded_channel();
        tokio::spawn(writer(tx, out_rx));
        Session {
            me,
            signer: identity,
            directory,
            out,
            rx,
            groups: BTreeMap::new(),
            events: VecDeque::new(),
            max_payload: conclave_gcs::wire::DEFAULT_MAX_PAYLOAD,
        }
    }

    /// Connects to a daemon's Unix socket as `name`, then [`Session::connect`].
    pub async fn connect_unix(
        path: impl AsRef<std::path::Path>,
        name: &str,
        identity: Arc<dyn Signer>,
        directory: Arc<dyn Directory>,
    ) -> Result<Session, SessionError> {
        let me = MemberId::new(name)?;
        let client = Client::connect_unix(path, name).await?;
        Ok(Self::connect(client, me, identity, directory))
    }

    /// This member.
    pub fn me(&self) -> &MemberId {
        &self.me
    }

    /// Joins `group` with `policy`. The group's first member fixes the
    /// policy; a joiner whose policy differs gets
    /// [`SecureEvent::PolicyMismatch`] and is taken out of the group.
    pub fn join(&mut self, group: &str, policy: Policy) -> Result<(), SessionError> {
        let name = GroupName::new(group)?;
        if self.groups.contains_key(&name) {
            return Err(SessionError::AlreadyJoined(name));
        }
        let engine = conclave_gka::new_engine(Config {
            protocol: policy.protocol,
            group_id: policy.group_id,
            group: name.as_str().to_owned(),
            me: self.me.clone(),
            signer: self.signer.clone(),
            directory: self.directory.clone(),
        });
        self.groups.insert(
            name.clone(),
            GroupState {
                policy,
                engine,
                view: None,
                rekey_since: None,
                keys: None,
                members: Vec::new(),
                next_seq: 0,
                queue: VecDeque::new(),
                in_flight: VecDeque::new(),
                resend: VecDeque::new(),
                early: Vec::new(),
                next_from: BTreeMap::new(),
                established: false,
                leaving: false,
                ousted: false,
                #[cfg(feature = "test-hooks")]
                captured: Vec::new(),
            },
        );
        self.push(Outgoing::Join(name))
    }

    /// Sends `data` to the group, encrypted under the current key. During a
    /// rekey (or before the first secure view) the message waits and goes
    /// out under the next key; it is not lost.
    pub fn send(&mut self, group: &str, data: &[u8]) -> Result<(), SessionError> {
        let name = GroupName::new(group)?;
        // tag + header (at most 1 + 128 + 8 + 1 + 255 + 8) + AEAD tag.
        let overhead = 1 + 401 + TAG_LEN;
        if data.len() + overhead > self.max_payload {
            return Err(SessionError::TooLarge { len: data.len(), max: self.max_payload.saturating_sub(overhead) });
        }
        let gs = self.groups.get_mut(&name).filter(|g| !g.leaving).ok_or(SessionError::NotJoined(name.clone()))?;
        gs.queue.push_back(data.to_vec());
        let sends = flush(&self.me, &name, gs);
        self.push_all(sends)
    }

    /// Leaves the group; [`SecureEvent::Left`] confirms it. Messages still
    /// waiting for a key are dropped.
    pub fn leave(&mut self, group: &str) -> Result<(), SessionError> {
        let name = GroupName::new(group)?;
        let gs = self.groups.get_mut(&name).filter(|g| !g.leaving).ok_or(SessionError::NotJoined(name.clone()))?;
        leave_group(gs);
        self.push(Outgoing::Leave(name))
    }

    /// The current secure view of a group (`None` before the first one and
    /// while a rekey runs).
    pub fn secure_members(&self, group: &str) -> Option<&[MemberId]> {
        let gs = self.groups.get(&GroupName::new(group).ok()?)?;
        gs.keys.as_ref().map(|_| gs.members.as_slice())
    }

    /// The next event. Cancel-safe: nothing is lost if the future is dropped.
    pub async fn recv(&mut self) -> Result<SecureEvent, SessionError> {
        loop {
            if let Some(ev) = self.events.pop_front() {
                return Ok(ev);
            }
            let d = self.rx.recv().await?;
            self.handle(d)?;
        }
    }

    fn push(&self, o: Outgoing) -> Result<(), SessionError> {
        self.out.send(o).map_err(|_| SessionError::Closed)
    }

    fn push_all(&self, os: Vec<Outgoing>) -> Result<(), SessionError> {
        os.into_iter().try_for_each(|o| self.push(o))
    }

    fn handle(&mut self, d: Event) -> Result<(), SessionError> {
        match d {
            Event::View { group, view } => self.on_view(group, view),
            Event::Message { group, sender, view, payload, .. } => {
                self.on_payload(group, sender, view.0, payload, false)
            }
            Event::Unicast { group, sender, view, payload } => self.on_payload(group, sender, view.0, payload, true),
            Event::Left { group } => {
                if self.groups.remove(&group).is_some() {
                    self.events.push_back(SecureEvent::Left { group });
                }
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
            Event::Welcome { .. } | Event::ViewChangeBegins { .. } => Ok(()),
        }
    }

    fn on_view(&mut self, group: GroupName, view: View) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(&group).filter(|g| !g.ousted) else { return Ok(()) };
        // A new view ends the epoch: its keys are erased now (messages
        // delivered from here on are of the new view), and sends wait.
        gs.keys = None;
        gs.early.clear();
        gs.next_from.clear();
        gs.rekey_since.get_or_insert_with(Instant::now);
        gs.view = Some(view.clone());
        tracing::debug!(%group, view = %view.id, n = view.members.len(), "view; rekeying");
        let res = gs.engine.on_view(&view, &mut OsRng);
        self.engine_result(&group, None, res)
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
                    (E::BadSignature(_) | E::UnknownSender(_) | E::Decode(_) | E::NotAMember(_), Some(from)) => {
                        self.events.push_back(SecureEvent::Rejected {
                            group: group.clone(),
                            sender: from.clone(),
                            reason: RejectReason::KeyAgreement(e.to_string()),
                        })
                    }
                    _ => tracing::debug!(%group, error = %e, "key agreement input dropped"),
                }
                return Ok(());
            }
        };
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let mut sends = Vec::new();
        let mut installed = None;
        for o in outputs {
            match o {
                Output::Send { to, bytes } => {
                    let mut p = Vec::with_capacity(bytes.len() + 3);
                    p.extend_from_slice(&[tag::KA, gs.policy.protocol.code(), gs.policy.group_id.code()]);
                    p.extend_from_slice(&bytes);
                    sends.push(match to {
                        None => Outgoing::Multicast(group.clone(), p.into()),
                        Some(to) => Outgoing::Unicast(group.clone(), to, p.into()),
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

    fn install(&mut self, group: &GroupName, sv: SecureView) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        if gs.view.as_ref().map(|v| v.id) != Some(sv.view_id) {
            tracing::debug!(%group, "key for a superseded view dropped");
            return Ok(());
        }
        let epoch = sv.epoch.0;
        gs.keys = Some(EpochKeys::new(group.clone(), epoch, &sv.key));
        gs.members = sv.members.clone();
        gs.next_seq = 0;
        gs.next_from.clear();
        gs.established = true;
        let rekey_time = gs.rekey_since.take().map(|t| t.elapsed()).unwrap_or(Duration::ZERO);
        tracing::debug!(%group, epoch, fp = %sv.key.fingerprint(), ?rekey_time, "secure view installed");
        self.events.push_back(SecureEvent::View(SecureViewInfo {
            group: group.clone(),
            members: sv.members,
            epoch,
            protocol: sv.protocol,
            fingerprint: sv.key.fingerprint(),
            rekey_time,
        }));
        let early = std::mem::take(&mut gs.early);
        let view = epoch;
        for (sender, payload) in early {
            self.on_data(group, sender, view, payload)?;
        }
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let sends = flush(&self.me, group, gs);
        self.push_all(sends)
    }

    fn on_payload(
        &mut self,
        group: GroupName,
        sender: MemberId,
        view: u64,
        payload: Bytes,
        unicast: bool,
    ) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(&group) else { return Ok(()) };
        if gs.ousted {
            return Ok(());
        }
        match payload.first().copied() {
            Some(tag::KA) if payload.len() >= 3 => {
                let theirs = (payload[1], payload[2]);
                if theirs != (gs.policy.protocol.code(), gs.policy.group_id.code()) {
                    return self.on_foreign_policy(group, sender, theirs);
                }
                let res = gs.engine.on_message(&sender, &payload[3..], &mut OsRng);
                self.engine_result(&group, Some(&sender), res)
            }
            Some(tag::POLICY) if payload.len() == 3 && unicast => {
                self.on_foreign_policy(group, sender, (payload[1], payload[2]))
            }
            Some(tag::DATA) if !unicast => {
                #[cfg(feature = "test-hooks")]
                gs.captured.push((sender.clone(), payload.slice(1..)));
                self.on_data(&group, sender, view, payload)
            }
            _ => {
                self.events.push_back(SecureEvent::Rejected { group, sender, reason: RejectReason::Malformed });
                Ok(())
            }
        }
    }

    /// A key agreement message made under another policy. The older member's
    /// policy wins: a newcomer that hears from an older member learns that it
    /// is the odd one out and leaves; the oldest member tells a newer member
    /// with another policy so.
    fn on_foreign_policy(&mut self, group: GroupName, sender: MemberId, theirs: (u8, u8)) -> Result<(), SessionError> {
        let Some(gs) = self.groups.get_mut(&group) else { return Ok(()) };
        let Some(view) = gs.view.as_ref() else { return Ok(()) };
        let pos = |m: &MemberId| view.members.iter().position(|v| &v.id == m);
        let (Some(me), Some(them)) = (pos(&self.me), pos(&sender)) else { return Ok(()) };
        if them < me && !gs.established {
            let theirs = decode_policy(theirs);
            tracing::warn!(%group, %sender, "the group runs another key agreement policy; leaving");
            let ours = gs.policy;
            leave_group(gs);
            gs.ousted = true;
            gs.keys = None;
            self.events.push_back(SecureEvent::PolicyMismatch { group: group.clone(), ours, theirs, from: sender });
            return self.push(Outgoing::Leave(group));
        }
        if me == 0 {
            let p = [tag::POLICY, gs.policy.protocol.code(), gs.policy.group_id.code()];
            self.push(Outgoing::Unicast(group.clone(), sender.clone(), Bytes::copy_from_slice(&p)))?;
        }
        self.events.push_back(SecureEvent::Rejected { group, sender, reason: RejectReason::PolicyMismatch });
        Ok(())
    }

    fn on_data(&mut self, group: &GroupName, sender: MemberId, view: u64, payload: Bytes) -> Result<(), SessionError> {
        let res = self.open_data(group, &sender, view, payload);
        match res {
            Ok(Some(ev)) => self.events.push_back(ev),
            Ok(None) => {}
            Err(reason) => self.events.push_back(SecureEvent::Rejected { group: group.clone(), sender, reason }),
        }
        let Some(gs) = self.groups.get_mut(group) else { return Ok(()) };
        let sends = flush(&self.me, group, gs);
        self.push_all(sends)
    }

    /// The checks on a data message, in order: well formed, our own coming
    /// back, group and sender match what the daemon says, epoch, key,
    /// membership, authenticity, replay.
    fn open_data(
        &mut self,
        group: &GroupName,
        sender: &MemberId,
        view: u64,
        payload: Bytes,
    ) -> Result<Option<SecureEvent>, RejectReason> {
        let Some(gs) = self.groups.get_mut(group) else { return Ok(None) };
        let (header, _, _) = DataHeader::decode(&payload[1..]).map_err(|_| RejectReason::Malformed)?;
        if *sender == self.me && header.sender == self.me {
            // Our own message coming back (in send order).
            if gs.in_flight.front().is_some_and(|f| (f.0, f.1) == (header.epoch, header.seq)) {
                let (epoch, _, pt) = gs.in_flight.pop_front().expect("front exists");
                if epoch != view {
                    // Sent just before a view change and delivered in the
                    // next view, where nobody accepts it: send it again under
                    // the next key, before anything sent later.
                    gs.resend.push_back(pt);
                    return Ok(None);
                }
            }
        }
        if header.group != *group || header.sender != *sender {
            return Err(RejectReason::UnknownSender);
        }
        if header.epoch != view {
            let was_here = gs.view.as_ref().and_then(|v| v.member(sender)).is_some_and(|m| m.prev.is_some());
            if header.epoch < view && was_here {
                // Sent under an earlier key, delivered after a view change:
                // its sender sends it again under the new key.
                tracing::debug!(%group, %sender, "message of an earlier epoch dropped");
                return Ok(None);
            }
            return Err(RejectReason::UnknownEpoch(header.epoch));
        }
        let Some(keys) = gs.keys.as_ref() else {
            // Of this view, but its key is not agreed here yet.
            if gs.early.len() >= MAX_EARLY {
                return Err(RejectReason::UnknownEpoch(header.epoch));
            }
            gs.early.push((sender.clone(), payload));
            return Ok(None);
        };
        if !gs.members.contains(sender) {
            return Err(RejectReason::UnknownSender);
        }
        let (_, data) = keys.open(&payload[1..]).map_err(|e| match e {
            DataError::Malformed => RejectReason::Malformed,
            DataError::AuthFailed => RejectReason::AuthFailed,
        })?;
        let next = gs.next_from.entry(sender.clone()).or_insert(0);
        if header.seq < *next {
            return Err(RejectReason::Replay(header.seq));
        }
        *next = header.seq + 1;
        Ok(Some(SecureEvent::Message { group: group.clone(), sender: sender.clone(), epoch: header.epoch, data }))
    }
}

/// Sends what waits, if the group has a key and no older message of ours is
/// still on its way back (so resent messages keep their place in the order).
fn flush(me: &MemberId, group: &GroupName, gs: &mut GroupState) -> Vec<Outgoing> {
    let Some(keys) = gs.keys.as_ref() else { return Vec::new() };
    if gs.leaving || gs.in_flight.iter().any(|f| f.0 != keys.epoch()) {
        return Vec::new();
    }
    let mut out = Vec::new();
    while let Some(pt) = gs.resend.pop_front().or_else(|| gs.queue.pop_front()) {
        let mut p = vec![tag::DATA];
        p.extend_from_slice(&keys.seal(me, gs.next_seq, &pt));
        gs.in_flight.push_back((keys.epoch(), gs.next_seq, pt));
        gs.next_seq += 1;
        out.push(Outgoing::Multicast(group.clone(), p.into()));
    }
    out
}

/// Stops sending (see [`GroupState::leaving`]).
fn leave_group(gs: &mut GroupState) {
    gs.leaving = true;
    gs.queue.clear();
    gs.in_flight.clear();
    gs.resend.clear();
    gs.early.clear();
}

fn decode_policy((p, g): (u8, u8)) -> Option<Policy> {
    Some(Policy { protocol: ProtocolId::from_code(p)?, group_id: GroupId::ALL.into_iter().find(|x| x.code() == g)? })
}

#[cfg(feature = "test-hooks")]
impl Session {
    /// Test hook: a copy of the current epoch's data keys (to model a member
    /// that kept them after leaving).
    pub fn epoch_keys(&self, group: &str) -> Option<EpochKeys> {
        self.groups.get(&GroupName::new(group).ok()?)?.keys.clone()
    }

    /// Test hook: every data message received, raw (`header ‖ ciphertext`),
    /// with the sender the daemon named.
    pub fn captured(&self, group: &str) -> Vec<(MemberId, Bytes)> {
        GroupName::new(group).ok().and_then(|g| self.groups.get(&g)).map(|g| g.captured.clone()).unwrap_or_default()
    }

    /// Test hook: multicasts a raw data message (`header ‖ ciphertext`) as is.
    pub fn send_raw_data(&mut self, group: &str, raw: &[u8]) -> Result<(), SessionError> {
        let mut p = vec![tag::DATA];
        p.extend_from_slice(raw);
        self.push(Outgoing::Multicast(GroupName::new(group)?, p.into()))
    }
}
