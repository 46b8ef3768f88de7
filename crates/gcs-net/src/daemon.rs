//! The standalone daemon: client connections on a Unix socket, on TCP and
//! on TCP with TLS, one ordered stream into a [`Core`], deliveries out through bounded
//! per-client queues.
//!
//! Tasks:
//! * one accept loop per listener;
//! * per connection, a reader (frames → [`Op`]s submitted to the backbone)
//!   and a writer (its queue → the socket);
//! * one sequencer that takes the ordered stream, runs the core, and hands
//!   each delivery to its recipients' queues without ever waiting on them.
//!
//! The [`Backbone`] orders the stream. The standalone backbone is a channel:
//! the order in which the sequencer receives operations is the total order. A
//! cluster backbone (`crate::cluster`, feature `cluster`) routes submissions
//! through the daemon group and feeds the sequencer what the group delivers;
//! nothing else changes. If a backbone fails, the daemon tells its clients why,
//! closes their connections and reports the failure ([`Daemon::failed`]).
//!
//! A client whose queue is full — [`DaemonConfig::queue_depth`] frames or
//! [`DaemonConfig::queue_bytes`] bytes not yet written to its socket — is cut
//! off ([`ErrorCode::QueueOverflow`]) so it cannot stall anyone else or grow
//! the daemon without bound; a client that sends a malformed frame gets an
//! error frame and is disconnected; a frame over the size limit is answered
//! with [`ErrorCode::TooLarge`] and skipped, and the connection goes on.
//!
//! Time limits: a new connection must say Hello within
//! [`DaemonConfig::hello_timeout`]; after that, a frame it has begun must be
//! complete within [`DaemonConfig::frame_timeout`] ([`ErrorCode::Timeout`]),
//! while a client that sends nothing at all may stay as long as it likes:
//! quiet members are normal in group communication. What must not stay is a
//! TCP or TLS peer that vanished without closing (a machine switched off, a
//! cable cut), holding its connection and its name: the daemon turns on TCP
//! keepalive ([`DaemonConfig::keepalive`]), so the kernel probes a connection
//! quiet that long and closes it when the peer does not answer. (A Unix
//! socket's peer cannot vanish unnoticed.) TLS
//! handshakes must finish within [`DaemonConfig::handshake_timeout`]; at most
//! [`DaemonConfig::max_handshakes`] are under way at once, at most
//! [`DaemonConfig::max_handshakes_per_ip`] from one address, and a newcomer
//! over either bound evicts the oldest pending handshake (of its address, or
//! of all) rather than being refused, so idle sockets cannot keep valid
//! clients out.
//!
//! Connections: at most [`DaemonConfig::max_connections`] client connections
//! at once (lowered at start, with a warning, to fit the process's descriptor
//! limit), and at most [`DaemonConfig::max_connections_per_peer`] from one IP
//! address (TCP, TLS) or one Unix user (the Unix socket's peer credentials).
//! A connection counts from when it is accepted, Hello or not, until it is
//! closed; one over a cap is told so ([`wire::TOO_MANY_CONNECTIONS`]) instead
//! of Welcome and closed, and refusals are logged at most every ten seconds.
//! A listener that cannot accept (out of descriptors, say) pauses briefly
//! rather than spin.
//!
//! A TLS client that showed a certificate is bound to the member name the
//! certificate certifies: a Hello with another name ends the connection with
//! [`ErrorCode::IdentityMismatch`]. The certificates it demands can change
//! while it runs ([`Daemon::reload_client_auth`]): a member revoked then is cut
//! off ([`ErrorCode::Revoked`]) and leaves its groups like any client that
//! disconnects, so that secure groups rekey without it.
//!
//! Names are first come, first served, so on a daemon that certifies names a
//! client without a certificate must not take one a certified member could
//! claim: [`DaemonConfig::uncertified_names`] restricts such clients to the
//! names listed for their Unix user (the socket's peer credentials), and
//! refuses any other Hello with [`ErrorCode::IdentityMismatch`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use conclave_gcs::core::{ConnId, Core, DaemonId, Delivery, ErrorCode, GroupMode, Limits, Machine, Op, Output};
use conclave_gcs::wire::{self, ConnectionStatus, FrameReader, GroupStatus, Request, Status, StatusReply, WireError};
use conclave_gcs::{GroupName, MemberId, View, ViewId};
use conclave_gka::suite::ed25519::Ed25519Signer;
use conclave_integrated::{DaemonIdentities, DaemonTrust, KeyedDaemon};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

use crate::access::{AccessPolicy, Action, Principal, Who};
use crate::tls::{
    Certified, ClientAuth, HandshakeLimits, Identity, SharedTrust, TlsError, TlsListen, TlsListener, Trust,
};

/// How a daemon is set up.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// Path of the Unix socket to listen on, if any. Nothing may exist at
    /// the path; the daemon removes the socket when it stops (or fails to
    /// start).
    pub unix: Option<PathBuf>,
    /// TCP address to listen on, if any (port 0 picks a free port).
    pub tcp: Option<SocketAddr>,
    /// TLS listener, if any.
    pub tls: Option<TlsListen>,
    /// Largest message payload accepted, in bytes.
    pub max_payload: usize,
    /// Groups one client may be a member of at once.
    pub max_groups_per_client: usize,
    /// Frames queued for one client before it is cut off as too slow
    /// (default 4096).
    pub queue_depth: usize,
    /// Bytes queued for one client before it is cut off as too slow, counted
    /// from when the daemon queues a frame until it is written to the socket
    /// (default 64 MiB). Must hold at least one largest message.
    pub queue_bytes: usize,
    /// Time a new connection has to say Hello (default 10 s).
    pub hello_timeout: Duration,
    /// Time a connection that said Hello has to complete a frame it began
    /// (default 30 s); a connection that sends nothing is never timed out.
    pub frame_timeout: Duration,
    /// Time a new TLS connection has to complete its handshake (default 3 s).
    pub handshake_timeout: Duration,
    /// TLS handshakes under way at once (default 1024); a new connection
    /// beyond that evicts the oldest pending handshake.
    pub max_handshakes: usize,
    /// TLS handshakes under way at once from one IP address (default 64); a
    /// new connection beyond that evicts the oldest pending handshake of the
    /// same address.
    pub max_handshakes_per_ip: usize,
    /// Client connections at once, with or without Hello (default 4096); a
    /// new one beyond that is refused ([`wire::TOO_MANY_CONNECTIONS`]). Lowered
    /// at start to fit the process's descriptor limit (`ulimit -n`), keeping
    /// descriptors for TLS handshakes and the daemon's own use.
    pub max_connections: usize,
    /// Client connections at once from one IP address (TCP and TLS) or one
    /// Unix user (the Unix socket) (default 256); a new one beyond that is
    /// refused ([`wire::TOO_MANY_CONNECTIONS`]).
    pub max_connections_per_peer: usize,
    /// TCP keepalive on TCP and TLS connections: after this long without
    /// traffic the kernel probes the peer, three times at a quarter of this
    /// apart, and closes the connection if it never answers, so a peer that
    /// vanished frees its connection and its name within about 1¾ times this
    /// (default 60 s; `None`: off). A live client that is quiet is not
    /// disturbed: its kernel answers.
    pub keepalive: Option<Duration>,
    /// The member names clients without a certificate may take (default: any).
    pub uncertified_names: UncertifiedNames,
    /// Keyed groups (the integrated architecture): the longest one key of
    /// the daemons is used before they agree a new one and every keyed group
    /// gets a new view (time-out; default: none). Every daemon of a cluster
    /// should have the same.
    pub key_lifetime: Option<Duration>,
    /// Keyed groups: the most payload bytes keyed groups send under one key
    /// of the daemons before it is renewed (data-out; default: none). Every
    /// daemon of a cluster must have the same: each counts the one stream.
    pub key_data_limit: Option<u64>,
    /// Optimized EVS groups: the most view keys kept per group for
    /// re-encrypting late messages (key-out; default
    /// [`conclave_integrated::evs::DEFAULT_KEY_OUT`]).
    pub evs_key_out: usize,
    /// Optimized EVS groups: a view key no message came under for this long
    /// is dropped (time-out; default one minute).
    pub evs_time_out: Duration,
    /// Who may create, join and send to which groups (default `None`: every
    /// client may do everything). Refusals are [`wire::ACCESS_DENIED`].
    pub access: Option<AccessPolicy>,
    /// Who may read the daemon's status ([`Request::Status`]) besides the
    /// daemon's own Unix user and root on the Unix socket, who always may
    /// (default: no one else).
    pub operators: Vec<Who>,
}

/// The member names clients without a certificate (on the Unix socket, over
/// TCP, over TLS without a client certificate) may take.
#[derive(Clone, Debug, Default)]
pub enum UncertifiedNames {
    /// Any name: the daemon certifies no one, names are first come, first served.
    #[default]
    Any,
    /// On the Unix socket, the names listed for the Unix user id of the
    /// connecting process: exact names, or patterns where `*` stands for any
    /// run of characters (`bot-*`). Over TCP, none.
    ByUid(BTreeMap<u32, Vec<String>>),
}

impl UncertifiedNames {
    /// Whether a client may say Hello as `name`; if not, why, in words.
    fn check(&self, peer: &Peer, name: &MemberId) -> Result<(), String> {
        match (peer, self) {
            (Peer::Certified(c), _) if c.name == *name => Ok(()),
            (Peer::Certified(c), _) => Err(format!("certificate is for {}, Hello says {name}", c.name)),
            (_, UncertifiedNames::Any) => Ok(()),
            (Peer::Local { uid }, UncertifiedNames::ByUid(names)) => {
                if names.get(uid).is_some_and(|patterns| patterns.iter().any(|p| matches_pattern(p, name.as_str()))) {
                    Ok(())
                } else {
                    Err(format!(
                        "this daemon certifies member names: a local client of user {uid} may not take the name \
                         {name} (the daemon's configuration lists the names each user may take), or connect over \
                         TLS with a certificate for {name}"
                    ))
                }
            }
            (Peer::Remote { .. }, UncertifiedNames::ByUid(_)) => {
                Err(format!("this daemon certifies member names: connect over TLS with a certificate for {name}"))
            }
        }
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters and everything else for itself.
pub(crate) fn matches_pattern(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(tail) = name.strip_prefix(head) else { return false };
            (0..=tail.len()).filter(|&i| tail.is_char_boundary(i)).any(|i| matches_pattern(rest, &tail[i..]))
        }
    }
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            unix: None,
            tcp: None,
            tls: None,
            max_payload: wire::DEFAULT_MAX_PAYLOAD,
            max_groups_per_client: Limits::default().max_groups_per_client,
            queue_depth: 4096,
            queue_bytes: 64 << 20,
            hello_timeout: Duration::from_secs(10),
            frame_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(3),
            max_handshakes: 1024,
            max_handshakes_per_ip: 64,
            max_connections: 4096,
            max_connections_per_peer: 256,
            keepalive: Some(Duration::from_secs(60)),
            uncertified_names: UncertifiedNames::Any,
            key_lifetime: None,
            key_data_limit: None,
            evs_key_out: conclave_integrated::evs::DEFAULT_KEY_OUT,
            evs_time_out: Duration::from_micros(conclave_integrated::evs::DEFAULT_TIME_OUT),
            access: None,
            operators: Vec::new(),
        }
    }
}

/// How long a connection that is being closed gets to take its last frames.
const LAST_WORDS: Duration = Duration::from_secs(2);

/// Connections being refused (told why, then closed) at once; beyond that a
/// connection over a cap is closed without a word.
const REFUSING: usize = 32;

/// Descriptors the daemon keeps for itself out of its descriptor limit:
/// listeners, the runtime, the backbone, files it reads, and connections
/// being refused.
const RESERVED_DESCRIPTORS: u64 = 64 + REFUSING as u64;

/// How often refused connections are reported while refusals go on.
const REFUSAL_REPORT: Duration = Duration::from_secs(10);

/// Operations applied per lock of the connection table.
const BATCH: usize = 256;

/// The standalone daemon's number: it is alone in its daemon group.
const STANDALONE: DaemonId = DaemonId(0);

/// What orders the daemon's stream of operations: where connections submit
/// them, and where the sequencer takes them from in their total order.
pub struct Backbone {
    me: DaemonId,
    /// The incarnation of this start of the daemon: its core's, and the one
    /// a cluster backbone numbers client operations with.
    incarnation: u64,
    submit: mpsc::Sender<Op>,
    ordered: mpsc::Receiver<Op>,
    failure: oneshot::Receiver<String>,
    resources: Option<Box<dyn Send + Sync>>,
    /// How the daemon keys groups (see `start`).
    keying: Keying,
    /// Whether this daemon orders its stream alone (the standalone backbone).
    standalone: bool,
}

/// Whether and how a daemon keys groups (the integrated architecture; see
/// `conclave-integrated`).
enum Keying {
    /// A standalone daemon is its own daemon group and keys groups with a
    /// key of its own, under a signing key drawn at start.
    Alone,
    /// A cluster daemon admits to the daemons' key agreement the daemons this
    /// trust admits, and (if `sealed`) seals its clients' operations on the
    /// backbone under the daemons' key (`conclave_integrated::seal`).
    Trusted { trust: Box<dyn DaemonTrust>, sealed: bool },
    /// A cluster daemon without a daemon identity refuses keyed joins
    /// (`ModeMismatch`).
    Off,
}

impl Backbone {
    /// The standalone backbone: one channel whose order is the total order,
    /// daemon number 0.
    pub fn standalone() -> Self {
        let (submit, ordered) = mpsc::channel(1024);
        // Never fails: the sender is dropped, so the receiver reports no failure.
        let (_, failure) = oneshot::channel();
        Self {
            me: STANDALONE,
            incarnation: new_incarnation(),
            submit,
            ordered,
            failure,
            resources: None,
            keying: Keying::Alone,
            standalone: true,
        }
    }

    /// A backbone that orders operations elsewhere: the daemon sends every
    /// operation to `submit` and runs its core, of `incarnation` (from
    /// [`new_incarnation`]), over what arrives on `ordered`. When the
    /// backbone fails it sends the reason on `failure`, then closes
    /// `ordered`. `resources` live as long as the daemon.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn new(
        me: DaemonId,
        incarnation: u64,
        submit: mpsc::Sender<Op>,
        ordered: mpsc::Receiver<Op>,
        failure: oneshot::Receiver<String>,
        resources: Box<dyn Send + Sync>,
    ) -> Self {
        Self {
            me,
            incarnation,
            submit,
            ordered,
            failure,
            resources: Some(resources),
            keying: Keying::Off,
            standalone: false,
        }
    }

    /// Lets this (cluster) daemon key groups: it takes part in the daemons'
    /// key agreement as `trust` says, and admits the daemons it admits.
    /// Every daemon of the cluster should be given the same trust (the
    /// same authority); one that others do not admit gets no key, and its
    /// clients no keyed views.
    ///
    /// Its clients' operations then cross to the other daemons sealed under
    /// a key derived from the daemons' key (the Three-Step client–server
    /// architecture's server-to-server protection; see
    /// `conclave_integrated::seal`), unless [`Backbone::unsealed`] says
    /// otherwise. Every daemon of a cluster must do the same.
    pub fn with_daemon_trust(mut self, trust: impl DaemonTrust + 'static) -> Self {
        self.keying = Keying::Trusted { trust: Box::new(trust), sealed: true };
        self
    }

    /// Keeps the clients' operations in clear on the backbone (as far as this
    /// daemon's layer goes: Corosync's own encryption still applies) though
    /// the daemons share a key: for measuring what sealing costs. Every
    /// daemon of a cluster must do the same.
    pub fn unsealed(mut self) -> Self {
        if let Keying::Trusted { sealed, .. } = &mut self.keying {
            *sealed = false;
        }
        self
    }

    /// This daemon's number in the daemon group.
    pub fn daemon_id(&self) -> DaemonId {
        self.me
    }
}

/// A fresh incarnation for one start of the daemon: view ids (and all that
/// members sign over them) never repeat across restarts, nor do the
/// identities of a cluster daemon's client operations.
pub(crate) fn new_incarnation() -> u64 {
    rand_core::RngCore::next_u64(&mut rand_core::OsRng)
}

/// What the sequencer holds for one connection.
struct ConnHandle {
    queue: mpsc::Sender<Bytes>,
    kill: mpsc::Sender<Bytes>,
    /// Bytes queued and not yet written to the socket: added here on
    /// enqueue, subtracted by the writer as it writes them.
    queued: Arc<AtomicUsize>,
    /// Most bytes `queued` may hold ([`DaemonConfig::queue_bytes`]).
    budget: usize,
    /// The certificate the client showed, if it did: checked again when the
    /// daemon's trust changes.
    certified: Option<Certified>,
    /// Who the client is, for the status and the access rules.
    info: Arc<ConnInfo>,
    /// The last view written to the client of each of its groups, if it
    /// reads views as changes ([`ConnInfo::view_changes`]): the next view
    /// of a group goes as changes to it when it is the daemon's last view
    /// of the group ([`deliver_view`]).
    views: HashMap<GroupName, ViewId>,
}

/// What the daemon knows of a connection's peer.
struct ConnInfo {
    /// For people: transport, address or Unix user, certificate.
    peer: String,
    /// When it was accepted.
    since: Instant,
    /// What the access rules see; its name is bound at Hello.
    principal: Mutex<Principal>,
    /// The client's Hello asked for views as changes (`wire::ViewMemory`).
    view_changes: AtomicBool,
}

/// Closes a connection after one last error frame, dropping what is queued.
fn kill(kill: &mpsc::Sender<Bytes>, code: ErrorCode, text: impl Into<String>) {
    // A full kill channel means the connection is being closed already.
    let _ = kill.try_send(frame(&Delivery::Error { code, text: text.into() }));
}

type Conns = Arc<Mutex<HashMap<ConnId, ConnHandle>>>;

/// What every connection task shares.
struct Shared {
    config: DaemonConfig,
    conns: Conns,
    submit: mpsc::Sender<Op>,
    me: DaemonId,
    next_conn: AtomicU64,
    /// What TLS handshakes are checked against, if there is a TLS listener.
    trust: Option<SharedTrust>,
    /// The connection caps and the connections they count.
    caps: Arc<Caps>,
    /// Permits for connections being refused ([`REFUSING`]).
    refusing: Arc<Semaphore>,
    /// Asks the sequencer for what the core knows, for a status report.
    snapshots: mpsc::Sender<oneshot::Sender<Snapshot>>,
    /// When the daemon started.
    started: Instant,
    /// The connection and TLS handshake caps in force.
    max_connections: usize,
    max_handshakes: usize,
    /// Whether this daemon orders its stream alone.
    standalone: bool,
    /// The groups that exist, as the sequencer last applied the stream:
    /// kept only in a cluster with access rules, where a join is checked
    /// when it is read (see [`check_join`]).
    groups: Arc<RwLock<HashSet<GroupName>>>,
    /// This daemon's Unix user: its Unix-socket clients may read the status.
    euid: u32,
    /// Bytes read from and written to clients.
    traffic: Arc<Traffic>,
}

/// Bytes a daemon has read from its clients and written to them since it
/// started (every connection, every frame): what a benchmark reports as the
/// traffic through the daemon.
#[derive(Debug, Default)]
pub struct Traffic {
    read: AtomicU64,
    written: AtomicU64,
}

impl Traffic {
    /// Bytes read from clients so far.
    pub fn read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// Bytes written to clients so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}

/// Whom a connection counts against for [`DaemonConfig::max_connections_per_peer`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum PeerKey {
    /// A TCP or TLS client's IP address.
    Ip(IpAddr),
    /// A Unix socket client's user id.
    Uid(u32),
}

impl fmt::Display for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerKey::Ip(ip) => write!(f, "IP address {ip}"),
            PeerKey::Uid(uid) => write!(f, "Unix user {uid}"),
        }
    }
}

/// The connection caps in force and the connections they count.
struct Caps {
    max: usize,
    per_peer: usize,
    count: Mutex<CapCount>,
}

#[derive(Default)]
struct CapCount {
    total: usize,
    by_peer: HashMap<PeerKey, usize>,
    /// Refusals not yet reported, and when they last were.
    refused: u64,
    reported: Option<Instant>,
}

/// One connection's place under the caps, given back when it is dropped.
struct Slot {
    caps: Arc<Caps>,
    key: PeerKey,
}

impl Caps {
    /// A place for a new connection from `key`, or why there is none, in
    /// words for the client.
    fn take(self: &Arc<Self>, key: PeerKey) -> Result<Slot, String> {
        let mut count = self.count.lock().expect("connection caps");
        let why = if count.total >= self.max {
            format!(
                "the daemon already serves as many client connections as it may ({}): connection refused, try again \
                 later",
                self.max
            )
        } else if count.by_peer.get(&key).copied().unwrap_or(0) >= self.per_peer {
            format!(
                "the daemon already serves as many connections from your {key} as it may ({}): connection refused; \
                 close some of them, or try again later",
                self.per_peer
            )
        } else {
            count.total += 1;
            *count.by_peer.entry(key).or_default() += 1;
            return Ok(Slot { caps: self.clone(), key });
        };
        count.refused += 1;
        if count.reported.is_none_or(|at| at.elapsed() >= REFUSAL_REPORT) {
            tracing::warn!(
                "too many client connections (at most {} in all, {} per IP address or Unix user): {} new connections \
                 refused; the last from {key}",
                self.max,
                self.per_peer,
                count.refused
            );
            count.refused = 0;
            count.reported = Some(Instant::now());
        }
        Err(why)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut count = self.caps.count.lock().expect("connection caps");
        count.total -= 1;
        if let Some(n) = count.by_peer.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                count.by_peer.remove(&self.key);
            }
        }
    }
}

/// Raises this process's soft limit on open descriptors (`RLIMIT_NOFILE`) to
/// its hard limit, and returns the soft limit in force after (`None`:
/// unlimited). A daemon process calls this before [`Daemon::start`], which
/// fits its connection caps to the limit; the default soft limit (often
/// 1024) is far below what a busy daemon needs.
pub fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    if let (Some(soft), Some(hard)) = (limit.current, limit.maximum) {
        if soft < hard && setrlimit(Resource::Nofile, rustix::process::Rlimit { current: Some(hard), ..limit }).is_ok()
        {
            return Some(hard);
        }
    }
    limit.current
}

/// The connection and TLS handshake caps that fit in `limit` descriptors
/// (this process's soft limit, `None`: unlimited), keeping
/// [`RESERVED_DESCRIPTORS`]: the configured caps if they fit, else lower ones
/// (handshakes get at most a quarter of what is left), with a warning.
fn fit_descriptors(config: &DaemonConfig, limit: Option<u64>) -> Result<(usize, usize), DaemonError> {
    let wanted = (config.max_connections, config.max_handshakes);
    let Some(limit) = limit else { return Ok(wanted) };
    let room = usize::try_from(limit.saturating_sub(RESERVED_DESCRIPTORS)).unwrap_or(usize::MAX);
    let handshakes = match config.tls {
        Some(_) => config.max_handshakes.min((room / 4).max(1)),
        None => 0,
    };
    let connections = config.max_connections.min(room.saturating_sub(handshakes));
    if connections == 0 {
        return Err(DaemonError::Descriptors { limit, needed: RESERVED_DESCRIPTORS + 2 });
    }
    let handshakes = if config.tls.is_some() { handshakes } else { config.max_handshakes };
    if (connections, handshakes) != wanted {
        tracing::warn!(
            "the descriptor limit (ulimit -n) is {limit}: serving at most {connections} client connections \
             (configured: {}){}, keeping {RESERVED_DESCRIPTORS} descriptors for the daemon itself; raise the limit \
             (ulimit -n, or LimitNOFILE= in a systemd unit) to serve more",
            config.max_connections,
            if handshakes != config.max_handshakes {
                format!(" and {handshakes} TLS handshakes under way (configured: {})", config.max_handshakes)
            } else {
                String::new()
            },
        );
    }
    Ok((connections, handshakes))
}

/// A running daemon. Dropping it stops it; [`Daemon::shutdown`] stops it
/// telling its clients why.
pub struct Daemon {
    conns: Conns,
    /// The connection and TLS handshake caps in force (fitted to the descriptor limit).
    max_connections: usize,
    max_handshakes: usize,
    submit: mpsc::Sender<Op>,
    /// The daemon's TLS identity and what its TLS listener trusts, if it has one.
    tls_trust: Option<(Identity, SharedTrust)>,
    unix: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    tls: Option<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
    stop: Option<oneshot::Sender<()>>,
    sequencer: Option<JoinHandle<()>>,
    failed: oneshot::Receiver<String>,
    traffic: Arc<Traffic>,
    // Dropped after the tasks are stopped (field order).
    _backbone: Option<Box<dyn Send + Sync>>,
}

/// Errors starting or reconfiguring a daemon.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The TLS identity or the client certificate authority was refused.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// Client certificates were given to a daemon that does not listen for TLS.
    #[error("the daemon has no TLS listener whose client certificates could change")]
    NoTls,
    /// No Unix socket, TCP or TLS address was configured.
    #[error("no listener configured: give a Unix socket path, a TCP address or a TLS address")]
    NoListener,
    /// A configured limit is out of range.
    #[error("bad configuration: {0}")]
    Config(&'static str),
    /// The process may open too few descriptors to serve any client.
    #[error(
        "the descriptor limit (ulimit -n) of {limit} leaves no room for client connections: the daemon needs at \
         least {needed}; raise it (ulimit -n, or LimitNOFILE= in a systemd unit)"
    )]
    Descriptors {
        /// This process's soft limit on open descriptors.
        limit: u64,
        /// The least the daemon can work with.
        needed: u64,
    },
    /// Binding a listener failed.
    #[error("cannot listen on {what}: {source}")]
    Bind {
        /// The address or path.
        what: String,
        /// Why.
        source: io::Error,
    },
}

fn frame(d: &Delivery) -> Bytes {
    let mut b = BytesMut::new();
    wire::encode_delivery(d, &mut b);
    b.freeze()
}

impl Daemon {
    /// Binds the configured listeners and starts serving, alone (the
    /// standalone backbone).
    pub async fn start(config: DaemonConfig) -> Result<Self, DaemonError> {
        Self::start_with(config, Backbone::standalone()).await
    }

    /// Binds the configured listeners and starts serving over `backbone`.
    pub async fn start_with(config: DaemonConfig, backbone: Backbone) -> Result<Self, DaemonError> {
        if config.unix.is_none() && config.tcp.is_none() && config.tls.is_none() {
            return Err(DaemonError::NoListener);
        }
        if config.queue_depth == 0 {
            return Err(DaemonError::Config("queue depth must be at least 1"));
        }
        if config.max_payload > 1 << 30 {
            return Err(DaemonError::Config("payloads are limited to 1 GiB"));
        }
        if config.queue_bytes < config.max_payload + wire::FRAME_OVERHEAD {
            return Err(DaemonError::Config(
                "the per-client queue (bytes) must hold at least one message of the largest size",
            ));
        }
        if config.max_handshakes == 0 || config.max_handshakes_per_ip == 0 {
            return Err(DaemonError::Config("TLS handshake limits must be at least 1"));
        }
        if config.keepalive.is_some_and(|k| k < Duration::from_secs(1)) {
            return Err(DaemonError::Config("the TCP keepalive time must be at least 1 s (or off)"));
        }
        if config.max_connections == 0 || config.max_connections_per_peer == 0 {
            return Err(DaemonError::Config("connection limits must be at least 1"));
        }
        let (max_connections, max_handshakes) =
            fit_descriptors(&config, rustix::process::getrlimit(rustix::process::Resource::Nofile).current)?;
        let trust = match &config.tls {
            Some(listen) => {
                let trust = Trust::new(&listen.identity, listen.client_auth.as_ref())?;
                Some((listen.identity.clone(), Arc::new(RwLock::new(trust))))
            }
            None => None,
        };
        let tcp = match config.tcp {
            Some(addr) => Some(
                TcpListener::bind(addr).await.map_err(|source| DaemonError::Bind { what: addr.to_string(), source })?,
            ),
            None => None,
        };
        let tcp_addr = tcp
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()
            .map_err(|source| DaemonError::Bind { what: "tcp".into(), source })?;
        let tls = match (&config.tls, &trust) {
            (Some(listen), Some((_, trust))) => Some(
                TlsListener::bind(
                    listen.addr,
                    trust.clone(),
                    HandshakeLimits {
                        timeout: config.handshake_timeout,
                        max: max_handshakes,
                        per_ip: config.max_handshakes_per_ip,
                    },
                )
                .await
                .map_err(|source| DaemonError::Bind { what: format!("tls {}", listen.addr), source })?,
            ),
            _ => None,
        };
        let tls_addr = tls
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()
            .map_err(|source| DaemonError::Bind { what: "tls".into(), source })?;
        // The Unix socket last: nothing after it can fail and leave its file behind.
        let unix = match &config.unix {
            Some(path) => {
                let l = UnixListener::bind(path)
                    .map_err(|source| DaemonError::Bind { what: path.display().to_string(), source })?;
                Some(l)
            }
            None => None,
        };

        let Backbone { me, incarnation, submit, ordered, failure, resources, keying, standalone } = backbone;
        let conns: Conns = Arc::default();
        let mut core = Core::new(me, Limits { max_groups_per_client: config.max_groups_per_client }, incarnation);
        if standalone {
            // No other daemon: nothing goes between daemons, sealed or not.
            core.seal_groups();
        }
        let renewal = |mut keyed: KeyedDaemon| {
            if let Some(lifetime) = config.key_lifetime {
                keyed = keyed.with_key_lifetime(lifetime.as_micros().try_into().unwrap_or(u64::MAX));
            }
            if let Some(bytes) = config.key_data_limit {
                keyed = keyed.with_data_limit(bytes);
            }
            let evs_time_out = config.evs_time_out.as_micros().try_into().unwrap_or(u64::MAX);
            keyed.with_evs_expiry(config.evs_key_out, evs_time_out)
        };
        let core: Box<dyn Machine> = match keying {
            Keying::Alone => {
                let signer = Arc::new(Ed25519Signer::generate(&mut rand_core::OsRng));
                let identities = DaemonIdentities::alone(me, signer);
                Box::new(renewal(KeyedDaemon::new(core, identities, Box::new(rand_core::OsRng))))
            }
            Keying::Trusted { trust, sealed } => {
                let keyed = renewal(KeyedDaemon::new(core, trust, Box::new(rand_core::OsRng)));
                Box::new(if sealed { keyed.with_sealed_backbone() } else { keyed })
            }
            Keying::Off => Box::new(core),
        };
        let (stop, stopped) = oneshot::channel();
        let (report, failed) = oneshot::channel();
        let backbone = BackboneEnds { ordered, failure, report };
        let (snapshots, snapshot_requests) = mpsc::channel(16);
        let groups: Arc<RwLock<HashSet<GroupName>>> = Arc::default();
        let rules = Rules {
            access: config.access.clone(),
            standalone,
            groups: (!standalone && config.access.is_some()).then(|| groups.clone()),
            snapshots: snapshot_requests,
        };
        // A machine that seals its clients' operations takes them before the
        // backbone does: clients submit to the sequencer, which passes on
        // what the machine makes of them.
        let (client_submit, local) = if core.routes_submissions() {
            let (tx, rx) = mpsc::channel(1024);
            (tx, Some(Local { ops: rx, incarnation, next: 0 }))
        } else {
            (submit.clone(), None)
        };
        let ends = SequencerEnds { backbone: submit, clients: client_submit.clone(), local };
        let sequencer = tokio::spawn(sequence(core, backbone, ends, conns.clone(), stopped, rules));
        let submit = client_submit;
        let traffic = Arc::new(Traffic::default());
        let shared = Arc::new(Shared {
            config: config.clone(),
            conns: conns.clone(),
            submit: submit.clone(),
            me,
            next_conn: AtomicU64::new(1),
            trust: trust.as_ref().map(|(_, t)| t.clone()),
            caps: Arc::new(Caps {
                max: max_connections,
                per_peer: config.max_connections_per_peer,
                count: Mutex::default(),
            }),
            refusing: Arc::new(Semaphore::new(REFUSING)),
            snapshots,
            started: Instant::now(),
            max_connections,
            max_handshakes,
            standalone,
            groups,
            euid: rustix::process::geteuid().as_raw(),
            traffic: traffic.clone(),
        });

        let mut tasks = Vec::new();
        if let Some(l) = unix {
            tasks.push(tokio::spawn(accept_loop(l, shared.clone())));
        }
        if let Some(l) = tcp {
            tasks.push(tokio::spawn(accept_loop(l, shared.clone())));
        }
        if let Some(l) = tls {
            tasks.push(tokio::spawn(accept_loop(l, shared)));
        }
        Ok(Self {
            conns,
            max_connections,
            max_handshakes,
            submit,
            tls_trust: trust,
            unix: config.unix,
            tcp: tcp_addr,
            tls: tls_addr,
            tasks,
            stop: Some(stop),
            sequencer: Some(sequencer),
            failed,
            traffic,
            _backbone: resources,
        })
    }

    /// The bytes this daemon has read from and written to its clients.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// Waits until the backbone fails (a cluster daemon lost its group
    /// communication service) and says why; never returns for a backbone that
    /// does not fail. By then every client has been told and disconnected.
    pub async fn failed(&mut self) -> String {
        match (&mut self.failed).await {
            Ok(reason) => reason,
            Err(_) => std::future::pending().await,
        }
    }

    /// The most client connections the daemon serves at once: the configured
    /// [`DaemonConfig::max_connections`], or less if the descriptor limit is lower.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// The most TLS handshakes under way at once: the configured
    /// [`DaemonConfig::max_handshakes`], or less if the descriptor limit is lower.
    pub fn max_handshakes(&self) -> usize {
        self.max_handshakes
    }

    /// The Unix socket the daemon listens on.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix.as_deref()
    }

    /// The TCP address the daemon listens on.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// The TCP address the daemon listens on for TLS clients.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls
    }

    /// Replaces the client certificates TLS clients must show (`None`: none
    /// at all), keeping the daemon's own identity. New handshakes use the new
    /// trust at once. Every connected client whose certificate it no longer
    /// accepts (revoked, expired, of another authority) is told why
    /// ([`ErrorCode::Revoked`]) and disconnected, and its groups see it leave.
    /// Returns the names of those cut off. A refused authority or CRL (one
    /// past its nextUpdate, say) changes nothing.
    pub async fn reload_client_auth(&self, client_auth: Option<ClientAuth>) -> Result<Vec<MemberId>, DaemonError> {
        let Some((identity, trust)) = &self.tls_trust else { return Err(DaemonError::NoTls) };
        let next = Trust::new(identity, client_auth.as_ref())?;
        let mut cut = Vec::new();
        {
            // The table before the trust, as connections register: one that
            // registers after this was verified under the new trust.
            let mut table = self.conns.lock().expect("connection table");
            let mut current = trust.write().expect("TLS trust");
            current.replace(next);
            table.retain(|&conn, handle| {
                let Some(certified) = &handle.certified else { return true };
                let Err(why) = current.recheck(certified) else { return true };
                tracing::info!(conn = %conn, "{why}: disconnecting");
                kill(&handle.kill, ErrorCode::Revoked, format!("{why}: disconnected"));
                cut.push((conn, certified.name.clone()));
                false
            });
        }
        for (conn, _) in &cut {
            // The reader would say so too, once the connection is closed; the
            // groups need not wait for the client to take its last frame.
            let _ = self.submit.send(Op::Disconnect { conn: *conn }).await;
        }
        Ok(cut.into_iter().map(|(_, name)| name).collect())
    }

    /// Stops accepting, tells every client the daemon is shutting down, and
    /// waits for the sequencer to finish.
    pub async fn shutdown(mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(s) = self.sequencer.take() {
            let _ = s.await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(s) = &self.sequencer {
            s.abort();
        }
        // Closing every queue ends every connection.
        if let Ok(mut table) = self.conns.lock() {
            table.clear();
        }
        if let Some(path) = &self.unix {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Who is at the other end of a new connection, as far as the daemon can tell.
enum Peer {
    /// A TLS client that showed a certificate.
    Certified(Certified),
    /// A process on this machine, run by this Unix user.
    Local { uid: u32 },
    /// A client over TCP, or over TLS without a certificate.
    Remote {
        /// Over TLS.
        tls: bool,
    },
}

impl Peer {
    /// What the access rules know of this peer before Hello.
    fn principal(&self) -> Principal {
        match self {
            Peer::Certified(c) => Principal { uid: None, name: Some(c.name.clone()) },
            Peer::Local { uid } => Principal { uid: Some(*uid), name: None },
            Peer::Remote { .. } => Principal::default(),
        }
    }
}

/// A listening socket clients connect to.
trait Listener: Send + 'static {
    /// One accepted connection.
    type Stream: AsyncRead + AsyncWrite + Send + 'static;
    /// Waits for the next connection; with it, who is at the other end and
    /// whom it counts against for the per-peer cap.
    fn next(&mut self) -> impl Future<Output = io::Result<(Self::Stream, Peer, PeerKey, String)>> + Send;
    /// The TCP connection under a stream, if there is one.
    fn tcp(_stream: &Self::Stream) -> Option<&TcpStream> {
        None
    }
}

/// Turns on TCP keepalive on `stream`: probes after `idle` without traffic,
/// three of them a quarter of `idle` apart (at least a second).
fn keep_alive(stream: &TcpStream, idle: Duration) -> io::Result<()> {
    use rustix::net::sockopt;
    sockopt::set_tcp_keepidle(stream, idle)?;
    sockopt::set_tcp_keepintvl(stream, (idle / 4).max(Duration::from_secs(1)))?;
    sockopt::set_tcp_keepcnt(stream, 3)?;
    sockopt::set_socket_keepalive(stream, true)?;
    Ok(())
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    async fn next(&mut self) -> io::Result<(UnixStream, Peer, PeerKey, String)> {
        let (stream, _) = self.accept().await?;
        let cred = stream.peer_cred()?;
        let uid = cred.uid();
        let pid = cred.pid().map_or(String::new(), |pid| format!(", pid {pid}"));
        Ok((stream, Peer::Local { uid }, PeerKey::Uid(uid), format!("unix: uid {uid}{pid}")))
    }
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    async fn next(&mut self) -> io::Result<(TcpStream, Peer, PeerKey, String)> {
        let (stream, addr) = self.accept().await?;
        stream.set_nodelay(true)?;
        Ok((stream, Peer::Remote { tls: false }, PeerKey::Ip(addr.ip().to_canonical()), format!("tcp: {addr}")))
    }
    fn tcp(stream: &TcpStream) -> Option<&TcpStream> {
        Some(stream)
    }
}

impl Listener for TlsListener {
    type Stream = tokio_rustls::server::TlsStream<TcpStream>;
    async fn next(&mut self) -> io::Result<(Self::Stream, Peer, PeerKey, String)> {
        let (stream, certified, addr) = TlsListener::next(self).await?;
        let what = match &certified {
            Some(c) => format!("tls: {addr}, certificate for {}", c.name),
            None => format!("tls: {addr}, no certificate"),
        };
        Ok((
            stream,
            certified.map_or(Peer::Remote { tls: true }, Peer::Certified),
            PeerKey::Ip(addr.ip().to_canonical()),
            what,
        ))
    }
    fn tcp(stream: &Self::Stream) -> Option<&TcpStream> {
        Some(stream.get_ref().0)
    }
}

/// How long a listener pauses after it failed to accept (out of file
/// descriptors, say), rather than spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Accepts connections until aborted: serves those within the caps, refuses
/// the others.
async fn accept_loop<L: Listener>(mut listener: L, shared: Arc<Shared>) {
    loop {
        match listener.next().await {
            Ok((stream, peer, key, what)) => {
                if keep_alive_if(L::tcp(&stream), shared.config.keepalive).is_err() {
                    continue;
                }
                match shared.caps.take(key) {
                    Ok(slot) => spawn_conn(stream, peer, what, slot, shared.clone()),
                    Err(why) => refuse(stream, why, &shared.refusing),
                }
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(ACCEPT_PAUSE).await;
            }
        }
    }
}

/// Turns on TCP keepalive on a TCP connection if the daemon wants it; an
/// error means the connection is broken already (and is logged).
fn keep_alive_if(tcp: Option<&TcpStream>, keepalive: Option<Duration>) -> io::Result<()> {
    let (Some(stream), Some(idle)) = (tcp, keepalive) else { return Ok(()) };
    keep_alive(stream, idle).inspect_err(|e| tracing::info!("connection dropped: cannot turn on TCP keepalive: {e}"))
}

/// Tells a connection over a cap why it is refused, and closes it. The
/// client's Hello is read and dropped, so that closing does not reset the
/// connection before the client has the reason. At most [`REFUSING`] are
/// under way at once, each for at most [`LAST_WORDS`]; beyond that, a
/// connection is closed at once.
fn refuse<S>(stream: S, why: String, refusing: &Arc<Semaphore>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let Ok(permit) = refusing.clone().try_acquire_owned() else { return };
    tokio::spawn(async move {
        let _permit = permit;
        tokio::pin!(stream);
        let last = frame(&Delivery::Error { code: wire::TOO_MANY_CONNECTIONS, text: why });
        let _ = tokio::time::timeout(LAST_WORDS, async {
            stream.write_all(&last).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 4096];
            let mut left: usize = 64 * 1024;
            while left > 0 {
                match stream.read(&mut sink).await? {
                    0 => break,
                    n => left = left.saturating_sub(n),
                }
            }
            io::Result::Ok(())
        })
        .await;
    });
}

/// The sequencer's side of a backbone.
struct BackboneEnds {
    ordered: mpsc::Receiver<Op>,
    failure: oneshot::Receiver<String>,
    /// Tells the [`Daemon`] why the backbone failed.
    report: oneshot::Sender<String>,
}

/// Where the sequencer sends what it submits.
struct SequencerEnds {
    /// The backbone.
    backbone: mpsc::Sender<Op>,
    /// Where clients' operations go (the backbone, or `local`).
    clients: mpsc::Sender<Op>,
    /// The clients' operations, if they pass through the machine.
    local: Option<Local>,
}

/// Clients' operations on their way through the machine to the backbone.
struct Local {
    ops: mpsc::Receiver<Op>,
    /// Their identities: the daemon's incarnation and the next number (as a
    /// cluster backbone would number them; see the core's *Operation
    /// identities*).
    incarnation: u64,
    next: u64,
}

/// The most submissions the sequencer queues for an ordered backbone before
/// it stops taking clients' operations.
const OUTBOX: usize = 1024;

/// What the sequencer needs for the access rules and status reports.
struct Rules {
    access: Option<AccessPolicy>,
    standalone: bool,
    /// Where to keep the set of groups for joins checked when read (a
    /// cluster with access rules).
    groups: Option<Arc<RwLock<HashSet<GroupName>>>>,
    snapshots: mpsc::Receiver<oneshot::Sender<Snapshot>>,
}

/// What the core knows, for a status report.
struct Snapshot {
    configuration: Option<(conclave_gcs::ViewId, Vec<u16>)>,
    groups: Vec<GroupStatus>,
    /// Groups and memberships in all, also when the lists were cut.
    group_count: usize,
    membership_count: usize,
    connections: Vec<ConnectionStatus>,
    truncated: bool,
}

/// Most bytes of groups and connections a status report lists; past that
/// it is cut (and says so).
const STATUS_BUDGET: usize = 4 << 20;

/// What the core and the connection table hold now.
fn snapshot(core: &Core, table: &HashMap<ConnId, ConnHandle>) -> Snapshot {
    let mut budget = STATUS_BUDGET;
    let mut truncated = false;
    let mut memberships: HashMap<&MemberId, u32> = HashMap::new();
    let mut groups = Vec::new();
    let mut group_count = 0;
    let mut membership_count = 0;
    for name in core.groups() {
        let Some(view) = core.view(name) else { continue };
        group_count += 1;
        membership_count += view.members.len();
        for m in view.members.iter() {
            *memberships.entry(&m.id).or_default() += 1;
        }
        let size = 32 + name.as_str().len() + view.members.iter().map(|m| 1 + m.id.as_str().len()).sum::<usize>();
        if truncated || size > budget {
            truncated = true;
            continue;
        }
        budget -= size;
        groups.push(GroupStatus {
            name: name.clone(),
            open: core.open(name),
            mode: core.mode(name).unwrap_or_default(),
            view: view.id,
            members: view.members.iter().map(|m| m.id.clone()).collect(),
        });
    }
    let mut ids: Vec<&ConnId> = table.keys().collect();
    ids.sort_by_key(|c| c.local);
    let mut connections = Vec::new();
    for conn in ids {
        let handle = &table[conn];
        let name = core.member(*conn).cloned();
        let size = 64 + name.as_ref().map_or(0, |n| n.as_str().len()) + handle.info.peer.len();
        if truncated || size > budget {
            truncated = true;
            break;
        }
        budget -= size;
        connections.push(ConnectionStatus {
            id: conn.local,
            groups: name.as_ref().and_then(|n| memberships.get(n)).copied().unwrap_or(0),
            name,
            peer: handle.info.peer.clone(),
            age_ms: millis(handle.info.since.elapsed()),
            queued_frames: u32::try_from(handle.queue.max_capacity() - handle.queue.capacity()).unwrap_or(u32::MAX),
            queued_bytes: handle.queued.load(Ordering::Acquire) as u64,
        });
    }
    Snapshot {
        configuration: core.configuration().map(|(id, daemons)| (id, daemons.into_iter().map(|d| d.0).collect())),
        groups,
        group_count,
        membership_count,
        connections,
        truncated,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The join `op` of one of this daemon's clients, or a refusal in its place
/// if the access rules do not let the client create or join the group, as
/// the group stands at this point of the stream.
fn check_join(op: Op, core: &Core, access: &AccessPolicy, conns: &Conns) -> Op {
    let Op::Join { conn, group, .. } = &op else { return op };
    let principal = match conns.lock().expect("connection table").get(conn) {
        Some(handle) => handle.info.principal.lock().expect("principal").clone(),
        // Being cut off (its disconnect follows): judged as a client the
        // daemon knows nothing of, so that it slips past no rule.
        None => Principal::default(),
    };
    let action = if core.view(group).is_some() { Action::Join } else { Action::Create };
    match access.check(&principal, action, group) {
        Ok(()) => op,
        Err(text) => {
            tracing::info!(conn = %conn, group = %group, "access denied: {principal} may not {action} the group");
            Op::Reject { conn: *conn, code: wire::ACCESS_DENIED, text }
        }
    }
}

/// A join that comes within this long of the one before it is part of a
/// burst (n clients starting a group at once), and waits to be installed
/// with the others of the burst (on a standalone daemon).
pub const JOIN_BURST: Duration = Duration::from_millis(5);
/// A burst's joins are installed once no join came for this long ...
const JOIN_QUIET: Duration = Duration::from_millis(5);
/// ... or this long after the first of them, whichever is sooner: the most
/// a join waits.
const JOIN_HOLD: Duration = Duration::from_millis(100);

/// Joins a standalone daemon holds during a burst, to install one view per
/// group for all of them (`Core::handle_joins`) instead of a view per join:
/// n members starting a group at once otherwise cost n views of up to n
/// members each, to every member (at 512 members, about 1 GB written and
/// as much decoded). A join that comes alone is installed at once. The
/// standalone daemon orders its clients' operations itself, so it may order
/// a held join after other clients' operations that came later; a client's
/// own operations stay in its order (any operation of a client whose join
/// is held installs the held joins first).
#[derive(Default)]
struct HeldJoins {
    ops: Vec<Op>,
    conns: HashSet<ConnId>,
    first: Option<tokio::time::Instant>,
    last: Option<tokio::time::Instant>,
    /// When the join before the current one came.
    previous: Option<tokio::time::Instant>,
}

impl HeldJoins {
    fn push(&mut self, op: Op, at: tokio::time::Instant) {
        if let Some(c) = op.conn() {
            self.conns.insert(c);
        }
        self.ops.push(op);
        self.first.get_or_insert(at);
        self.previous = self.last.replace(at);
    }

    /// Whether the join just pushed came in a burst.
    fn in_burst(&self) -> bool {
        match (self.previous, self.last) {
            (Some(p), Some(l)) => l.saturating_duration_since(p) <= JOIN_BURST,
            _ => false,
        }
    }

    fn holds(&self, conn: ConnId) -> bool {
        self.conns.contains(&conn)
    }

    fn deadline(&self) -> Option<tokio::time::Instant> {
        if self.ops.is_empty() {
            return None;
        }
        Some((self.first? + JOIN_HOLD).min(self.last? + JOIN_QUIET))
    }

    /// Installs the held joins, each checked against the access rules as
    /// the groups stand when it is ordered.
    fn flush(&mut self, core: &mut dyn Machine, rules: &Rules, conns: &Conns, now: u64, out: &mut Vec<Output>) {
        self.conns.clear();
        self.first = None;
        let mut joins: Vec<Op> = Vec::with_capacity(self.ops.len());
        for op in self.ops.drain(..) {
            let Some(access) = &rules.access else {
                joins.push(op);
                continue;
            };
            // A join to a group that one of the joins before it creates is
            // judged as a join, so those go first.
            let creates = match &op {
                Op::Join { group, .. } => {
                    core.core().view(group).is_none()
                        && joins.iter().any(|j| matches!(j, Op::Join { group: g, .. } if g == group))
                }
                _ => false,
            };
            if creates {
                core.handle_joins(std::mem::take(&mut joins), now, out);
            }
            let op = check_join(op, core.core(), access, conns);
            if matches!(op, Op::Join { .. }) {
                joins.push(op);
            } else {
                core.handle_joins(std::mem::take(&mut joins), now, out);
                core.handle(op, now, out);
            }
        }
        if !joins.is_empty() {
            core.handle_joins(joins, now, out);
        }
    }
}

/// Runs the core over the ordered stream until the daemon stops or the
/// backbone fails.
async fn sequence(
    mut core: Box<dyn Machine>,
    backbone: BackboneEnds,
    ends: SequencerEnds,
    conns: Conns,
    mut stopped: oneshot::Receiver<()>,
    mut rules: Rules,
) {
    let BackboneEnds { mut ordered, mut failure, report } = backbone;
    let SequencerEnds { backbone: submit, clients: client_submit, mut local } = ends;
    // With clients' operations passing through the machine, everything it
    // submits goes to the backbone in its order (sealed operations keep
    // their clients' order only so), from here.
    let mut outbox: std::collections::VecDeque<Op> = std::collections::VecDeque::new();
    let routed = local.is_some();
    let mut failed = None;
    // A backbone that cannot fail drops its failure sender at once.
    let mut may_fail = true;
    let mut out = Vec::new();
    let mut gone = Vec::new();
    let mut batch = Vec::with_capacity(BATCH);
    let mut held = HeldJoins::default();
    // The last view delivered here of each group (see `deliver_view`).
    let mut last_views: HashMap<GroupName, View> = HashMap::new();
    let mut sweep_views_at = 64;
    // The machine's clock: microseconds since the sequencer started.
    let origin = tokio::time::Instant::now();
    let micros = |at: tokio::time::Instant| at.saturating_duration_since(origin).as_micros() as u64;
    loop {
        let timer = core.poll_timeout().map(|t| origin + Duration::from_micros(t));
        let mut timed_out = false;
        let mut hold_expired = false;
        let hold = held.deadline();
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            Some(reply) = rules.snapshots.recv() => {
                let snapshot = snapshot(core.core(), &conns.lock().expect("connection table"));
                let _ = reply.send(snapshot);
                continue;
            }
            n = ordered.recv_many(&mut batch, BATCH) => if n == 0 { break },
            r = &mut failure, if may_fail => match r {
                Ok(reason) => {
                    failed = Some(reason);
                    break;
                }
                Err(_) => may_fail = false,
            },
            () = tokio::time::sleep_until(timer.unwrap_or(origin)), if timer.is_some() => timed_out = true,
            () = tokio::time::sleep_until(hold.unwrap_or(origin)), if hold.is_some() => hold_expired = true,
            permit = submit.reserve(), if !outbox.is_empty() => {
                match permit {
                    Ok(permit) => permit.send(outbox.pop_front().expect("not empty")),
                    // The backbone is gone; its failure report follows.
                    Err(_) => outbox.clear(),
                }
                continue;
            }
            Some(op) = next_local(&mut local), if routed && outbox.len() < OUTBOX => {
                let local = local.as_mut().expect("routed");
                let id = conclave_gcs::core::OpId { incarnation: local.incarnation, seq: local.next };
                local.next += 1;
                core.submit(op.numbered(id), micros(tokio::time::Instant::now()), &mut out);
            }
        }
        let now = micros(tokio::time::Instant::now());
        if timed_out {
            core.handle_timeout(now, &mut out);
        }
        let me = core.core().me();
        let arrived = tokio::time::Instant::now();
        if hold_expired {
            held.flush(&mut *core, &rules, &conns, now, &mut out);
        }
        for op in batch.drain(..) {
            if let Op::Disconnect { conn } = op {
                gone.push(conn);
            }
            if rules.standalone && matches!(&op, Op::Join { conn, .. } if conn.daemon == me) {
                held.push(op, arrived);
                if !held.in_burst() {
                    held.flush(&mut *core, &rules, &conns, now, &mut out);
                }
                continue;
            }
            // A client's operations keep their order: its held join first.
            if op.conn().is_some_and(|c| held.holds(c)) {
                held.flush(&mut *core, &rules, &conns, now, &mut out);
            }
            let exchanging = core.core().exchanging();
            core.handle(op, now, &mut out);
            if exchanging && !core.core().exchanging() {
                // The other half of the "daemon group" line: when it is
                // missing, a state has not come in and the daemon holds its
                // clients' operations.
                tracing::info!("daemon states exchanged, views installed");
            }
        }
        if let Some(groups) = &rules.groups {
            let mut groups = groups.write().expect("group set");
            groups.clear();
            groups.extend(core.core().groups().cloned());
        }
        let mut table = conns.lock().expect("connection table");
        for o in out.drain(..) {
            match o {
                Output::Deliver { to, delivery: Delivery::View { group, view } } => {
                    deliver_view(&mut table, &mut last_views, to, group, view, &client_submit);
                }
                Output::Deliver { to, delivery } => {
                    if let Delivery::Left { group } = &delivery {
                        for c in &to {
                            if let Some(handle) = table.get_mut(c) {
                                handle.views.remove(group);
                            }
                        }
                    }
                    let fatal = matches!(delivery, Delivery::Error { code, .. } if code.is_fatal());
                    let bytes = frame(&delivery);
                    for c in to {
                        deliver(&mut table, c, bytes.clone(), fatal, &client_submit);
                    }
                }
                Output::Submit(op) if routed => outbox.push_back(op),
                // A standalone core is never asked for its state; a backbone
                // that is would order this like any other submission.
                Output::Submit(op) => resubmit(&submit, op),
            }
        }
        for c in gone.drain(..) {
            // Dropping the handle closes the queue: the writer sends what is
            // queued and closes the connection.
            table.remove(&c);
        }
        // A group with no members here keeps its last view until the next
        // sweep, which comes when the views held have doubled since the
        // last: at most twice the groups the core holds, and a few.
        if last_views.len() > sweep_views_at {
            let groups: HashSet<&GroupName> = core.core().groups().collect();
            last_views.retain(|g, _| groups.contains(g));
            sweep_views_at = 2 * last_views.len().max(32);
        }
    }
    // A backbone sends its failure before it closes the stream.
    if failed.is_none() && may_fail {
        failed = failure.try_recv().ok();
    }
    let text = match &failed {
        Some(reason) => format!("the daemon lost its daemon group: {reason}"),
        None => "the daemon is shutting down".to_owned(),
    };
    for (_, c) in conns.lock().expect("connection table").drain() {
        kill(&c.kill, ErrorCode::ShuttingDown, text.clone());
    }
    if let Some(reason) = failed {
        let _ = report.send(reason);
    }
}

/// The next client operation for the machine (never, without one).
async fn next_local(local: &mut Option<Local>) -> Option<Op> {
    match local {
        Some(local) => local.ops.recv().await,
        None => std::future::pending().await,
    }
}

/// Submits an operation from inside the sequencer without waiting on the
/// stream it is itself draining.
fn resubmit(submit: &mpsc::Sender<Op>, op: Op) {
    let submit = submit.clone();
    tokio::spawn(async move {
        let _ = submit.send(op).await;
    });
}

/// Delivers view `view` of `group` to `to`: as changes to the daemon's last
/// view of the group (`last_views`) to each client that reads views as
/// changes and was written that view last, whole to the others; each frame
/// is encoded once, if anyone gets it. The view becomes the group's last.
fn deliver_view(
    table: &mut HashMap<ConnId, ConnHandle>,
    last_views: &mut HashMap<GroupName, View>,
    to: Vec<ConnId>,
    group: GroupName,
    view: View,
    submit: &mpsc::Sender<Op>,
) {
    let base = last_views.get(&group);
    let (mut whole, mut changes) = (None::<Bytes>, None::<Bytes>);
    for c in to {
        let Some(handle) = table.get_mut(&c) else { continue };
        let bytes = if handle.info.view_changes.load(Ordering::Acquire) {
            let last = handle.views.insert(group.clone(), view.id);
            base.filter(|b| last == Some(b.id)).map(|base| {
                changes
                    .get_or_insert_with(|| {
                        let mut b = BytesMut::new();
                        wire::encode_view_changes(&group, &view, base, &mut b);
                        b.freeze()
                    })
                    .clone()
            })
        } else {
            None
        };
        let bytes = bytes.unwrap_or_else(|| {
            whole
                .get_or_insert_with(|| {
                    let mut b = BytesMut::new();
                    wire::encode_view(&group, &view, &mut b);
                    b.freeze()
                })
                .clone()
        });
        deliver(table, c, bytes, false, submit);
    }
    last_views.insert(group, view);
}

fn deliver(table: &mut HashMap<ConnId, ConnHandle>, c: ConnId, bytes: Bytes, fatal: bool, submit: &mpsc::Sender<Op>) {
    let Some(handle) = table.get(&c) else { return };
    if fatal {
        let _ = handle.kill.try_send(bytes);
        table.remove(&c);
        return;
    }
    let len = bytes.len();
    // One frame alone always fits, whatever its size.
    let queued = handle.queued.load(Ordering::Acquire);
    let fits = queued == 0 || queued + len <= handle.budget;
    if fits {
        handle.queued.fetch_add(len, Ordering::AcqRel);
        match handle.queue.try_send(bytes) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(_)) => {
                handle.queued.fetch_sub(len, Ordering::AcqRel);
            }
            // The connection is gone; its reader submits the disconnect.
            Err(mpsc::error::TrySendError::Closed(_)) => {
                table.remove(&c);
                return;
            }
        }
    }
    // Too many frames or too many bytes queued.
    tracing::info!(conn = %c, queued_bytes = queued, "client too slow: disconnecting");
    kill(&handle.kill, ErrorCode::QueueOverflow, "you did not read fast enough: disconnected");
    table.remove(&c);
    resubmit(submit, Op::Disconnect { conn: c });
}

/// Serves a new connection, which holds `slot` until it is closed.
fn spawn_conn<S>(stream: S, peer: Peer, what: String, slot: Slot, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let conn = ConnId { daemon: shared.me, local: shared.next_conn.fetch_add(1, Ordering::Relaxed) };
    let (rd, wr) = tokio::io::split(stream);
    let (queue, queue_rx) = mpsc::channel(shared.config.queue_depth);
    let (kill, kill_rx) = mpsc::channel(1);
    let queued = Arc::new(AtomicUsize::new(0));
    let certified = match &peer {
        Peer::Certified(c) => Some(c.clone()),
        Peer::Local { .. } | Peer::Remote { .. } => None,
    };
    let info = Arc::new(ConnInfo {
        peer: what,
        since: Instant::now(),
        principal: Mutex::new(peer.principal()),
        view_changes: AtomicBool::new(false),
    });
    {
        let mut table = shared.conns.lock().expect("connection table");
        // A handshake that ran under trust replaced since is checked again.
        let refused = match (&certified, &shared.trust) {
            (Some(c), Some(trust)) => trust.read().expect("TLS trust").recheck(c).err(),
            _ => None,
        };
        if let Some(why) = refused {
            drop(table);
            tracing::info!(conn = %conn, "{why}: disconnecting");
            self::kill(&kill, ErrorCode::Revoked, format!("{why}: disconnected"));
            let traffic = shared.traffic.clone();
            tokio::spawn(async move {
                write_loop(wr, queue_rx, kill_rx, queued, &traffic).await;
                drop(slot);
            });
            return;
        }
        let budget = shared.config.queue_bytes;
        table.insert(
            conn,
            ConnHandle {
                queue,
                kill: kill.clone(),
                queued: queued.clone(),
                budget,
                certified,
                info: info.clone(),
                views: HashMap::new(),
            },
        );
    }
    // The connection is closed once both halves are dropped: each holds the slot.
    let slot = Arc::new(slot);
    let writer_slot = slot.clone();
    let traffic = shared.traffic.clone();
    let writer = tokio::spawn(async move {
        write_loop(wr, queue_rx, kill_rx, queued, &traffic).await;
        drop(writer_slot);
    });
    tokio::spawn(async move {
        read_loop(rd, conn, &peer, &info, &shared, &kill, writer).await;
        drop(slot);
        tracing::info!(conn = %conn, "client disconnected");
        let _ = shared.submit.send(Op::Disconnect { conn }).await;
    });
}

/// Reads requests and submits them until the client leaves, misbehaves, or
/// its writer ends. Its Hello must use a name its `peer` may take
/// ([`DaemonConfig::uncertified_names`]; a certified client, the certified name).
async fn read_loop<R: AsyncRead>(
    rd: R,
    conn: ConnId,
    peer: &Peer,
    info: &ConnInfo,
    shared: &Shared,
    killer: &mpsc::Sender<Bytes>,
    mut writer: JoinHandle<()>,
) {
    tokio::pin!(rd);
    let cfg = &shared.config;
    let mut frames = FrameReader::new(cfg.max_payload + wire::FRAME_OVERHEAD);
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let hello_deadline = tokio::time::sleep(cfg.hello_timeout);
    tokio::pin!(hello_deadline);
    let mut said_hello = false;
    // When the frame being received must be complete; armed while one is.
    let frame_deadline = tokio::time::sleep(cfg.frame_timeout);
    tokio::pin!(frame_deadline);
    let mut in_frame = false;
    loop {
        let mut progressed = false;
        loop {
            let op = match frames.next_frame(&mut buf).and_then(|f| f.map(wire::decode_request).transpose()) {
                Ok(Some(Request::Status)) if !said_hello => {
                    let reply = status_reply(conn, peer, shared).await;
                    let mut b = BytesMut::new();
                    wire::encode_status_reply(&reply, &mut b);
                    // The answer is the connection's last words.
                    let _ = killer.try_send(b.freeze());
                    return;
                }
                Ok(Some(Request::Status)) => Op::Reject {
                    conn,
                    code: ErrorCode::AlreadyConnected,
                    text: "ask for the daemon's status on a connection of its own, in place of Hello".to_owned(),
                },
                Ok(Some(req)) => match to_op(conn, hello_flags(req, said_hello, info), cfg.max_payload) {
                    Some(op) => check_request(check_transport(op, peer), info, shared),
                    None => return,
                },
                Ok(None) => break,
                // Refused, but the frame is skipped and the connection goes on.
                Err(e @ WireError::TooLarge { .. }) => Op::Reject { conn, code: e.code(), text: e.to_string() },
                Err(e) => {
                    tracing::info!(conn = %conn, "malformed frame: {e}");
                    kill(killer, e.code(), e.to_string());
                    return;
                }
            };
            progressed = true;
            if let Op::Connect { name, .. } = &op {
                if let Err(text) = cfg.uncertified_names.check(peer, name) {
                    tracing::info!(conn = %conn, "{text}");
                    kill(killer, ErrorCode::IdentityMismatch, text);
                    return;
                }
                tracing::info!(conn = %conn, name = %name, "client connected");
                said_hello = true;
                // A name the daemon let this Unix user take is bound to it.
                if let (Peer::Local { .. }, UncertifiedNames::ByUid(_)) = (peer, &cfg.uncertified_names) {
                    info.principal.lock().expect("principal").name = Some(name.clone());
                }
            }
            if shared.submit.send(op).await.is_err() {
                return;
            }
        }
        // Time a frame from its first byte (or from the end of the one before).
        wire::make_room(&mut buf);
        if buf.is_empty() && !frames.skipping() {
            in_frame = false;
        } else if progressed || !in_frame {
            frame_deadline.as_mut().reset(tokio::time::Instant::now() + cfg.frame_timeout);
            in_frame = true;
        }
        tokio::select! {
            biased;
            _ = &mut writer => return,
            _ = &mut hello_deadline, if !said_hello => {
                kill(killer, ErrorCode::Timeout, "no Hello in time");
                return;
            }
            _ = &mut frame_deadline, if said_hello && in_frame => {
                tracing::info!(conn = %conn, "incomplete frame: disconnecting");
                let text = format!("a frame was not completed within {:?}: disconnected", cfg.frame_timeout);
                kill(killer, ErrorCode::Timeout, text);
                return;
            }
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    shared.traffic.read.fetch_add(n as u64, Ordering::Relaxed);
                }
            },
        }
    }
}

/// `op`, or a refusal in its place if the access rules do not let the
/// client do it: sending is checked here; joining too in a cluster, against
/// the groups as this daemon last applied the stream (a standalone daemon
/// checks joins where it orders them, in the sequencer, exactly).
/// A three-step group's members reach their daemon over TLS or the local
/// socket only: its traffic is in clear between a member and its daemon
/// (Three-Step client–server, paper §4.3.1), so a join over plain TCP is
/// refused.
fn check_transport(op: Op, peer: &Peer) -> Op {
    match op {
        Op::Join { conn, group, mode: GroupMode::ThreeStep, .. } if matches!(peer, Peer::Remote { tls: false }) => {
            let text = format!("{group} is a three-step group: its members connect over TLS or the local socket");
            tracing::info!(conn = %conn, group = %group, "a three-step join over plain TCP refused");
            Op::Reject { conn, code: ErrorCode::ModeMismatch, text }
        }
        op => op,
    }
}

fn check_request(op: Op, info: &ConnInfo, shared: &Shared) -> Op {
    let Some(access) = &shared.config.access else { return op };
    let (conn, group, action) = match &op {
        Op::Multicast { conn, group, .. } | Op::Unicast { conn, group, .. } => (*conn, group, Action::Send),
        Op::Join { conn, group, .. } if !shared.standalone => {
            let exists = shared.groups.read().expect("group set").contains(group);
            (*conn, group, if exists { Action::Join } else { Action::Create })
        }
        _ => return op,
    };
    let principal = info.principal.lock().expect("principal").clone();
    match access.check(&principal, action, group) {
        Ok(()) => op,
        Err(text) => {
            tracing::info!(conn = %conn, group = %group, "access denied: {principal} may not {action} the group");
            Op::Reject { conn, code: wire::ACCESS_DENIED, text }
        }
    }
}

/// Whether `peer` may read the daemon's status: the daemon's own Unix user
/// and root on the Unix socket (who could read the daemon's memory anyway),
/// and the configured operators.
fn may_read_status(peer: &Peer, shared: &Shared) -> bool {
    if let Peer::Local { uid } = peer {
        if *uid == 0 || *uid == shared.euid {
            return true;
        }
    }
    let principal = peer.principal();
    shared.config.operators.iter().any(|w| w.matches(&principal))
}

/// The daemon's answer to a status request from `peer`.
async fn status_reply(conn: ConnId, peer: &Peer, shared: &Shared) -> StatusReply {
    if !may_read_status(peer, shared) {
        tracing::info!(conn = %conn, "access denied: {} may not read the daemon's status", peer.principal());
        return StatusReply::Error {
            code: wire::ACCESS_DENIED,
            text: "you may not read this daemon's status: only its own Unix user and root (on its Unix socket) and \
                   the operators its configuration lists ([status] operators) may"
                .to_owned(),
        };
    }
    let (tx, rx) = oneshot::channel();
    let snapshot = match shared.snapshots.send(tx).await {
        Ok(()) => rx.await.ok(),
        Err(_) => None,
    };
    let Some(snap) = snapshot else {
        return StatusReply::Error { code: ErrorCode::ShuttingDown, text: "the daemon is shutting down".to_owned() };
    };
    let cfg = &shared.config;
    let secs = |d: Duration| d.as_secs();
    let limits = [
        ("max_message_size", cfg.max_payload as u64),
        ("groups_per_client", cfg.max_groups_per_client as u64),
        ("queue_depth", cfg.queue_depth as u64),
        ("queue_bytes", cfg.queue_bytes as u64),
        ("hello_timeout_secs", secs(cfg.hello_timeout)),
        ("frame_timeout_secs", secs(cfg.frame_timeout)),
        ("handshake_timeout_secs", secs(cfg.handshake_timeout)),
        ("max_handshakes", shared.max_handshakes as u64),
        ("max_handshakes_per_ip", cfg.max_handshakes_per_ip as u64),
        ("max_connections", shared.max_connections as u64),
        ("max_connections_per_peer", cfg.max_connections_per_peer as u64),
        ("keepalive_secs", cfg.keepalive.map_or(0, secs)),
    ];
    let connections = shared.caps.count.lock().expect("connection caps").total as u64;
    let named = snap.connections.iter().filter(|c| c.name.is_some()).count() as u64;
    let queued: u64 = snap.connections.iter().map(|c| c.queued_bytes).sum();
    let counters = [
        ("connections", connections),
        ("clients", named),
        ("groups", snap.group_count as u64),
        ("memberships", snap.membership_count as u64),
        ("queued_bytes", queued),
    ];
    let mut policy: Vec<String> = match &cfg.access {
        None => vec!["no access rules: every client may create, join and send to every group".to_owned()],
        Some(access) => {
            let mut lines: Vec<String> = access.rules.iter().map(|r| r.to_string()).collect();
            lines.push("any other group: no one may create, join or send to it".to_owned());
            lines
        }
    };
    let operators: Vec<String> = cfg.operators.iter().map(Who::to_string).collect();
    let own = match shared.euid {
        0 => "uid:0 (root, the daemon's user)".to_owned(),
        uid => format!("uid:0 (root), uid:{uid} (the daemon's user)"),
    };
    policy.push(format!(
        "status: {own} on the Unix socket{}{}",
        if operators.is_empty() { "" } else { "; operators: " },
        operators.join(", ")
    ));
    StatusReply::Report(Status {
        truncated: snap.truncated,
        uptime_ms: millis(shared.started.elapsed()),
        daemon: shared.me.0,
        backbone: if shared.standalone { "standalone" } else { "cluster (Corosync CPG)" }.to_owned(),
        configuration: snap.configuration,
        limits: limits.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect(),
        counters: counters.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect(),
        groups: snap.groups,
        connections: snap.connections,
        policy,
    })
}

/// Notes what a first Hello asks of the connection (views as changes), before
/// its first view; passes `req` on.
fn hello_flags(req: Request, said_hello: bool, info: &ConnInfo) -> Request {
    if let Request::Hello { view_changes, .. } = &req {
        if !said_hello {
            info.view_changes.store(*view_changes, Ordering::Release);
        }
    }
    req
}

/// The operation a request asks for; `None` for Bye.
fn to_op(conn: ConnId, req: Request, max_payload: usize) -> Option<Op> {
    Some(match req {
        Request::Hello { name, .. } => Op::Connect { conn, name },
        Request::Join { group, open, mode } => Op::Join { conn, group, open, mode },
        Request::Leave { group } => Op::Leave { conn, group },
        Request::Multicast { payload, .. } | Request::Unicast { payload, .. } if payload.len() > max_payload => {
            let e = WireError::TooLarge { len: payload.len(), max: max_payload };
            Op::Reject { conn, code: e.code(), text: format!("message payload: {e}") }
        }
        Request::Multicast { group, service, payload } => Op::Multicast { conn, group, service, payload },
        Request::Unicast { group, to, payload } => Op::Unicast { conn, group, to, payload },
        Request::Bye => return None,
        // Answered by the reader itself.
        Request::Status => return None,
    })
}

/// Writes queued frames until the queue closes or the connection is killed,
/// taking what it writes off `queued`; a kill gets the frame being written and
/// the last words out if the client takes them within [`LAST_WORDS`].
async fn write_loop<W: AsyncWrite>(
    wr: W,
    mut queue: mpsc::Receiver<Bytes>,
    mut kill: mpsc::Receiver<Bytes>,
    queued: Arc<AtomicUsize>,
    traffic: &Traffic,
) {
    tokio::pin!(wr);
    let mut pending = BytesMut::new();
    let last = loop {
        if pending.is_empty() {
            tokio::select! {
                biased;
                Some(last) = kill.recv() => break Some(last),
                f = queue.recv() => match f {
                    Some(f) => pending.extend_from_slice(&f),
                    None => break None,
                },
            }
            // Gather what else is queued into one write.
            while pending.len() < 64 * 1024 {
                match queue.try_recv() {
                    Ok(f) => pending.extend_from_slice(&f),
                    Err(_) => break,
                }
            }
        }
        tokio::select! {
            biased;
            Some(last) = kill.recv() => break Some(last),
            r = wr.write_buf(&mut pending) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    queued.fetch_sub(n, Ordering::AcqRel);
                    traffic.written.fetch_add(n as u64, Ordering::Relaxed);
                }
            },
        }
        // A TLS stream may hold written bytes back until flushed; for a
        // plain socket this costs nothing.
        if pending.is_empty() {
            tokio::select! {
                biased;
                Some(last) = kill.recv() => break Some(last),
                r = wr.flush() => if r.is_err() { return },
            }
        }
    };
    if let Some(last) = last {
        pending.extend_from_slice(&last);
        let _ = tokio::time::timeout(LAST_WORDS, wr.write_all(&pending)).await;
    }
    let _ = tokio::time::timeout(LAST_WORDS, wr.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use super::matches_pattern;

    #[test]
    fn a_star_stands_for_any_run_of_characters() {
        for (pattern, name, matches) in [
            ("alice", "alice", true),
            ("alice", "alice2", false),
            ("bot-*", "bot-", true),
            ("bot-*", "bot-7", true),
            ("bot-*", "bots", false),
            ("*-test", "a-b-test", true),
            ("a*b*c", "a-x-b-y-c", true),
            ("a*b*c", "a-x-c", false),
            ("*", "anyone", true),
        ] {
            assert_eq!(matches_pattern(pattern, name), matches, "{pattern:?} vs {name:?}");
        }
    }
}
