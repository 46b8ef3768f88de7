//! The daemon core: lightweight groups over one totally ordered stream.
//!
//! A [`Core`] is a deterministic state machine with no I/O. It consumes
//! [`Op`]s — what clients asked for, and what the daemon group itself went
//! through — in one total order, and answers with [`Output`]s: [`Delivery`]s
//! addressed to this daemon's clients, and (in a cluster) state it must send
//! to the other daemons. Every daemon that is fed the same stream computes the
//! same groups and the same views; it only delivers to its own clients. That
//! is the Spread design: a client's join or leave is one ordered operation, not
//! a membership protocol; only a change of the daemon group is costly.
//!
//! Who orders the stream is the backbone's business: a single daemon orders
//! its clients' requests by arrival (*standalone*); a cluster orders the
//! requests of all daemons with an existing group communication engine.
//!
//! # Semantics
//!
//! * **Connections.** A client connects with a name ([`MemberId`]) that must
//!   be unique among connected clients ([`ErrorCode::NameTaken`] otherwise);
//!   it is greeted with [`Delivery::Welcome`].
//! * **Views.** Every change of a group's membership installs a new [`View`]
//!   and delivers it to every member of the new view. View ids are unique: they
//!   come from one counter in the core (see [`ViewId`] layout below). Members are
//!   listed in join order, oldest first; each member's `prev` is the id of the
//!   view of this group it was in just before (`None` for a member that just
//!   joined). The cause says why: [`Cause::Join`], [`Cause::Leave`],
//!   [`Cause::Disconnect`] (the client went away) or [`Cause::Network`] (the
//!   daemon group changed). All members see the same sequence of views, since
//!   views are computed from the one stream.
//! * **Leaving.** The leaver gets [`Delivery::Left`] and nothing more from the
//!   group; the others get the new view. A group with no members ceases to
//!   exist.
//! * **Multicast.** A multicast is delivered to every member of the group's
//!   current view, the sender included, tagged with that view's id. The order
//!   is the stream order, which is one total order over all senders of a group
//!   (*agreed*) and therefore also FIFO per sender; [`Service::Fifo`] and
//!   [`Service::Agreed`] are both honoured by it and the service is passed on
//!   to receivers as the sender chose it.
//! * **Unicast.** A unicast names one member of the group and is delivered to
//!   that member only, in the same order as the group's multicasts.
//! * **Virtual synchrony.** A view change is a point in the stream: a message
//!   ordered before it is delivered in the old view, to every member of the old
//!   view, before the new view; one ordered after it is delivered in the new
//!   view. So members that move from one view to the next together have
//!   delivered the same messages in the first, and every message is delivered
//!   in the view in which it was sent (ordered).
//! * **Closed and open groups.** Groups are closed by default: only members
//!   may send ([`ErrorCode::NotMember`] otherwise). A group created with
//!   `open: true` accepts multicasts and unicasts from any connected client; a
//!   non-member sender does not receive its own multicast. The option is set
//!   by the join that creates the group and ignored on later joins.
//! * **Errors** are delivered to the client whose request failed, as
//!   [`Delivery::Error`]; a failed request changes nothing. Errors whose code
//!   [`is fatal`](ErrorCode::is_fatal) end the connection.
//!
//! * **Keyed groups.** A join may ask for a group *keyed* by its daemons
//!   (the integrated architecture's Integrated VS): the daemons agree a key
//!   among themselves and give each view of the group its own key, which a
//!   daemon delivers to its members in [`Delivery::GroupKey`] just before the
//!   view. The choice is the creator's: a join that asks otherwise is refused
//!   ([`ErrorCode::ModeMismatch`]). The core only records it
//!   ([`Core::keyed`]) and orders the daemons' key agreement traffic
//!   ([`Op::DaemonKa`]) with everything else; the key agreement and the keys
//!   are a machine around the core's (`conclave-integrated`).
//!
//! # The daemon group (cluster backbones)
//!
//! A standalone backbone never produces [`Op::Daemons`] or [`Op::State`];
//! the core starts as the only daemon of its group. A cluster backbone
//! reports every change of the daemon group with [`Op::Daemons`]. Then:
//!
//! 1. every member of a group is told [`Delivery::ViewChangeBegins`]
//!    (Spread's transitional signal: no more messages in the current view);
//! 2. every daemon of the new daemon group sends its state — its own clients
//!    and their groups, as they stood when the change was ordered — by an
//!    [`Output::Submit`] of [`Op::State`]; client operations ordered during
//!    the exchange are held, not lost;
//! 3. when the states of all daemons are in, every core rebuilds the same
//!    groups from them: clients of daemons that are gone are dropped, clients
//!    of daemons that arrived are added (a name claimed on both sides of a
//!    merge stays with the lower daemon; the other client gets a fatal
//!    [`ErrorCode::NameTaken`]), every group gets a new view with cause
//!    [`Cause::Network`], and the held operations are applied in order.
//!
//! A new [`Op::Daemons`] during an exchange restarts it. The held operations
//! are kept if every daemon of the new group was in the old one: those daemons
//! moved together and so (virtual synchrony of the backbone) hold the same
//! operations. If daemons arrived, they never saw the held operations, so every
//! daemon drops them and submits its own clients' held operations again, to be
//! ordered in the new daemon group where everyone sees them. Operations from
//! connections of daemons outside the daemon group are dropped: a backbone
//! that is correct never orders them.
//!
//! That the daemons of the new group hold the same operations is not always
//! so: when changes come faster than exchanges finish, one transitional set
//! may complete an exchange (and apply the held operations) that another one,
//! which missed a state, does not. The second set's daemons then submit their
//! own clients' operations again, where the first set has applied them
//! already. So a cluster numbers its client operations (next section) and a
//! core applies each numbered operation at most once.
//!
//! # Operation identities
//!
//! A cluster backbone's shell submits every client operation as an
//! [`Op::Numbered`]: its [`OpId`] is the daemon's incarnation
//! ([`Core::incarnation`]) and the daemon's next number, 0, 1, 2, … in the
//! order it submits client operations; the origin is the daemon of the
//! operation's connection. Held operations are submitted again with the ids
//! they had. Plain client operations (the standalone backbone's) are applied
//! as they come.
//!
//! An operation has its effect in one of two places, and a core keeps one
//! record of applied numbers per origin for each:
//!
//! * **In the groups** (connect, disconnect, join, leave). An exchange
//!   rebuilds the groups from the states, and each daemon's state speaks for
//!   its own clients only, so the rebuilt groups hold the effects of exactly
//!   the operations each origin had applied. A state therefore carries its
//!   daemon's record ([`DaemonState::applied`]), and when an exchange
//!   completes every core takes each origin's record as its own for that
//!   origin (the *lineage* record), before it applies the held operations.
//!   Such an operation is applied if the lineage record does not have it. A
//!   core that applied it in an exchange its origin never completed applies
//!   it again: the rebuild dropped its effect. Every core of a configuration
//!   starts from the same states and sees the same stream, so all make the
//!   same choice.
//! * **In a delivery** (multicast, unicast, reject). A delivery cannot be
//!   taken back, so a core applies such an operation only if it never did,
//!   by its own history (the *delivered* record). It delivers only to its own
//!   clients, so the cores' different histories change nothing they share.
//!
//! Both records count every numbered operation a core processes (applied or
//! skipped), so an origin's record says which of its operations its groups
//! have seen.
//!
//! What a core remembers is bounded: per origin daemon, the latest
//! incarnation only, a floor below which every number counts as applied, and
//! at most [`MAX_APPLIED_RANGES`] ranges of applied numbers above it. The
//! floor is safe because of where copies come from: only an origin makes
//! them, only of operations it holds (ordered but not applied by it), and it
//! holds at most one copy at a time, which it gives up when it submits the
//! next. So once the origin has applied an operation, no copy of it is
//! ordered again, and its own record's floor can rise past it. The ranges
//! above the floor are gaps' bookkeeping: without gaps in normal running, one
//! per configuration change gone through without a completed exchange. If
//! the ranges exceed the bound, the lowest gap counts as applied (see
//! `Applied`): an operation in it would have to come back after all those
//! changes. The delivered record's floor for an origin rises to the origin's
//! own floor when an exchange completes. An origin's new incarnation replaces
//! the old one: the old incarnation's operations were all ordered before the
//! configuration that dropped it, so before any operation of the new one.
//!
//! A core has at most one state of its own in flight: a change that comes
//! while its last state has not come back through the stream sends none,
//! since that state will be ordered after the change and answer it (the
//! core's clients cannot change while it is exchanging, so the state is still
//! true). This keeps a state sent for one change from being taken as the
//! answer to a later one after the core's clients have changed. The backbone
//! must therefore deliver a daemon's own submissions back to it, in order.
//!
//! # Transitional sets
//!
//! When a configuration of the daemon group stops, its daemons may have
//! received different parts of its stream: the daemons that move together
//! into the same next configuration (a transitional set) deliver the same
//! rest of it, but that rest may have holes — operations from daemons
//! outside the set, lost with them — and other sets deliver other rests
//! (extended virtual synchrony). A core that installed a view after such a
//! hole with the id another set gives the same change would put members who
//! delivered different messages in the old view through "the same" view
//! change. So a backbone that knows where a set's rest begins says so with
//! [`Op::Transitional`], at a point every daemon of the set has reached with
//! the same operations, and every view the set installs after it has ids of
//! the set's own (next section). The simulated backbone does; Corosync's CPG
//! does not tell its users where its transitional delivery begins, so a
//! cluster relies on CPG delivering no holes.
//!
//! # View ids
//!
//! A [`ViewId`]'s `seq` is `(tag << 48) | counter`: the counter is the core's,
//! and the tag is the lowest [`DaemonId`] of the daemon group that installed
//! the view. Its `incarnation` starts as the daemon's random per-boot value,
//! so a daemon that restarts and counts from 1 again never repeats an id of
//! its previous lifetime. When an exchange completes, every core derives the
//! next incarnation from the exchanged states (each daemon's incarnation and
//! counter, exchanged in [`DaemonState`]); at [`Op::Transitional`] from the
//! current one, the counter and the set's daemons (and again after the
//! network views of an exchange that completes in the set's rest: those
//! views are the configuration's, what follows is the set's). So ids stay unique across
//! partitions, merges and transitional sets, even where one component's
//! counter went on past the point where another's stopped, with the odds
//! of two random 64-bit incarnations being equal. Ids carry no order: a
//! session tells an earlier view by having been in it. After an exchange the
//! counter continues from the highest counter of the exchanged states. A
//! standalone daemon 0 numbers its views 1, 2, 3, …

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use bytes::Bytes;

use crate::view::{Cause, GroupName, MemberId, View, ViewId, ViewMember};

/// A daemon's number in the daemon group (a cluster backbone maps its node
/// ids onto these).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct DaemonId(pub u16);

/// One client connection, named by the daemon that accepted it and a number
/// that daemon never reuses.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ConnId {
    /// The daemon the client is connected to.
    pub daemon: DaemonId,
    /// The daemon's own number for the connection.
    pub local: u64,
}

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "d{}#{}", self.daemon.0, self.local)
    }
}

/// The ordering a sender asks for. The core's stream order satisfies both;
/// the service is carried to the receivers as chosen.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Service {
    /// Per-sender FIFO order.
    Fifo,
    /// One total order over all senders of the group.
    Agreed,
}

/// One operation of the totally ordered stream.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Op {
    /// A client introduced itself.
    Connect {
        /// Its connection.
        conn: ConnId,
        /// The name it asks for.
        name: MemberId,
    },
    /// A client went away (closed, said goodbye, or was cut off by its daemon).
    Disconnect {
        /// Its connection.
        conn: ConnId,
    },
    /// A client joins a group, creating it if it does not exist.
    Join {
        /// Who.
        conn: ConnId,
        /// Which group.
        group: GroupName,
        /// Whether non-members may send, if this join creates the group.
        open: bool,
        /// How the group's traffic is protected (see *Keyed groups* in the
        /// [module docs](self)), if this join creates the group. A join of
        /// an existing group must say what its creator said.
        mode: GroupMode,
    },
    /// A client leaves a group.
    Leave {
        /// Who.
        conn: ConnId,
        /// Which group.
        group: GroupName,
    },
    /// A client multicasts to a group.
    Multicast {
        /// Sender.
        conn: ConnId,
        /// Destination group.
        group: GroupName,
        /// Requested ordering.
        service: Service,
        /// The message.
        payload: Bytes,
    },
    /// A client sends to one member of a group.
    Unicast {
        /// Sender.
        conn: ConnId,
        /// The group both belong to.
        group: GroupName,
        /// Recipient.
        to: MemberId,
        /// The message.
        payload: Bytes,
    },
    /// A daemon turned down a client's request before it could enter the
    /// stream (a frame over the size limit, say). It goes through the stream
    /// so the client gets the error in order with its other replies.
    Reject {
        /// Whose request.
        conn: ConnId,
        /// Why.
        code: ErrorCode,
        /// Details for people.
        text: String,
    },
    /// The daemon group changed (cluster backbones only).
    Daemons {
        /// The backbone's number for this configuration; states answer it.
        epoch: u64,
        /// The daemons of the new daemon group.
        members: Vec<DaemonId>,
    },
    /// The daemon group's configuration stopped, and from here to the next
    /// [`Op::Daemons`] the rest of its operations are delivered to these
    /// daemons only: a transitional set, the daemons that move together
    /// into the same next configuration (backbones that can tell; see
    /// *Transitional sets* in the [module docs](self)).
    Transitional {
        /// The daemons of the transitional set, this one among them.
        members: Vec<DaemonId>,
    },
    /// Traffic among the machines around the daemons' cores (see *Keyed
    /// groups* in the [module docs](self)): the daemons' key agreement, and
    /// client operations sealed under its key. Ordered like everything
    /// else; the core itself passes it by.
    DaemonKa {
        /// The daemon that sent it.
        from: DaemonId,
        /// The key agreement message.
        payload: Bytes,
    },
    /// A daemon's state, sent in answer to [`Op::Daemons`] (cluster backbones only).
    State {
        /// The configuration this state answers.
        epoch: u64,
        /// The state.
        state: DaemonState,
    },
    /// A client operation with its identity (cluster backbones; see *Operation
    /// identities* in the [module docs](self)). The core applies it at most
    /// once, however often it is ordered. `op` must be a client operation
    /// (one with a [`conn`](Op::conn), not itself numbered); the core ignores
    /// anything else.
    Numbered {
        /// Its identity; the origin is the daemon of its connection.
        id: OpId,
        /// The operation.
        op: Box<Op>,
    },
}

/// The identity of a client operation in a cluster's stream (see *Operation
/// identities* in the [module docs](self)). Its origin daemon is the one of
/// the operation's connection, so it is not repeated here.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct OpId {
    /// The origin daemon's incarnation ([`Core::incarnation`]).
    pub incarnation: u64,
    /// The origin's number for the operation: 0, 1, 2, … in the order its
    /// shell submits client operations, in this incarnation.
    pub seq: u64,
}

impl Op {
    /// The connection a client operation comes from (`None` for the daemon
    /// group's own operations).
    pub fn conn(&self) -> Option<ConnId> {
        match self {
            Op::Connect { conn, .. }
            | Op::Disconnect { conn }
            | Op::Join { conn, .. }
            | Op::Leave { conn, .. }
            | Op::Multicast { conn, .. }
            | Op::Unicast { conn, .. }
            | Op::Reject { conn, .. } => Some(*conn),
            Op::Numbered { op, .. } if op.is_plain_client_op() => op.conn(),
            Op::Numbered { .. }
            | Op::Daemons { .. }
            | Op::Transitional { .. }
            | Op::DaemonKa { .. }
            | Op::State { .. } => None,
        }
    }

    /// Whether this is a client operation without an identity (what may go
    /// inside [`Op::Numbered`]).
    pub fn is_plain_client_op(&self) -> bool {
        !matches!(
            self,
            Op::Numbered { .. } | Op::Daemons { .. } | Op::Transitional { .. } | Op::DaemonKa { .. } | Op::State { .. }
        )
    }

    /// This client operation with identity `id`; a daemon-group operation,
    /// or one that has an identity already, is returned as it is.
    pub fn numbered(self, id: OpId) -> Op {
        if self.is_plain_client_op() {
            Op::Numbered { id, op: Box::new(self) }
        } else {
            self
        }
    }
}

/// What one daemon tells the others about itself after the daemon group changed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DaemonState {
    /// Whose state.
    pub daemon: DaemonId,
    /// The daemon's view counter.
    pub next_view: u64,
    /// The daemon's incarnation (random per boot; see [`ViewId`]).
    pub incarnation: u64,
    /// The incarnation of the views the daemon installed last (derived per
    /// configuration and transitional set): folded into the next
    /// configuration's, so that two configurations in a row never share ids
    /// even when every other field of every state is the same.
    pub view_incarnation: u64,
    /// The client operations this daemon numbered, in this incarnation
    /// ([`OpId::seq`]), that its groups have seen: the effects the rebuilt
    /// groups hold for its clients, and (below the floor) numbers never
    /// ordered again (see *Operation identities* in the [module
    /// docs](self)).
    pub applied: AppliedOps,
    /// The daemon group in which this daemon's clients delivered their last
    /// messages in their current views: the one whose change began the
    /// exchanges this state answers. Clients that name the same view but
    /// different cuts delivered different messages in it (a merge that
    /// interrupted a partition's exchange); see [`Core`]'s rebuild.
    pub cut: Vec<DaemonId>,
    /// The daemon's own clients.
    pub clients: Vec<ClientState>,
}

/// One client in a [`DaemonState`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ClientState {
    /// Its connection.
    pub conn: ConnId,
    /// Its name.
    pub name: MemberId,
    /// The groups it is a member of.
    pub groups: Vec<Membership>,
}

/// A client's membership of one group, in a [`DaemonState`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Membership {
    /// The group.
    pub group: GroupName,
    /// Whether the group is open.
    pub open: bool,
    /// How the group's traffic is protected.
    pub mode: GroupMode,
    /// The group's current view.
    pub view: ViewId,
    /// Counter of the view the client joined in: orders members oldest first.
    pub since: u64,
}

/// Why a request failed. The numbers are the wire's.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ErrorCode {
    /// The client speaks a wire version the daemon does not.
    UnsupportedVersion,
    /// A frame could not be decoded.
    Malformed,
    /// A frame is larger than the daemon accepts.
    TooLarge,
    /// Another connected client has that name.
    NameTaken,
    /// The connection has not introduced itself.
    NotConnected,
    /// The connection already introduced itself.
    AlreadyConnected,
    /// The client is already a member of the group.
    AlreadyMember,
    /// The client is not a member of the group (or sends to a closed group).
    NotMember,
    /// No such group.
    UnknownGroup,
    /// The unicast's recipient is not a member of the group.
    UnknownRecipient,
    /// The client is a member of as many groups as allowed.
    TooManyGroups,
    /// The client did not read its deliveries fast enough.
    QueueOverflow,
    /// The client did not introduce itself in time.
    Timeout,
    /// The daemon is shutting down.
    ShuttingDown,
    /// The name in Hello is not the name the client's certificate certifies,
    /// or, for a client without a certificate, not one it may take.
    IdentityMismatch,
    /// The client's certificate was revoked (or is no longer trusted) while
    /// it was connected.
    Revoked,
    /// The daemon serves as many connections (from this peer, or in all) as
    /// it may.
    TooManyConnections,
    /// A join asked for a group keyed by its daemons where the group is not,
    /// or the other way round: the group's creator chose.
    ModeMismatch,
    /// A code this version does not know.
    Other(u16),
}

impl ErrorCode {
    /// The code's number on the wire.
    pub fn to_u16(self) -> u16 {
        match self {
            ErrorCode::UnsupportedVersion => 1,
            ErrorCode::Malformed => 2,
            ErrorCode::TooLarge => 3,
            ErrorCode::NameTaken => 4,
            ErrorCode::NotConnected => 5,
            ErrorCode::AlreadyConnected => 6,
            ErrorCode::AlreadyMember => 7,
            ErrorCode::NotMember => 8,
            ErrorCode::UnknownGroup => 9,
            ErrorCode::UnknownRecipient => 10,
            ErrorCode::TooManyGroups => 11,
            ErrorCode::QueueOverflow => 12,
            ErrorCode::Timeout => 13,
            ErrorCode::ShuttingDown => 14,
            ErrorCode::IdentityMismatch => 15,
            ErrorCode::Revoked => 16,
            ErrorCode::TooManyConnections => 17,
            ErrorCode::ModeMismatch => 18,
            ErrorCode::Other(n) => n,
        }
    }

    /// The code for a number on the wire.
    pub fn from_u16(n: u16) -> Self {
        match n {
            1 => ErrorCode::UnsupportedVersion,
            2 => ErrorCode::Malformed,
            3 => ErrorCode::TooLarge,
            4 => ErrorCode::NameTaken,
            5 => ErrorCode::NotConnected,
            6 => ErrorCode::AlreadyConnected,
            7 => ErrorCode::AlreadyMember,
            8 => ErrorCode::NotMember,
            9 => ErrorCode::UnknownGroup,
            10 => ErrorCode::UnknownRecipient,
            11 => ErrorCode::TooManyGroups,
            12 => ErrorCode::QueueOverflow,
            13 => ErrorCode::Timeout,
            14 => ErrorCode::ShuttingDown,
            15 => ErrorCode::IdentityMismatch,
            16 => ErrorCode::Revoked,
            17 => ErrorCode::TooManyConnections,
            18 => ErrorCode::ModeMismatch,
            n => ErrorCode::Other(n),
        }
    }

    /// Whether the daemon closes the connection after this error.
    pub fn is_fatal(self) -> bool {
        matches!(
            self,
            ErrorCode::UnsupportedVersion
                | ErrorCode::Malformed
                | ErrorCode::NameTaken
                | ErrorCode::QueueOverflow
                | ErrorCode::Timeout
                | ErrorCode::ShuttingDown
                | ErrorCode::IdentityMismatch
                | ErrorCode::Revoked
                | ErrorCode::TooManyConnections
        )
    }
}

/// What a client is told.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Delivery {
    /// The connection is accepted under this name.
    Welcome {
        /// The client's name.
        member: MemberId,
    },
    /// A new view of a group the client is a member of.
    View {
        /// The group.
        group: GroupName,
        /// The view.
        view: View,
    },
    /// The daemon group is changing: no more messages in the group's current
    /// view; a new view follows.
    ViewChangeBegins {
        /// The group.
        group: GroupName,
    },
    /// The client's leave took effect: nothing more comes from the group.
    Left {
        /// The group.
        group: GroupName,
    },
    /// A multicast.
    Message {
        /// The group it was sent to.
        group: GroupName,
        /// Sender.
        sender: MemberId,
        /// The ordering the sender asked for.
        service: Service,
        /// The view it was sent and is delivered in.
        view: ViewId,
        /// The message.
        payload: Bytes,
    },
    /// A unicast to this client.
    Unicast {
        /// The group it was sent in.
        group: GroupName,
        /// Sender.
        sender: MemberId,
        /// The view it was sent and is delivered in.
        view: ViewId,
        /// The message.
        payload: Bytes,
    },
    /// The key of a view of a keyed group, from the daemons (see *Keyed
    /// groups* in the [module docs](self)): delivered to each member just
    /// before the view it keys, and to nobody else.
    GroupKey {
        /// The group.
        group: GroupName,
        /// The view the key is for.
        view: ViewId,
        /// The key.
        key: ViewKey,
    },
    /// A request failed.
    Error {
        /// What went wrong.
        code: ErrorCode,
        /// Details for people.
        text: String,
    },
}

/// A keyed group's key for one view: 32 bytes, zeroized on drop, never
/// printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ViewKey(zeroize::Zeroizing<[u8; 32]>);

impl ViewKey {
    /// Wraps key bytes.
    pub fn new(bytes: [u8; 32]) -> Self {
        Self(zeroize::Zeroizing::new(bytes))
    }

    /// The key bytes.
    pub fn expose_secret(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for ViewKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ViewKey(..)")
    }
}

impl Delivery {
    fn error(code: ErrorCode, text: impl Into<String>) -> Self {
        Delivery::Error { code, text: text.into() }
    }
}

/// What the core asks its shell to do.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Output {
    /// Deliver to these clients of this daemon, in order after everything
    /// delivered to them before.
    Deliver {
        /// Recipients.
        to: Vec<ConnId>,
        /// What to deliver.
        delivery: Delivery,
    },
    /// Send this operation to the daemon group through the backbone.
    Submit(Op),
}

/// Per-client limits the core enforces.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Groups one client may be a member of at once.
    pub max_groups_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_groups_per_client: 1024 }
    }
}

struct Client {
    name: MemberId,
    groups: BTreeSet<GroupName>,
}

/// A member of a group, beside its entry in the group's view.
#[derive(Clone)]
struct Seat {
    conn: ConnId,
    since: u64,
}

/// What a group's creator chose for it.
#[derive(Clone, Copy, Default)]
struct Options {
    open: bool,
    mode: GroupMode,
}

/// How a group's traffic is protected, as its creator chose (see *Keyed
/// groups* in the [module docs](self)): the integrated architecture's
/// variants, or none of them.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub enum GroupMode {
    /// The daemons carry the group's messages as they are: its members agree
    /// their own keys (the layered architecture), or use none.
    #[default]
    Members,
    /// Integrated VS: the daemons key every view of the group
    /// ([`Delivery::GroupKey`]).
    Keyed,
    /// Three-Step client–server: no group key; each member reaches its
    /// daemon over TLS or the local socket, and the daemons seal everything
    /// between them. Only a daemon whose backbone is sealed, or that has no
    /// other daemons, lets clients create one ([`Core::seal_groups`]).
    ThreeStep,
    /// Optimized EVS: keyed by the daemons like [`GroupMode::Keyed`], and a
    /// message sealed under the key of an earlier view is re-encrypted by
    /// the daemons under the key of the view it is delivered in
    /// (`conclave-integrated`'s `evs` module), so nothing is sent twice
    /// when a view changes. The core records every view of such a group
    /// for the daemons' key store ([`Core::take_evs_views`]).
    OptimizedEvs,
}

impl GroupMode {
    /// What users call it.
    pub fn name(self) -> &'static str {
        match self {
            GroupMode::Members => "members' own",
            GroupMode::Keyed => "integrated-vs",
            GroupMode::ThreeStep => "three-step",
            GroupMode::OptimizedEvs => "optimized-evs",
        }
    }

    /// Whether the daemons key every view of the group (Integrated VS and
    /// Optimized EVS).
    pub fn daemon_keyed(self) -> bool {
        matches!(self, GroupMode::Keyed | GroupMode::OptimizedEvs)
    }
}

struct Group {
    options: Options,
    view: View,
    /// Index for index with `view.members`.
    seats: Vec<Seat>,
}

/// Joins admitted and not yet installed: per group, in order of first
/// join, its options and its joiners.
#[derive(Default)]
struct Joins {
    groups: Vec<(GroupName, Options, Vec<NewSeat>)>,
}

impl Joins {
    fn options(&self, group: &GroupName) -> Option<Options> {
        self.groups.iter().find(|(g, ..)| g == group).map(|(_, o, _)| *o)
    }

    fn has(&self, conn: ConnId) -> bool {
        self.groups.iter().any(|(_, _, seats)| seats.iter().any(|s| s.conn == conn))
    }
}

/// A member of the view being installed.
#[derive(Clone)]
struct NewSeat {
    conn: ConnId,
    id: MemberId,
    since: u64,
    prev: Option<ViewId>,
}

struct Exchange {
    epoch: u64,
    members: BTreeSet<DaemonId>,
    /// The daemon group whose change began this chain of exchanges (see
    /// [`DaemonState::cut`]): no message was delivered since.
    cut: BTreeSet<DaemonId>,
    states: BTreeMap<DaemonId, DaemonState>,
    held: Vec<Op>,
}

/// Most ranges of applied numbers remembered per origin daemon above its
/// floor (see *Operation identities* in the [module docs](self)).
pub const MAX_APPLIED_RANGES: usize = 64;

/// The numbered client operations of one daemon incarnation that a core has
/// applied, as a [`DaemonState`] carries them: every number below `floor`,
/// and the inclusive ranges above it.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct AppliedOps {
    /// Every number below this is applied.
    pub floor: u64,
    /// Applied numbers above `floor`, as inclusive `(start, end)` ranges in
    /// ascending order; see [`AppliedOps::is_canonical`].
    pub ranges: Vec<(u64, u64)>,
}

impl AppliedOps {
    /// Whether this is the one form a core produces: at most
    /// [`MAX_APPLIED_RANGES`] ranges, each with `start <= end`, ascending,
    /// and separated by at least one number from each other and from the
    /// floor. A decoder refuses any other.
    pub fn is_canonical(&self) -> bool {
        let mut last = self.floor;
        self.ranges.len() <= MAX_APPLIED_RANGES
            && self.ranges.iter().enumerate().all(|(i, &(start, end))| {
                let apart = if i == 0 { start > last } else { last.checked_add(1).is_some_and(|l| start > l) };
                last = end;
                apart && start <= end
            })
    }
}

/// The numbered operations of one origin daemon (one incarnation) that this
/// core has applied: every number below `floor`, and the ranges in `above`.
///
/// The bound: at most [`MAX_APPLIED_RANGES`] ranges (16 bytes each) per
/// origin daemon, and one origin entry per daemon id (the latest incarnation
/// only). Why forgetting is safe is argued under *Operation identities* in
/// the module docs. If more ranges pile up, the lowest gap is taken as
/// applied.
#[derive(Clone, Debug)]
struct Applied {
    incarnation: u64,
    /// Every number below this counts as applied.
    floor: u64,
    /// Applied numbers above `floor`: disjoint ranges `start → end`
    /// (inclusive), neither touching each other nor `floor`.
    above: BTreeMap<u64, u64>,
}

impl Applied {
    fn new(incarnation: u64) -> Self {
        Self { incarnation, floor: 0, above: BTreeMap::new() }
    }

    /// The record a state carries.
    fn ops(&self) -> AppliedOps {
        AppliedOps { floor: self.floor, ranges: self.above.iter().map(|(&s, &e)| (s, e)).collect() }
    }

    /// The record of `incarnation` that a state carried.
    fn from_ops(incarnation: u64, ops: &AppliedOps) -> Self {
        let mut applied = Self { incarnation, floor: ops.floor, above: ops.ranges.iter().copied().collect() };
        applied.settle();
        applied
    }

    /// Records `n` as applied; `false` if it was already.
    fn insert(&mut self, n: u64) -> bool {
        if n < self.floor {
            return false;
        }
        let mut start = n;
        let mut end = n;
        if let Some((&s, &e)) = self.above.range(..=n).next_back() {
            if n <= e {
                return false;
            }
            if e + 1 == n {
                self.above.remove(&s);
                start = s;
            }
        }
        if let Some(next) = n.checked_add(1) {
            if let Some(e) = self.above.remove(&next) {
                end = e;
            }
        }
        self.above.insert(start, end);
        self.settle();
        true
    }

    /// Takes every number below `floor` as applied.
    fn raise(&mut self, floor: u64) {
        if floor > self.floor {
            self.floor = floor;
            self.settle();
        }
    }

    /// Folds ranges that reach the floor into it, and keeps the bound.
    fn settle(&mut self) {
        while let Some((&s, &e)) = self.above.first_key_value() {
            if s > self.floor && self.above.len() <= MAX_APPLIED_RANGES {
                break;
            }
            self.above.remove(&s);
            self.floor = self.floor.max(e.saturating_add(1));
        }
    }
}

/// What a daemon's shell runs on the ordered stream: the [`Core`] itself,
/// or a machine around it that adds to what the core does (the integrated
/// architecture's keys: `conclave-integrated`). Deterministic like the core.
/// A shell that knows which machine it runs may downcast it (`Any`).
///
/// Time is the shell's: `now` is a monotonic clock in microseconds from any
/// origin the shell picks, passed in, never read. A machine never acts on
/// time by itself at one daemon only: what it does at a time-out it submits
/// to the stream, so that every daemon acts at the same point of it.
pub trait Machine: std::any::Any + Send {
    /// Consumes the next operation of the stream at time `now` (see
    /// [`Core::handle`]).
    fn handle(&mut self, op: Op, now: u64, out: &mut Vec<Output>);
    /// When the machine wants [`Machine::handle_timeout`] next, if ever
    /// (the shell asks after every call).
    fn poll_timeout(&self) -> Option<u64> {
        None
    }
    /// The shell's clock reached [`Machine::poll_timeout`]'s time.
    fn handle_timeout(&mut self, now: u64, out: &mut Vec<Output>) {
        let _ = (now, out);
    }
    /// An operation of one of this daemon's own clients, numbered, on its
    /// way to the backbone: the machine submits it (the default: as it is),
    /// or transforms or holds it first. Shells that route their clients'
    /// operations through the machine ([`Machine::routes_submissions`]) call
    /// it for each, in their order.
    fn submit(&mut self, op: Op, now: u64, out: &mut Vec<Output>) {
        let _ = now;
        out.push(Output::Submit(op));
    }
    /// Whether the shell must pass its clients' operations through
    /// [`Machine::submit`] rather than straight to the backbone (so that the
    /// machine can seal them, say).
    fn routes_submissions(&self) -> bool {
        false
    }
    /// A run of plain joins that a standalone daemon ordered together (see
    /// [`Core::handle_joins`]); the default handles each in turn.
    fn handle_joins(&mut self, ops: Vec<Op>, now: u64, out: &mut Vec<Output>) {
        for op in ops {
            self.handle(op, now, out);
        }
    }
    /// The core inside.
    fn core(&self) -> &Core;
}

impl Machine for Core {
    fn handle(&mut self, op: Op, _now: u64, out: &mut Vec<Output>) {
        Core::handle(self, op, out);
    }

    fn handle_joins(&mut self, ops: Vec<Op>, _now: u64, out: &mut Vec<Output>) {
        Core::handle_joins(self, ops, out);
    }

    fn core(&self) -> &Core {
        self
    }
}

/// The daemon core (see the [module docs](self) for its semantics).
pub struct Core {
    me: DaemonId,
    limits: Limits,
    tag: u16,
    next_view: u64,
    /// This daemon's own incarnation (drawn by the shell at boot).
    incarnation: u64,
    /// The incarnation the views installed now carry: this daemon's own
    /// while it is alone, then derived for each configuration and each
    /// transitional set (see *View ids* in the module docs).
    view_incarnation: u64,
    /// The transitional set this daemon is in, from [`Op::Transitional`]
    /// until the next configuration ([`Op::Daemons`]): an exchange that
    /// completes in the set's own delivery gives what it installs after
    /// its network views the set's own ids too.
    transitional_set: Option<BTreeSet<DaemonId>>,
    daemons: BTreeSet<DaemonId>,
    clients: BTreeMap<ConnId, Client>,
    names: BTreeMap<MemberId, ConnId>,
    groups: BTreeMap<GroupName, Group>,
    exchange: Option<Exchange>,
    /// A state of ours was submitted and has not come back yet.
    state_in_flight: bool,
    /// The lineage record of numbered operations, by origin daemon: what the
    /// groups have seen (see *Operation identities* in the module docs).
    lineage: BTreeMap<DaemonId, Applied>,
    /// The delivered record: numbered operations this core processed, by
    /// origin daemon.
    delivered: BTreeMap<DaemonId, Applied>,
    /// The id of the daemon group's configuration (see [`Core::configuration`]).
    configuration: ViewId,
    /// Whether a machine around the core keys groups (see *Keyed groups*).
    keys_groups: bool,
    /// Whether clients may create three-step groups ([`Core::seal_groups`]).
    seals_groups: bool,
    /// Views of Optimized EVS groups installed since the machine last took
    /// them ([`Core::take_evs_views`]); kept only if `keys_groups`.
    evs_views: Vec<(GroupName, ViewId)>,
}

const COUNTER_BITS: u32 = 48;

/// Domains of [`derive`]: a transitional set's ids, a rebuilt configuration's.
const TRANSITIONAL: u64 = 1;
const REBUILT: u64 = 2;

/// Folds `x` into `h` (the splitmix64 finalizer over both): how a daemon
/// group derives a view incarnation from its daemons' random ones. Not a
/// secret and not a commitment: it only needs to make equal results as
/// unlikely as two equal random incarnations.
fn derive(h: u64, x: u64) -> u64 {
    let mut z = (h.rotate_left(29) ^ x).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Core {
    /// The core of daemon `me`, alone in its daemon group. `incarnation`
    /// must be drawn at random each time the daemon starts (its shell owns
    /// the randomness): it keeps view ids unique across restarts.
    pub fn new(me: DaemonId, limits: Limits, incarnation: u64) -> Self {
        Self {
            me,
            limits,
            tag: me.0,
            next_view: 1,
            incarnation,
            view_incarnation: incarnation,
            transitional_set: None,
            daemons: BTreeSet::from([me]),
            clients: BTreeMap::new(),
            names: BTreeMap::new(),
            groups: BTreeMap::new(),
            exchange: None,
            state_in_flight: false,
            lineage: BTreeMap::new(),
            delivered: BTreeMap::new(),
            configuration: ViewId::new(incarnation, u64::from(me.0) << COUNTER_BITS),
            keys_groups: false,
            seals_groups: false,
            evs_views: Vec::new(),
        }
    }

    /// Lets clients create keyed groups: for a machine around the core that
    /// gives their views keys (see *Keyed groups* in the [module docs](self)).
    /// Without it a keyed join is refused.
    pub fn key_groups(&mut self) {
        self.keys_groups = true;
    }

    /// The views of Optimized EVS groups ([`GroupMode::OptimizedEvs`])
    /// installed since the last call, in order — every daemon's, not only
    /// those with members here: a message may be delivered here under the
    /// key of a view that had no member on this daemon (a joiner's first
    /// view follows it), and this daemon must hold that key to re-encrypt
    /// it. Recorded only when the core keys groups ([`Core::key_groups`]).
    pub fn take_evs_views(&mut self) -> Vec<(GroupName, ViewId)> {
        std::mem::take(&mut self.evs_views)
    }

    /// Lets clients create three-step groups ([`GroupMode::ThreeStep`]):
    /// for a daemon whose backbone seals what goes between the daemons, or
    /// that has no other daemons. Without it such a join is refused.
    pub fn seal_groups(&mut self) {
        self.seals_groups = true;
    }

    /// The daemon group's configuration as the core last installed it: its
    /// id — unique like a view id, the same at every daemon of it, and never
    /// a group view's (its counter is 0) — and its daemons. `None` while an
    /// exchange is under way.
    pub fn configuration(&self) -> Option<(ViewId, Vec<DaemonId>)> {
        self.exchange.is_none().then(|| (self.configuration, self.daemons.iter().copied().collect()))
    }

    /// The id of [`Core::configuration`], without its daemons (no allocation).
    pub fn configuration_id(&self) -> Option<ViewId> {
        self.exchange.is_none().then_some(self.configuration)
    }

    /// This daemon's incarnation, as given to [`Core::new`]: a shell that
    /// numbers its client operations ([`Op::Numbered`]) puts it in their ids.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// This daemon.
    pub fn me(&self) -> DaemonId {
        self.me
    }

    /// The current view of `group`.
    pub fn view(&self, group: &GroupName) -> Option<&View> {
        self.groups.get(group).map(|g| &g.view)
    }

    /// The groups that exist, by name.
    pub fn groups(&self) -> impl Iterator<Item = &GroupName> {
        self.groups.keys()
    }

    /// Whether `group` exists and is keyed by its daemons (see *Keyed
    /// groups* in the [module docs](self)).
    pub fn keyed(&self, group: &GroupName) -> bool {
        self.groups.get(group).is_some_and(|g| g.options.mode.daemon_keyed())
    }

    /// How `group`'s traffic is protected, if it exists.
    pub fn mode(&self, group: &GroupName) -> Option<GroupMode> {
        self.groups.get(group).map(|g| g.options.mode)
    }

    /// Whether `group` exists and is open: non-members may send to it.
    pub fn open(&self, group: &GroupName) -> bool {
        self.groups.get(group).is_some_and(|g| g.options.open)
    }

    /// Installs a new view of every keyed group, with the same members (cause
    /// [`Cause::Refresh`]): the daemons renewed their key, and each view gets
    /// its key from the new one (see *Keyed groups* in the [module
    /// docs](self)). Every daemon must call it at the same point of the
    /// stream, and never during an exchange.
    pub fn refresh_keyed(&mut self, out: &mut Vec<Output>) {
        assert!(self.exchange.is_none(), "no refresh during an exchange");
        let keyed: Vec<GroupName> =
            self.groups.iter().filter(|(_, g)| g.options.mode.daemon_keyed()).map(|(name, _)| name.clone()).collect();
        for group in keyed {
            let seats = self.seats_of(&group);
            let options = self.groups[&group].options;
            self.install(group, options, seats, Cause::Refresh, out);
        }
    }

    /// The name of a connected client.
    pub fn member(&self, conn: ConnId) -> Option<&MemberId> {
        self.clients.get(&conn).map(|c| &c.name)
    }

    /// Whether a change of the daemon group is being worked through.
    pub fn exchanging(&self) -> bool {
        self.exchange.is_some()
    }

    /// Consumes the next operation of the stream; appends what follows to `out`.
    pub fn handle(&mut self, op: Op, out: &mut Vec<Output>) {
        match op {
            Op::Daemons { epoch, members } => self.daemons_changed(epoch, members, out),
            Op::Transitional { members } => self.transitional(&members),
            Op::DaemonKa { .. } => {}
            Op::State { epoch, state } => self.state_arrived(epoch, state, out),
            op => {
                // Only a numbered operation that wraps no client operation has none.
                let Some(conn) = op.conn() else { return };
                let daemon = conn.daemon;
                match &mut self.exchange {
                    Some(x) if x.members.contains(&daemon) => x.held.push(op),
                    Some(_) => {}
                    None if self.daemons.contains(&daemon) => self.client_op(op, out),
                    None => {}
                }
            }
        }
    }

    fn client_op(&mut self, op: Op, out: &mut Vec<Output>) {
        match op {
            Op::Connect { conn, name } => self.connect(conn, name, out),
            Op::Disconnect { conn } => self.disconnect(conn, out),
            Op::Join { conn, group, open, mode } => self.join(conn, group, Options { open, mode }, out),
            Op::Leave { conn, group } => self.leave(conn, group, out),
            Op::Multicast { conn, group, service, payload } => {
                let Some((sender, g)) = self.sender_and_group(conn, &group, out) else { return };
                let delivery = Delivery::Message { group, sender, service, view: g.view.id, payload };
                self.deliver(g.seats.iter().map(|s| s.conn), delivery, out);
            }
            Op::Unicast { conn, group, to, payload } => {
                let Some((sender, g)) = self.sender_and_group(conn, &group, out) else { return };
                let Some(i) = g.view.position(&to) else {
                    let text = format!("{to} is not a member of {group}");
                    self.reply(conn, Delivery::error(ErrorCode::UnknownRecipient, text), out);
                    return;
                };
                let delivery = Delivery::Unicast { group, sender, view: g.view.id, payload };
                self.deliver([g.seats[i].conn], delivery, out);
            }
            Op::Reject { conn, code, text } => self.reply(conn, Delivery::error(code, text), out),
            Op::Numbered { id, op } => {
                let origin = op.conn().expect("a numbered operation is a client operation").daemon;
                let new_to_groups = Self::record(&mut self.lineage, origin, id);
                let new_to_me = Self::record(&mut self.delivered, origin, id);
                let apply = match *op {
                    Op::Multicast { .. } | Op::Unicast { .. } | Op::Reject { .. } => new_to_me,
                    _ => new_to_groups,
                };
                if apply {
                    self.client_op(*op, out);
                }
            }
            Op::Daemons { .. } | Op::Transitional { .. } | Op::DaemonKa { .. } | Op::State { .. } => {
                unreachable!("not a client operation")
            }
        }
    }

    /// Records operation `id` of `origin` in `record`; `false` if it was
    /// there already (a copy submitted again after an interrupted exchange).
    fn record(record: &mut BTreeMap<DaemonId, Applied>, origin: DaemonId, id: OpId) -> bool {
        let applied = record.entry(origin).or_insert_with(|| Applied::new(id.incarnation));
        if applied.incarnation != id.incarnation {
            // The origin restarted: its former incarnation's operations were
            // all ordered before it left, and so before this one's.
            *applied = Applied::new(id.incarnation);
        }
        applied.insert(id.seq)
    }

    /// Delivers to those of `conns` that are this daemon's clients: only
    /// they get deliveries from this core.
    fn deliver(&self, conns: impl IntoIterator<Item = ConnId>, delivery: Delivery, out: &mut Vec<Output>) {
        let to: Vec<ConnId> = conns.into_iter().filter(|c| c.daemon == self.me).collect();
        if !to.is_empty() {
            out.push(Output::Deliver { to, delivery });
        }
    }

    fn reply(&self, conn: ConnId, delivery: Delivery, out: &mut Vec<Output>) {
        self.deliver([conn], delivery, out);
    }

    fn client(&self, conn: ConnId, out: &mut Vec<Output>) -> Option<&Client> {
        let client = self.clients.get(&conn);
        if client.is_none() {
            let text = "introduce yourself (Hello) first";
            self.reply(conn, Delivery::error(ErrorCode::NotConnected, text), out);
        }
        client
    }

    /// Checks that `conn` may send to `group`; returns its name and the group.
    fn sender_and_group(&self, conn: ConnId, group: &GroupName, out: &mut Vec<Output>) -> Option<(MemberId, &Group)> {
        let name = self.client(conn, out)?.name.clone();
        let Some(g) = self.groups.get(group) else {
            self.reply(conn, Delivery::error(ErrorCode::UnknownGroup, format!("no group {group}")), out);
            return None;
        };
        if !g.options.open && !g.view.contains(&name) {
            let text = format!("{name} is not a member of closed group {group}");
            self.reply(conn, Delivery::error(ErrorCode::NotMember, text), out);
            return None;
        }
        Some((name, g))
    }

    fn connect(&mut self, conn: ConnId, name: MemberId, out: &mut Vec<Output>) {
        if let Some(c) = self.clients.get(&conn) {
            let text = format!("this connection is already {}", c.name);
            self.reply(conn, Delivery::error(ErrorCode::AlreadyConnected, text), out);
            return;
        }
        if self.names.contains_key(&name) {
            self.reply(conn, Delivery::error(ErrorCode::NameTaken, format!("{name} is taken")), out);
            return;
        }
        self.names.insert(name.clone(), conn);
        self.clients.insert(conn, Client { name: name.clone(), groups: BTreeSet::new() });
        self.reply(conn, Delivery::Welcome { member: name }, out);
    }

    fn disconnect(&mut self, conn: ConnId, out: &mut Vec<Output>) {
        let Some(client) = self.clients.remove(&conn) else { return };
        self.names.remove(&client.name);
        for group in client.groups {
            self.remove_seat(group, conn, Cause::Disconnect, out);
        }
    }

    fn join(&mut self, conn: ConnId, group: GroupName, options: Options, out: &mut Vec<Output>) {
        let mut joins = Joins::default();
        self.admit(conn, group, options, &mut joins, out);
        self.install_joins(joins, out);
    }

    /// Checks a join against the groups as they stand with the joins of
    /// `joins` already admitted, and admits it there, or refuses it.
    fn admit(&mut self, conn: ConnId, group: GroupName, options: Options, joins: &mut Joins, out: &mut Vec<Output>) {
        let Some(client) = self.client(conn, out) else { return };
        if client.groups.contains(&group) {
            let text = format!("{} is already a member of {group}", client.name);
            self.reply(conn, Delivery::error(ErrorCode::AlreadyMember, text), out);
            return;
        }
        if client.groups.len() >= self.limits.max_groups_per_client {
            let text = format!("a client may be in at most {} groups", self.limits.max_groups_per_client);
            self.reply(conn, Delivery::error(ErrorCode::TooManyGroups, text), out);
            return;
        }
        let existing = self.groups.get(&group).map(|g| g.options).or_else(|| joins.options(&group));
        if existing.is_none() {
            let refused = match options.mode {
                GroupMode::Keyed | GroupMode::OptimizedEvs if !self.keys_groups => {
                    Some("this daemon does not key groups")
                }
                GroupMode::ThreeStep if !self.seals_groups => {
                    Some("this daemon does not seal what goes between the daemons")
                }
                _ => None,
            };
            if let Some(why) = refused {
                let text = format!("{why}: {group} cannot be created {}", options.mode.name());
                self.reply(conn, Delivery::error(ErrorCode::ModeMismatch, text), out);
                return;
            }
        }
        if let Some(mode) = existing.map(|o| o.mode).filter(|&m| m != options.mode) {
            let text = match mode {
                GroupMode::Members => format!("{group} is not keyed by its daemons; its members agree their own keys"),
                mode => format!("{group} is a {} group (integrated architecture); join it as such", mode.name()),
            };
            self.reply(conn, Delivery::error(ErrorCode::ModeMismatch, text), out);
            return;
        }
        let name = client.name.clone();
        let since = self.next_view;
        self.clients.get_mut(&conn).expect("checked").groups.insert(group.clone());
        let i = match joins.groups.iter().position(|(g, ..)| *g == group) {
            Some(i) => i,
            None => {
                joins.groups.push((group.clone(), existing.unwrap_or(options), Vec::new()));
                joins.groups.len() - 1
            }
        };
        joins.groups[i].2.push(NewSeat { conn, id: name, since, prev: None });
    }

    /// Installs one view of each group of `joins`: its members and its joiners.
    fn install_joins(&mut self, joins: Joins, out: &mut Vec<Output>) {
        for (group, options, joiners) in joins.groups {
            let mut seats = self.seats_of(&group);
            seats.extend(joiners);
            self.install(group, options, seats, Cause::Join, out);
        }
    }

    /// A run of joins that arrived together at a standalone daemon, which
    /// orders its clients' operations itself: handled as [`Core::handle`]
    /// handles each in turn, except that each group gets one view with all
    /// of its joiners, not one view per joiner. Nothing can be ordered
    /// between them, so no member could have told those views apart by
    /// what it was delivered in them; skipping them saves every member a
    /// view (and, in the secure layer, a key agreement run) per joiner —
    /// n views of up to n members each when n clients start a group at once.
    /// Anything but a plain join, and any join while the daemon group is
    /// changing, is handled on its own, in order; so is a client's second
    /// join of the run (after the views of the joins before it).
    pub fn handle_joins(&mut self, ops: Vec<Op>, out: &mut Vec<Output>) {
        let mut joins = Joins::default();
        for op in ops {
            match op {
                Op::Join { conn, group, open, mode }
                    if self.exchange.is_none() && self.daemons.contains(&conn.daemon) =>
                {
                    // A client's second join waits for its first's view, so
                    // that what it is told comes in the order it asked.
                    if joins.has(conn) {
                        self.install_joins(std::mem::take(&mut joins), out);
                    }
                    self.admit(conn, group, Options { open, mode }, &mut joins, out);
                }
                op => {
                    self.install_joins(std::mem::take(&mut joins), out);
                    self.handle(op, out);
                }
            }
        }
        self.install_joins(joins, out);
    }

    fn leave(&mut self, conn: ConnId, group: GroupName, out: &mut Vec<Output>) {
        let Some(client) = self.client(conn, out) else { return };
        if !client.groups.contains(&group) {
            let (code, text) = if self.groups.contains_key(&group) {
                (ErrorCode::NotMember, format!("{} is not a member of {group}", client.name))
            } else {
                (ErrorCode::UnknownGroup, format!("no group {group}"))
            };
            self.reply(conn, Delivery::error(code, text), out);
            return;
        }
        self.clients.get_mut(&conn).expect("checked").groups.remove(&group);
        self.reply(conn, Delivery::Left { group: group.clone() }, out);
        self.remove_seat(group, conn, Cause::Leave, out);
    }

    /// The current members of `group` as members of its next view.
    fn seats_of(&self, group: &GroupName) -> Vec<NewSeat> {
        let Some(g) = self.groups.get(group) else { return Vec::new() };
        g.view
            .members
            .iter()
            .zip(&g.seats)
            .map(|(m, s)| NewSeat { conn: s.conn, id: m.id.clone(), since: s.since, prev: Some(g.view.id) })
            .collect()
    }

    fn remove_seat(&mut self, group: GroupName, conn: ConnId, cause: Cause, out: &mut Vec<Output>) {
        let mut seats = self.seats_of(&group);
        seats.retain(|s| s.conn != conn);
        let options = self.groups.get(&group).map(|g| g.options).unwrap_or_default();
        self.install(group, options, seats, cause, out);
    }

    /// Installs the next view of `group` with `seats` (oldest first), or
    /// removes the group if no one is left.
    fn install(
        &mut self,
        group: GroupName,
        options: Options,
        seats: Vec<NewSeat>,
        cause: Cause,
        out: &mut Vec<Output>,
    ) {
        if seats.is_empty() {
            self.groups.remove(&group);
            return;
        }
        assert!(self.next_view < 1 << COUNTER_BITS, "view counter exhausted");
        let id = ViewId::new(self.view_incarnation, (u64::from(self.tag) << COUNTER_BITS) | self.next_view);
        self.next_view += 1;
        let members = seats.iter().map(|s| ViewMember { id: s.id.clone(), prev: s.prev }).collect();
        let seats: Vec<Seat> = seats.into_iter().map(|s| Seat { conn: s.conn, since: s.since }).collect();
        let view = View { id, members, cause };
        if self.keys_groups && options.mode == GroupMode::OptimizedEvs {
            self.evs_views.push((group.clone(), id));
        }
        let delivery = Delivery::View { group: group.clone(), view: view.clone() };
        self.deliver(seats.iter().map(|s| s.conn), delivery, out);
        self.groups.insert(group, Group { options, view, seats });
    }

    /// Installs a view of `group` with `seats` that the next view of the
    /// group supersedes at once (see `split_transitional_sets`): delivered,
    /// numbered like any other, and returned.
    fn install_detached(
        &mut self,
        group: &GroupName,
        options: Options,
        seats: Vec<NewSeat>,
        out: &mut Vec<Output>,
    ) -> ViewId {
        self.install(group.clone(), options, seats, Cause::Network, out);
        self.groups.remove(group).expect("installed with members").view.id
    }

    /// This daemon's clients and their groups.
    fn snapshot(&self, cut: &BTreeSet<DaemonId>) -> DaemonState {
        let clients = self
            .clients
            .iter()
            .filter(|(conn, _)| conn.daemon == self.me)
            .map(|(&conn, c)| ClientState {
                conn,
                name: c.name.clone(),
                groups: c
                    .groups
                    .iter()
                    .map(|name| {
                        let g = &self.groups[name];
                        let seat = g.seats.iter().find(|s| s.conn == conn).expect("member has a seat");
                        Membership {
                            group: name.clone(),
                            open: g.options.open,
                            mode: g.options.mode,
                            view: g.view.id,
                            since: seat.since,
                        }
                    })
                    .collect(),
            })
            .collect();
        let cut = cut.iter().copied().collect();
        let applied = self
            .lineage
            .get(&self.me)
            .filter(|a| a.incarnation == self.incarnation)
            .map_or_else(AppliedOps::default, Applied::ops);
        DaemonState {
            daemon: self.me,
            next_view: self.next_view,
            incarnation: self.incarnation,
            view_incarnation: self.view_incarnation,
            applied,
            cut,
            clients,
        }
    }

    fn daemons_changed(&mut self, epoch: u64, members: Vec<DaemonId>, out: &mut Vec<Output>) {
        let members: BTreeSet<DaemonId> = members.into_iter().collect();
        self.transitional_set = None;
        let (held, cut) = match self.exchange.take() {
            Some(x) if members.is_subset(&x.members) => (x.held, x.cut),
            Some(x) => {
                for op in x.held.into_iter().filter(|op| op.conn().is_some_and(|c| c.daemon == self.me)) {
                    out.push(Output::Submit(op));
                }
                (Vec::new(), x.cut)
            }
            None => {
                for (group, g) in &self.groups {
                    let delivery = Delivery::ViewChangeBegins { group: group.clone() };
                    self.deliver(g.seats.iter().map(|s| s.conn), delivery, out);
                }
                (Vec::new(), members.clone())
            }
        };
        if members.contains(&self.me) && !self.state_in_flight {
            self.state_in_flight = true;
            out.push(Output::Submit(Op::State { epoch, state: self.snapshot(&cut) }));
        }
        self.exchange = Some(Exchange { epoch, members, cut, states: BTreeMap::new(), held });
    }

    /// A transitional set begins: whatever this set installs from here on
    /// gets ids no other set of the stopped configuration can give, since
    /// the sets deliver different remainders (see *Transitional sets* in the
    /// module docs). Every member of the set is at the same point of the
    /// stream here, so all derive the same value.
    fn transitional(&mut self, members: &[DaemonId]) {
        let members: BTreeSet<DaemonId> = members.iter().copied().collect();
        self.transitional_set = Some(members);
        self.derive_transitional_ids();
    }

    /// Gives the views installed from here on the transitional set's own ids.
    fn derive_transitional_ids(&mut self) {
        let Some(members) = &self.transitional_set else { return };
        let start = derive(derive(self.view_incarnation, TRANSITIONAL), self.next_view);
        self.view_incarnation = members.iter().fold(start, |h, d| derive(h, u64::from(d.0)));
    }

    fn state_arrived(&mut self, epoch: u64, state: DaemonState, out: &mut Vec<Output>) {
        if state.daemon == self.me {
            self.state_in_flight = false;
        }
        let Some(x) = &mut self.exchange else { return };
        if x.epoch != epoch || !x.members.contains(&state.daemon) {
            return;
        }
        x.states.entry(state.daemon).or_insert(state);
        if x.states.len() == x.members.len() {
            let x = self.exchange.take().expect("exchanging");
            self.rebuild(x, out);
        }
    }

    /// Rebuilds clients and groups from the exchanged states, installs a
    /// network view of every group, and applies the held operations.
    fn rebuild(&mut self, x: Exchange, out: &mut Vec<Output>) {
        self.clients.clear();
        self.names.clear();
        self.groups.clear();
        self.daemons = x.members;
        self.tag = self.daemons.first().map_or(self.me.0, |d| d.0);
        self.next_view = x.states.values().map(|s| s.next_view).max().unwrap_or(self.next_view);
        // Fresh ids for the new configuration: the old one's counter may have
        // gone on elsewhere (in another component, past where this one's
        // daemons stopped), so the same tag and counter could name another
        // view there. Every core of the configuration derives the same value
        // from the same states.
        let tag_incarnation = x.states.get(&DaemonId(self.tag)).map_or(self.incarnation, |s| s.incarnation);
        self.view_incarnation = x.states.values().fold(derive(tag_incarnation, REBUILT), |h, s| {
            let h = derive(derive(derive(h, u64::from(s.daemon.0)), s.incarnation), s.next_view);
            derive(h, s.view_incarnation)
        });
        self.configuration = ViewId::new(self.view_incarnation, u64::from(self.tag) << COUNTER_BITS);
        // What the rebuilt groups have seen of each origin is what its own
        // state says.
        self.lineage = x.states.values().map(|s| (s.daemon, Applied::from_ops(s.incarnation, &s.applied))).collect();
        let floors: Vec<(DaemonId, u64, u64)> =
            self.lineage.iter().map(|(&origin, l)| (origin, l.incarnation, l.floor)).collect();
        let mut groups: BTreeMap<GroupName, Vec<(Membership, NewSeat, Vec<DaemonId>)>> = BTreeMap::new();
        for state in x.states.into_values() {
            for c in state.clients.into_iter().filter(|c| c.conn.daemon == state.daemon) {
                if self.names.contains_key(&c.name) || self.clients.contains_key(&c.conn) {
                    let text = format!("{} was claimed in another partition first", c.name);
                    self.reply(c.conn, Delivery::error(ErrorCode::NameTaken, text), out);
                    continue;
                }
                self.names.insert(c.name.clone(), c.conn);
                let names = c.groups.iter().map(|m| m.group.clone()).collect();
                self.clients.insert(c.conn, Client { name: c.name.clone(), groups: names });
                for m in c.groups {
                    let seat = NewSeat { conn: c.conn, id: c.name.clone(), since: m.since, prev: Some(m.view) };
                    groups.entry(m.group.clone()).or_default().push((m, seat, state.cut.clone()));
                }
            }
        }
        for (group, mut entries) in groups {
            entries.sort_by_key(|(m, s, _)| (m.since, s.conn));
            let options = Options { open: entries[0].0.open, mode: entries[0].0.mode };
            self.split_transitional_sets(&group, options, &mut entries, out);
            let seats = entries.into_iter().map(|(_, s, _)| s).collect();
            self.install(group, options, seats, Cause::Network, out);
        }
        // An exchange may complete in a transitional set's own delivery,
        // after the point where the set's rest of the stream began: then
        // the network views above are what every daemon of the
        // configuration installs from the same states, but the held
        // operations are the set's own rest, holes and all (another set,
        // which completed the exchange before it stopped, may have applied
        // others), so what they install takes the set's own ids.
        self.derive_transitional_ids();
        for op in x.held {
            self.handle(op, out);
        }
        // Only now does the delivered record forget what no copy can bring:
        // a held operation was ordered before the states, and may be one
        // this core has yet to deliver although its origin has applied it.
        for (origin, incarnation, floor) in floors {
            let delivered = self.delivered.entry(origin).or_insert_with(|| Applied::new(incarnation));
            if delivered.incarnation != incarnation {
                *delivered = Applied::new(incarnation);
            }
            delivered.raise(floor);
        }
    }

    /// Members that name the same view of `group` as their last but come
    /// with different cuts did not deliver the same messages in it: a merge
    /// came before their partition's exchange had installed the partition's
    /// views. So that the view installed next never puts them together as
    /// having moved from that view (virtual synchrony), each such set first
    /// gets the partition view it missed (every core computes the same ones,
    /// from the same states), and its members name that view instead.
    fn split_transitional_sets(
        &mut self,
        group: &GroupName,
        options: Options,
        entries: &mut [(Membership, NewSeat, Vec<DaemonId>)],
        out: &mut Vec<Output>,
    ) {
        let mut cuts: BTreeMap<ViewId, BTreeSet<&Vec<DaemonId>>> = BTreeMap::new();
        for (m, _, cut) in entries.iter() {
            cuts.entry(m.view).or_default().insert(cut);
        }
        let split: BTreeSet<(ViewId, Vec<DaemonId>)> = cuts
            .into_iter()
            .filter(|(_, cuts)| cuts.len() > 1)
            .flat_map(|(view, cuts)| cuts.into_iter().map(move |c| (view, c.clone())))
            .collect();
        for (view, cut) in split {
            let set = |(m, _, c): &&mut (Membership, NewSeat, Vec<DaemonId>)| m.view == view && *c == cut;
            let seats: Vec<NewSeat> = entries.iter_mut().filter(|e| set(e)).map(|(_, s, _)| s.clone()).collect();
            let id = self.install_detached(group, options, seats, out);
            for (_, seat, _) in entries.iter_mut().filter(|e| set(e)) {
                seat.prev = Some(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Applied, MAX_APPLIED_RANGES as MAX_RANGES};

    #[test]
    fn applied_numbers_are_told_once_in_any_order_and_fold_into_the_floor() {
        let mut a = Applied::new(1);
        for n in [3, 1, 5, 4] {
            assert!(a.insert(n), "{n} is new");
        }
        assert!(!a.insert(4) && !a.insert(1));
        assert_eq!((a.floor, a.above.len()), (0, 2), "ranges 1 and 3..=5");
        assert!(a.insert(0));
        assert!(a.insert(2));
        assert_eq!((a.floor, a.above.len()), (6, 0), "0..=5 folded into the floor");
        assert!(!a.insert(2));
        assert!(a.insert(u64::MAX) && !a.insert(u64::MAX));
    }

    #[test]
    fn a_raised_floor_swallows_what_it_covers() {
        let mut a = Applied::new(1);
        for n in [2, 7, 8, 20] {
            a.insert(n);
        }
        a.raise(8);
        assert_eq!((a.floor, a.above.len()), (9, 1), "7..=8 reached the floor; 20 stays");
        assert!(!a.insert(3), "below the floor counts as applied");
        assert!(a.insert(10) && !a.insert(20));
        a.raise(5);
        assert_eq!(a.floor, 9, "a floor never sinks");
    }

    #[test]
    fn the_ranges_stay_bounded_and_the_latest_are_kept() {
        let mut a = Applied::new(1);
        for i in 1..=1000u64 {
            assert!(a.insert(2 * i));
            assert!(a.above.len() <= MAX_RANGES);
        }
        for i in 1000 - MAX_RANGES as u64 + 1..=1000 {
            assert!(!a.insert(2 * i), "a recent one is remembered");
            assert!(a.insert(2 * i - 1), "and so is the gap below it");
        }
    }
}
