//! The cluster backbone: daemons on many machines, one Corosync CPG group.
//!
//! Every daemon joins one CPG (closed process group) of the local corosync.
//! Each client operation a daemon accepts is multicast to the group with
//! *agreed* ordering, and every daemon feeds what CPG delivers — its own
//! messages included, in the same place of the order as everyone else —
//! to its [`Core`](conclave_gcs::core::Core). So all cores run over one
//! stream and compute the same groups and views; each delivers only to its own
//! clients. A daemon's number ([`DaemonId`]) is its corosync node id, so one
//! node runs one daemon per group; node ids above 65535 are refused.
//!
//! Client operations go out numbered ([`Op::Numbered`]: the daemon's
//! incarnation and its count of client operations sent), so that a core
//! applies one the daemon group orders twice — submitted again after an
//! interrupted state exchange — only once.
//!
//! # Configuration changes and the epoch
//!
//! A CPG configuration change (a daemon joined or left, a node was cut off or
//! came back) becomes [`Op::Daemons`] with the daemons of the new
//! configuration, at the point of the stream where CPG reports it. The core
//! then exchanges states ([`Op::State`]) and installs views of cause network
//! (see the core's module docs).
//!
//! The epoch that ties a state to the change it answers is each daemon's own
//! count of the configuration changes it has seen; on receipt, every daemon
//! stamps a state with its *current* count, whatever the sender wrote. Counts
//! differ between daemons (one that started later has seen fewer changes), but
//! the decision they make is the same everywhere: a state is taken iff it is
//! delivered after the latest change and before the next one. That decision
//! is identical at every daemon of a configuration because Corosync's totem
//! protocol gives extended virtual synchrony: every member of a configuration
//! sees the same configuration changes and, between two of them, the same
//! messages in the same order; a message is delivered in the configuration it
//! was sent in (or in the transitional one that ends it), never after the
//! next change. A state sent in answer to one change may still be delivered
//! after a later one, if changes come fast; the core then takes it as the
//! answer to the later one, which is right because the core sends no second
//! state while one is in flight and its clients cannot change while it is
//! exchanging (see the core's docs).
//!
//! After a merge neither side ever receives the other side's messages of the
//! partition: the state exchange reconciles them.
//!
//! # Whose messages count
//!
//! CPG tells each delivery's sender as a (node id, process id) pair, and any
//! local process that corosync lets in (root, or a user its `uidgid` settings
//! name) can join the group. So the backbone keeps a *roster*: for each node,
//! the pid of its daemon, recorded from the configuration changes. It takes
//! deliveries only from those processes and counts only those in the daemon
//! group; anything else in the group is *foreign*: its messages are dropped
//! with a warning (rate-limited) that names its node and pid, and its joining
//! or leaving changes nothing. The rules, applied to each change:
//!
//! * a node's daemon is the process of that node that was alone on it (not
//!   counting processes already known to be foreign) when it appeared; it
//!   stays the daemon until it leaves, and every process of its node that
//!   appears while it is there is foreign, and stays so until it leaves;
//! * when the daemon leaves (a restart: the old pid leaves, a new one joins),
//!   its node has no daemon until a new process appears there alone; a
//!   foreign process that was there all along never becomes the daemon;
//! * this daemon is always its own node's daemon, and refuses to join
//!   ([`ClusterError::Duplicate`]) if another process of its node is in the
//!   group, or ([`ClusterError::Ambiguous`]) if another node has more than one
//!   process in it: joining then, it has no history to tell which is that
//!   node's daemon.
//!
//! Every daemon of a configuration sees the same changes, so all keep the same
//! roster, and a change that leaves the roster as it was (a foreign process
//! came or went) is not passed on to the core. The one case without history
//! is a merge: for a node of the other side that has several processes in the
//! group, this side takes the one with the lowest pid (a stray started after
//! the daemon has a higher one, but not necessarily) and warns. A process
//! alone on a node without a daemon cannot be told from a daemon at all: the
//! defence there is corosync's own (totem crypto, so no machine outside the
//! cluster can speak, and its IPC permissions, so no local user can).
//!
//! # Threads
//!
//! CPG callbacks are plain function pointers run inside `cpg::dispatch`, so
//! dispatch runs on a thread of its own whose thread-local state holds the
//! channel into the daemon's sequencer; multicasts go out from a second
//! thread, retrying while corosync says "try again". If corosync goes away
//! (dispatch or multicast fails), the backbone reports it: the daemon tells
//! its clients, closes their connections and [`Daemon::failed`] returns the
//! reason.
//!
//! [`Daemon::failed`]: crate::Daemon::failed

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use conclave_gcs::backbone::{batch_bytes, decode_op, op_bytes, split_batch};
use conclave_gcs::core::{DaemonId, Op, OpId};
use rust_corosync::cpg::{self, Address, Guarantee, Handle, Model1Data, Model1Flags, ModelData};
use rust_corosync::{CsError, DispatchFlags, NodeId};
use tokio::sync::{mpsc, oneshot};

use crate::daemon::{new_incarnation, Backbone};

/// Errors joining the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// corosync is not reachable.
    #[error(
        "cannot connect to corosync ({0}): is corosync running on this node (and, with network namespaces, in this \
         namespace)?"
    )]
    Connect(CsError),
    /// A CPG call failed.
    #[error("corosync CPG {what} failed: {err}")]
    Cpg {
        /// Which call.
        what: &'static str,
        /// The error.
        err: CsError,
    },
    /// The node id does not fit a daemon number.
    #[error("corosync node id {0} is above 65535: give this node a nodeid of at most 65535 in corosync.conf")]
    NodeId(u32),
    /// The CPG group name is not acceptable to CPG.
    #[error("bad CPG group name {0:?}: 1 to 127 bytes")]
    GroupName(String),
    /// Another daemon of the group runs on this node.
    #[error("another Conclave daemon (pid {pid}) already serves CPG group {group:?} on node {node}")]
    Duplicate {
        /// The group.
        group: String,
        /// The node.
        node: u32,
        /// The other daemon's process id.
        pid: u32,
    },
    /// Another node has several processes in the group, so this daemon,
    /// joining now, cannot tell which is that node's daemon.
    #[error(
        "CPG group {group:?} has {} processes on node {node} (pids {}): one of them is not a Conclave daemon, and a \
         daemon joining now cannot tell which; stop the stray process on node {node} (`corosync-cpgtool` lists them)",
        pids.len(),
        pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )]
    Ambiguous {
        /// The group.
        group: String,
        /// The node.
        node: u32,
        /// The processes of that node in the group.
        pids: Vec<u32>,
    },
    /// Joining did not complete.
    #[error("joining CPG group {group:?} failed: {reason}")]
    Join {
        /// The group.
        group: String,
        /// Why.
        reason: String,
    },
}

/// How many operations may wait between CPG and the sequencer, or between
/// the connections and CPG.
const QUEUE: usize = 4096;
/// Most bytes of operations one backbone message carries as a batch (an
/// operation larger than this goes alone). Corosync fragments a message
/// into frames of its network MTU anyway; the batch saves the per-message
/// cost (a token slot, a delivery callback, a hand-off to the core).
const BATCH_BYTES: usize = 64 << 10;

/// How long to keep retrying a CPG call that says "try again".
const TRY_AGAIN_FOR: Duration = Duration::from_secs(30);

/// Calls `f` until it stops saying "try again" (corosync is busy, or the ring
/// is re-forming), backing off a little, for at most [`TRY_AGAIN_FOR`].
fn retry<T>(mut f: impl FnMut() -> rust_corosync::Result<T>) -> rust_corosync::Result<T> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(100);
    loop {
        match f() {
            Err(CsError::CsErrTryAgain) if start.elapsed() < TRY_AGAIN_FOR => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// The daemon number of a node, if it has one.
fn daemon_of(node: NodeId) -> Option<DaemonId> {
    u16::try_from(u32::from(node)).ok().map(DaemonId)
}

/// Reports a backbone failure once.
#[derive(Clone)]
struct FailureReport(Arc<Mutex<Option<oneshot::Sender<String>>>>);

impl FailureReport {
    fn send(&self, reason: String) {
        if let Some(tx) = self.0.lock().expect("failure report").take() {
            tracing::error!("cluster backbone failed: {reason}");
            let _ = tx.send(reason);
        }
    }
}

/// A process in the CPG group: (node id, pid).
type Process = (u32, u32);

/// Why a daemon may not join (see [`Roster::change`]).
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// Another process of this daemon's node is in the group.
    Duplicate { pid: u32 },
    /// Another node has several processes in the group.
    Ambiguous { node: u32, pids: Vec<u32> },
}

/// What a change did to the roster, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
struct Changed {
    /// Whether some node's daemon came, went or was replaced.
    daemons: bool,
    /// Processes newly found foreign.
    foreign: Vec<Process>,
    /// Nodes whose daemon was guessed (a merge): (node, the pid taken, the others).
    guessed: Vec<(u32, u32, Vec<u32>)>,
}

/// Which process is each node's daemon: see the module docs, *Whose messages
/// count*. Pure, so that its rules are tested without corosync.
#[derive(Debug)]
struct Roster {
    me: Process,
    /// Node id → its daemon's pid.
    daemons: BTreeMap<u32, u32>,
    /// Processes in the group that are not daemons.
    foreign: BTreeSet<Process>,
    /// Whether the first change (this daemon's join) has been seen.
    joined: bool,
}

impl Roster {
    fn new(me: Process) -> Self {
        Roster { me, daemons: BTreeMap::new(), foreign: BTreeSet::new(), joined: false }
    }

    /// Whether `p` is its node's daemon.
    fn is_daemon(&self, (node, pid): Process) -> bool {
        self.daemons.get(&node) == Some(&pid)
    }

    /// The daemon group: every node with a daemon.
    fn members(&self) -> Vec<DaemonId> {
        self.daemons.keys().filter_map(|&n| daemon_of(NodeId::from(n))).collect()
    }

    /// Applies a configuration change whose membership is `members` (this
    /// daemon among them). The first change is this daemon's join, which it
    /// refuses if it cannot tell every node's daemon.
    fn change(&mut self, members: &[Process]) -> Result<Changed, Refusal> {
        let present: BTreeSet<Process> = members.iter().copied().collect();
        let before = self.daemons.clone();
        self.daemons.retain(|&n, &mut p| present.contains(&(n, p)));
        self.foreign.retain(|p| present.contains(p));
        let mut by_node: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for &(node, pid) in &present {
            // A node id above 65535 has no daemon number: nothing of it counts.
            if daemon_of(NodeId::from(node)).is_some() {
                by_node.entry(node).or_default().push(pid);
            }
        }
        let first = !self.joined;
        self.joined = true;
        let (my_node, my_pid) = self.me;
        if first {
            if let Some(&pid) = by_node.get(&my_node).into_iter().flatten().find(|&&p| p != my_pid) {
                return Err(Refusal::Duplicate { pid });
            }
            if let Some((&node, pids)) = by_node.iter().find(|(&n, pids)| n != my_node && pids.len() > 1) {
                return Err(Refusal::Ambiguous { node, pids: pids.clone() });
            }
        }
        self.daemons.insert(my_node, my_pid);
        let mut changed = Changed::default();
        for (node, pids) in by_node {
            if !self.daemons.contains_key(&node) {
                // Pids come sorted: the first candidate has the lowest.
                let candidates: Vec<u32> =
                    pids.iter().copied().filter(|&p| !self.foreign.contains(&(node, p))).collect();
                match candidates[..] {
                    [] => {}
                    [pid] => {
                        self.daemons.insert(node, pid);
                    }
                    [pid, ref others @ ..] => {
                        // A merge (or two processes of a node appearing in one change) leaves no history
                        // to tell them apart (see the module docs).
                        self.daemons.insert(node, pid);
                        changed.guessed.push((node, pid, others.to_vec()));
                    }
                }
            }
            let daemon = self.daemons.get(&node).copied();
            for pid in pids {
                if Some(pid) != daemon && self.foreign.insert((node, pid)) {
                    changed.foreign.push((node, pid));
                }
            }
        }
        changed.daemons = self.daemons != before;
        Ok(changed)
    }
}

/// At most one warning about dropped foreign messages per this long.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Rate-limits the warnings about messages from foreign processes.
#[derive(Default)]
struct DropWarning {
    last: Option<Instant>,
    /// Messages dropped since the last warning, not counting the one it named.
    unreported: u64,
}

impl DropWarning {
    fn dropped(&mut self, group: &str, (node, pid): Process, daemon: Option<u32>) {
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < WARN_EVERY) {
            self.unreported += 1;
            return;
        }
        let whose = match daemon {
            Some(d) => format!("node {node}'s daemon is pid {d}"),
            None => format!("node {node} has no daemon in the group"),
        };
        let more = match std::mem::take(&mut self.unreported) {
            0 => String::new(),
            n => format!(" ({n} more foreign messages dropped since the last warning)"),
        };
        tracing::warn!(
            "dropping a message from process {pid} on node {node} in CPG group {group:?}: it is not a Conclave \
             daemon ({whose}){more}"
        );
        self.last = Some(now);
    }
}

/// What the dispatch thread's callbacks work with.
struct Dispatch {
    group: String,
    roster: Roster,
    drops: DropWarning,
    ordered: Option<mpsc::Sender<Op>>,
    /// This daemon's count of configuration changes (see the module docs).
    epoch: u64,
    /// Told when the first configuration (with this daemon in it) arrives.
    joined: Option<oneshot::Sender<Result<(), ClusterError>>>,
    /// This daemon left the group (or must): dispatch ends.
    done: bool,
}

thread_local! {
    static DISPATCH: RefCell<Option<Dispatch>> = const { RefCell::new(None) };
}

impl Dispatch {
    fn feed(&mut self, op: Op) {
        let Some(ordered) = &self.ordered else { return };
        // The sequencer is gone: the daemon stopped.
        if ordered.blocking_send(op).is_err() {
            self.ordered = None;
            self.done = true;
        }
    }

    fn deliver(&mut self, node: NodeId, pid: u32, msg: &[u8]) {
        let sender = (u32::from(node), pid);
        if !self.roster.is_daemon(sender) {
            let daemon = self.roster.daemons.get(&sender.0).copied();
            self.drops.dropped(&self.group, sender, daemon);
            return;
        }
        let Some(from) = daemon_of(node) else { return };
        let msg = Bytes::copy_from_slice(msg);
        match split_batch(&msg) {
            Ok(Some(parts)) => parts.into_iter().for_each(|part| self.deliver_one(node, from, part)),
            Ok(None) => self.deliver_one(node, from, msg),
            Err(e) => tracing::warn!("dropping a message from node {node}: {e}"),
        }
    }

    /// One operation from the daemon of `node` (`from`), alone or out of a batch.
    fn deliver_one(&mut self, node: NodeId, from: DaemonId, msg: Bytes) {
        let op = match decode_op(msg) {
            Ok(op) => op,
            Err(e) => {
                tracing::warn!("dropping a message from node {node}: {e}");
                return;
            }
        };
        let op = match op {
            // Whatever epoch the sender wrote, the state answers the latest
            // change this daemon saw (see the module docs).
            Op::State { state, .. } if state.daemon == from => Op::State { epoch: self.epoch, state },
            Op::State { state, .. } => {
                tracing::warn!("dropping a state of daemon {} sent by node {node}", state.daemon.0);
                return;
            }
            Op::Daemons { .. } => {
                tracing::warn!("dropping a daemon-group change sent by node {node}: only CPG reports those");
                return;
            }
            // The daemons' key agreement: each daemon speaks for itself only.
            Op::DaemonKa { from: claimed, .. } if claimed == from => op,
            Op::DaemonKa { .. } => {
                tracing::warn!("dropping another daemon's key agreement message sent by node {node}");
                return;
            }
            op => match op.conn() {
                Some(c) if c.daemon == from => op,
                _ => {
                    tracing::warn!("dropping an operation for another daemon's client sent by node {node}");
                    return;
                }
            },
        };
        self.feed(op);
    }

    fn confchg(&mut self, members: &[Address]) {
        let me = self.roster.me;
        let members: Vec<Process> = members.iter().map(|a| (u32::from(a.nodeid), a.pid)).collect();
        if !members.contains(&me) {
            // Our own leave: the daemon is stopping.
            self.done = true;
            return;
        }
        let changed = match self.roster.change(&members) {
            Ok(changed) => changed,
            Err(refusal) => {
                let (group, node) = (self.group.clone(), me.0);
                let err = match refusal {
                    Refusal::Duplicate { pid } => ClusterError::Duplicate { group, node, pid },
                    Refusal::Ambiguous { node, pids } => ClusterError::Ambiguous { group, node, pids },
                };
                if let Some(tell) = self.joined.take() {
                    let _ = tell.send(Err(err));
                }
                self.ordered = None;
                self.done = true;
                return;
            }
        };
        if let Some(tell) = self.joined.take() {
            let _ = tell.send(Ok(()));
        }
        for (node, pid) in &changed.foreign {
            tracing::warn!(
                "process {pid} on node {node} is in CPG group {:?} beside node {node}'s daemon (pid {}): it is not \
                 counted as a daemon and its messages are dropped",
                self.group,
                self.roster.daemons.get(node).map_or_else(|| "none".to_owned(), u32::to_string),
            );
        }
        for (node, pid, others) in &changed.guessed {
            tracing::warn!(
                "node {node} appeared with {} processes in CPG group {:?} (pids {pid}, {}) and no history to tell its \
                 daemon: taking pid {pid}, the lowest; the others are not Conclave daemons, stop them",
                others.len() + 1,
                self.group,
                others.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
            );
        }
        if !changed.daemons {
            // A foreign process came or went: the daemon group is the same.
            return;
        }
        let daemons = self.roster.members();
        self.epoch += 1;
        tracing::info!(epoch = self.epoch, "daemon group: {:?}", daemons.iter().map(|d| d.0).collect::<Vec<_>>());
        self.feed(Op::Daemons { epoch: self.epoch, members: daemons });
    }
}

fn on_deliver(_: &Handle, _group: String, node: NodeId, pid: u32, msg: &[u8], _len: usize) {
    DISPATCH.with_borrow_mut(|d| {
        if let Some(d) = d {
            d.deliver(node, pid, msg);
        }
    });
}

fn on_confchg(_: &Handle, _group: &str, members: Vec<Address>, _left: Vec<Address>, _joined: Vec<Address>) {
    DISPATCH.with_borrow_mut(|d| {
        if let Some(d) = d {
            d.confchg(&members);
        }
    });
}

/// Leaves the CPG group when the daemon that holds it is dropped.
struct Membership {
    handle: Handle,
    group: String,
    leaving: Arc<AtomicBool>,
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.leaving.store(true, Ordering::SeqCst);
        // Our leave comes back as a configuration change, which ends dispatch.
        let _ = retry(|| cpg::leave(&self.handle, &self.group));
    }
}

/// Connects to the local corosync, joins CPG group `group` and returns the
/// backbone for [`Daemon::start_with`](crate::Daemon::start_with), once this
/// daemon is in the group. Blocks while joining: call it from a blocking
/// context (e.g. `tokio::task::spawn_blocking`) or before the runtime starts.
pub fn join(group: &str) -> Result<Backbone, ClusterError> {
    if group.is_empty() || group.len() > 127 {
        return Err(ClusterError::GroupName(group.to_owned()));
    }
    let model = ModelData::ModelV1(Model1Data {
        flags: Model1Flags::None,
        deliver_fn: Some(on_deliver),
        confchg_fn: Some(on_confchg),
        totem_confchg_fn: None,
    });
    let handle = cpg::initialize(&model, 0).map_err(ClusterError::Connect)?;
    let node = retry(|| cpg::local_get(&handle)).map_err(|err| ClusterError::Cpg { what: "local_get", err })?;
    let me = daemon_of(node).ok_or(ClusterError::NodeId(node.into()))?;

    let (ordered_tx, ordered) = mpsc::channel(QUEUE);
    let (submit, submit_rx) = mpsc::channel(QUEUE);
    let (failure_tx, failure) = oneshot::channel();
    let report = FailureReport(Arc::new(Mutex::new(Some(failure_tx))));
    let (joined_tx, joined_rx) = oneshot::channel();
    let leaving = Arc::new(AtomicBool::new(false));

    retry(|| cpg::join(&handle, group)).map_err(|err| ClusterError::Cpg { what: "join", err })?;
    let dispatch = Dispatch {
        group: group.to_owned(),
        roster: Roster::new((u32::from(me.0), std::process::id())),
        drops: DropWarning::default(),
        ordered: Some(ordered_tx),
        epoch: 0,
        joined: Some(joined_tx),
        done: false,
    };
    let dispatch_handle = handle.clone();
    let dispatch_report = report.clone();
    let dispatch_leaving = leaving.clone();
    std::thread::Builder::new()
        .name("cpg-dispatch".into())
        .spawn(move || run_dispatch(handle, dispatch, dispatch_report, dispatch_leaving))
        .map_err(|e| ClusterError::Join { group: group.to_owned(), reason: format!("no dispatch thread: {e}") })?;
    match joined_rx.blocking_recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(ClusterError::Join { group: group.to_owned(), reason: "corosync went away".into() });
        }
    }
    let send_handle = dispatch_handle.clone();
    let incarnation = new_incarnation();
    std::thread::Builder::new()
        .name("cpg-send".into())
        .spawn(move || run_send(send_handle, incarnation, submit_rx, report))
        .map_err(|e| ClusterError::Join { group: group.to_owned(), reason: format!("no send thread: {e}") })?;
    tracing::info!("joined CPG group {group:?} as daemon {} (corosync node id)", me.0);
    let membership = Membership { handle: dispatch_handle, group: group.to_owned(), leaving };
    Ok(Backbone::new(me, incarnation, submit, ordered, failure, Box::new(membership)))
}

/// Dispatches CPG callbacks until this daemon leaves or corosync fails, then
/// closes the connection (dropping `handle`, the original, finalizes it).
fn run_dispatch(handle: Handle, dispatch: Dispatch, report: FailureReport, leaving: Arc<AtomicBool>) {
    DISPATCH.set(Some(dispatch));
    loop {
        if let Err(e) = cpg::dispatch(&handle, DispatchFlags::One) {
            if e == CsError::CsErrTryAgain {
                continue;
            }
            if !leaving.load(Ordering::SeqCst) {
                report.send(format!("lost the connection to corosync ({e}): did corosync stop?"));
            }
            break;
        }
        if DISPATCH.with_borrow(|d| d.as_ref().is_none_or(|d| d.done)) {
            break;
        }
    }
    // Closing the stream after the failure report lets the sequencer say why.
    DISPATCH.set(None);
    drop(handle);
}

/// Multicasts submitted operations, in order, until the daemon stops or
/// corosync fails. Each client operation gets its identity here, in the order
/// of multicast: this daemon's `incarnation` (its core's) and 0, 1, 2, …; one
/// the core submits again after an interrupted exchange keeps the one it has
/// (see the core's module docs, *Operation identities*).
///
/// What has already been submitted when one is taken goes out with it as one
/// batch ([`batch_bytes`]), up to [`BATCH_BYTES`]: nothing waits for a batch
/// to fill, and under load one CPG message carries many operations.
fn run_send(handle: Handle, incarnation: u64, mut submit: mpsc::Receiver<Op>, report: FailureReport) {
    let mut next = 0;
    let mut number = |op: Op| {
        if op.is_plain_client_op() {
            next += 1;
            op.numbered(OpId { incarnation, seq: next - 1 })
        } else {
            op
        }
    };
    // An operation too big to join the last batch: it starts the next.
    let mut held: Option<Bytes> = None;
    loop {
        let first = match held.take() {
            Some(part) => part,
            None => match submit.blocking_recv() {
                Some(op) => op_bytes(&number(op)),
                None => break,
            },
        };
        let mut bytes = first.len();
        let mut parts = vec![first];
        while bytes < BATCH_BYTES {
            let Ok(op) = submit.try_recv() else { break };
            let part = op_bytes(&number(op));
            if bytes + 4 + part.len() > BATCH_BYTES {
                held = Some(part);
                break;
            }
            bytes += 4 + part.len();
            parts.push(part);
        }
        let msg = if parts.len() == 1 { parts.pop().expect("one") } else { batch_bytes(&parts) };
        if let Err(e) = retry(|| cpg::mcast_joined(&handle, Guarantee::TypeAgreed, &msg)) {
            report.send(format!("cannot multicast to the daemon group ({e}): did corosync stop?"));
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node 1's daemon (pid 100) joins a group where nodes 2 and 3 have theirs.
    fn joined() -> Roster {
        let mut r = Roster::new((1, 100));
        let changed = r.change(&[(1, 100), (2, 200), (3, 300)]).unwrap();
        assert!(changed.daemons && changed.foreign.is_empty());
        r
    }

    fn daemons(r: &Roster) -> Vec<(u32, u32)> {
        r.daemons.iter().map(|(&n, &p)| (n, p)).collect()
    }

    #[test]
    fn a_second_process_of_a_node_is_foreign_and_changes_nothing() {
        let mut r = joined();
        let changed = r.change(&[(1, 100), (2, 200), (2, 250), (3, 300)]).unwrap();
        assert_eq!(changed, Changed { daemons: false, foreign: vec![(2, 250)], guessed: vec![] });
        assert!(r.is_daemon((2, 200)) && !r.is_daemon((2, 250)));
        assert_eq!(r.members(), [DaemonId(1), DaemonId(2), DaemonId(3)]);
        // Its leave changes nothing either.
        let changed = r.change(&[(1, 100), (2, 200), (3, 300)]).unwrap();
        assert_eq!(changed, Changed::default());
        assert!(r.foreign.is_empty());
    }

    #[test]
    fn a_stray_on_this_node_is_foreign_too() {
        let mut r = joined();
        let changed = r.change(&[(1, 100), (1, 99), (2, 200), (3, 300)]).unwrap();
        assert_eq!(changed.foreign, [(1, 99)]);
        assert!(!changed.daemons && r.is_daemon((1, 100)) && !r.is_daemon((1, 99)));
    }

    #[test]
    fn a_restarted_daemon_is_the_new_pid() {
        let mut r = joined();
        assert!(r.change(&[(1, 100), (3, 300)]).unwrap().daemons);
        assert_eq!(r.members(), [DaemonId(1), DaemonId(3)]);
        assert!(r.change(&[(1, 100), (2, 201), (3, 300)]).unwrap().daemons);
        assert!(r.is_daemon((2, 201)) && !r.is_daemon((2, 200)));
    }

    #[test]
    fn a_foreign_process_never_inherits_the_node() {
        let mut r = joined();
        r.change(&[(1, 100), (2, 200), (2, 250), (3, 300)]).unwrap();
        // The daemon of node 2 goes: node 2 has none, though 250 is still there.
        let changed = r.change(&[(1, 100), (2, 250), (3, 300)]).unwrap();
        assert!(changed.daemons && changed.foreign.is_empty());
        assert_eq!(r.members(), [DaemonId(1), DaemonId(3)]);
        assert!(!r.is_daemon((2, 250)));
        // A new daemon of node 2 is alone among the unknown processes there: it is the daemon.
        assert!(r.change(&[(1, 100), (2, 250), (2, 260), (3, 300)]).unwrap().daemons);
        assert!(r.is_daemon((2, 260)) && !r.is_daemon((2, 250)));
        assert_eq!(r.members(), [DaemonId(1), DaemonId(2), DaemonId(3)]);
    }

    #[test]
    fn joining_beside_a_twin_or_an_ambiguous_node_is_refused() {
        let mut r = Roster::new((1, 100));
        assert_eq!(r.change(&[(1, 90), (1, 100), (2, 200)]), Err(Refusal::Duplicate { pid: 90 }));
        let mut r = Roster::new((1, 100));
        assert_eq!(
            r.change(&[(1, 100), (2, 200), (2, 250), (3, 300)]),
            Err(Refusal::Ambiguous { node: 2, pids: vec![200, 250] })
        );
        // Nothing was recorded: no delivery is taken.
        assert!(!r.is_daemon((1, 100)) && !r.is_daemon((2, 200)));
    }

    #[test]
    fn a_merge_without_history_takes_the_lowest_pid() {
        let mut r = joined();
        r.change(&[(1, 100), (2, 200)]).unwrap();
        let changed = r.change(&[(1, 100), (2, 200), (3, 350), (3, 300)]).unwrap();
        assert_eq!(changed, Changed { daemons: true, foreign: vec![(3, 350)], guessed: vec![(3, 300, vec![350])] });
        assert_eq!(daemons(&r), [(1, 100), (2, 200), (3, 300)]);
    }

    #[test]
    fn nodes_without_a_daemon_number_never_count() {
        let mut r = Roster::new((1, 100));
        r.change(&[(1, 100), (70_000, 5)]).unwrap();
        assert_eq!(daemons(&r), [(1, 100)]);
        assert!(!r.is_daemon((70_000, 5)));
    }
}
