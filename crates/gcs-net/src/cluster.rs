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
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use conclave_gcs::backbone::{decode_op, op_bytes};
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

/// What the dispatch thread's callbacks work with.
struct Dispatch {
    group: String,
    me: DaemonId,
    pid: u32,
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

    fn deliver(&mut self, node: NodeId, msg: &[u8]) {
        let Some(from) = daemon_of(node) else { return };
        let op = match decode_op(Bytes::copy_from_slice(msg)) {
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

    fn confchg(&mut self, members: &[Address], joined: &[Address]) {
        let me = (u32::from(self.me.0), self.pid);
        if !members.iter().any(|a| (u32::from(a.nodeid), a.pid) == me) {
            // Our own leave: the daemon is stopping.
            self.done = true;
            return;
        }
        if let Some(tell) = self.joined.take() {
            let twin = members.iter().find(|a| u32::from(a.nodeid) == me.0 && a.pid != me.1);
            if let (Some(twin), true) = (twin, joined.iter().any(|a| (u32::from(a.nodeid), a.pid) == me)) {
                let node = me.0;
                let _ = tell.send(Err(ClusterError::Duplicate { group: self.group.clone(), node, pid: twin.pid }));
                self.ordered = None;
                self.done = true;
                return;
            }
            let _ = tell.send(Ok(()));
        }
        let daemons: BTreeSet<DaemonId> = members.iter().filter_map(|a| daemon_of(a.nodeid)).collect();
        self.epoch += 1;
        tracing::info!(epoch = self.epoch, "daemon group: {:?}", daemons.iter().map(|d| d.0).collect::<Vec<_>>());
        self.feed(Op::Daemons { epoch: self.epoch, members: daemons.into_iter().collect() });
    }
}

fn on_deliver(_: &Handle, _group: String, node: NodeId, _pid: u32, msg: &[u8], _len: usize) {
    DISPATCH.with_borrow_mut(|d| {
        if let Some(d) = d {
            d.deliver(node, msg);
        }
    });
}

fn on_confchg(_: &Handle, _group: &str, members: Vec<Address>, _left: Vec<Address>, joined: Vec<Address>) {
    DISPATCH.with_borrow_mut(|d| {
        if let Some(d) = d {
            d.confchg(&members, &joined);
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
        me,
        pid: std::process::id(),
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
fn run_send(handle: Handle, incarnation: u64, mut submit: mpsc::Receiver<Op>, report: FailureReport) {
    let mut next = 0;
    while let Some(op) = submit.blocking_recv() {
        let op = if op.is_plain_client_op() {
            next += 1;
            op.numbered(OpId { incarnation, seq: next - 1 })
        } else {
            op
        };
        let msg = op_bytes(&op);
        if let Err(e) = retry(|| cpg::mcast_joined(&handle, Guarantee::TypeAgreed, &msg)) {
            report.send(format!("cannot multicast to the daemon group ({e}): did corosync stop?"));
            return;
        }
    }
}
