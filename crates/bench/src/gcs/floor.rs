//! The floor under the cluster backbone: bare Corosync CPG processes, timed
//! the way `conclave bench gcs --cluster` times the daemons. They came from
//! the `cluster` module of `conclave-gcs-net`; only the benchmarks use them.
//!
//! * [`cpg_floor_probe`] — one process's part in a floor round, run by the
//!   hidden `conclave bench cpg-floor` inside a node's namespace.
//! * [`raw_cpg_round_trips`] — one agreed multicast at a time, each timed
//!   until CPG delivers it back (`examples/cpg_floor.rs`).
//!
//! The CPG calls are retried while corosync says "try again", as the
//! backbone in `conclave-gcs-net` does (its `retry` is private; this is a
//! copy).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use rust_corosync::cpg::{self, Address, Guarantee, Handle, Model1Data, Model1Flags, ModelData};
use rust_corosync::{CsError, DispatchFlags, NodeId};

/// Errors of a probe.
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
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
    /// The CPG group name is not acceptable to CPG.
    #[error("bad CPG group name {0:?}: 1 to 127 bytes")]
    GroupName(String),
    /// A floor probe was given a sender number out of range.
    #[error("floor sender {sender} is not below the round's {senders} senders")]
    FloorSender {
        /// The sender number given.
        sender: u32,
        /// The round's senders.
        senders: usize,
    },
}

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

/// What the probe's callbacks record (see [`raw_cpg_round_trips`]).
#[derive(Default)]
struct Probe {
    node: u32,
    pid: u32,
    joined: bool,
    /// Sequence number of the last of its own messages delivered back.
    echoed: Option<u64>,
}

thread_local! {
    static PROBE: RefCell<Probe> = RefCell::new(Probe::default());
}

fn on_probe_deliver(_: &Handle, _group: String, node: NodeId, pid: u32, msg: &[u8], _len: usize) {
    PROBE.with_borrow_mut(|p| {
        if (u32::from(node), pid) == (p.node, p.pid) {
            if let Some(seq) = msg.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes) {
                p.echoed = Some(seq);
            }
        }
    });
}

fn on_probe_confchg(_: &Handle, _group: &str, members: Vec<Address>, _left: Vec<Address>, _joined: Vec<Address>) {
    PROBE.with_borrow_mut(|p| {
        p.joined = members.iter().any(|a| (u32::from(a.nodeid), a.pid) == (p.node, p.pid));
    });
}

/// The floor under the cluster backbone: joins CPG group `group` on the local
/// corosync and multicasts `count` messages of `size` bytes (at least 8) with
/// agreed ordering, one at a time, each timed from the multicast call until
/// CPG delivers it back to this process. Other members of the group may
/// multicast meanwhile (their messages are ordered in between, as in a
/// loaded cluster). Blocking; leaves the group and disconnects at the end.
pub fn raw_cpg_round_trips(group: &str, count: usize, size: usize) -> Result<Vec<Duration>, FloorError> {
    if group.is_empty() || group.len() > 127 {
        return Err(FloorError::GroupName(group.to_owned()));
    }
    let cpg_err = |what| move |err| FloorError::Cpg { what, err };
    let model = ModelData::ModelV1(Model1Data {
        flags: Model1Flags::None,
        deliver_fn: Some(on_probe_deliver),
        confchg_fn: Some(on_probe_confchg),
        totem_confchg_fn: None,
    });
    let handle = cpg::initialize(&model, 0).map_err(FloorError::Connect)?;
    let node = retry(|| cpg::local_get(&handle)).map_err(cpg_err("local_get"))?;
    PROBE.set(Probe { node: node.into(), pid: std::process::id(), ..Probe::default() });
    retry(|| cpg::join(&handle, group)).map_err(cpg_err("join"))?;
    while !PROBE.with_borrow(|p| p.joined) {
        retry(|| cpg::dispatch(&handle, DispatchFlags::One)).map_err(cpg_err("dispatch"))?;
    }
    let mut msg = vec![0u8; size.max(8)];
    let mut times = Vec::with_capacity(count);
    for seq in 0..count as u64 {
        msg[..8].copy_from_slice(&seq.to_be_bytes());
        let sent = Instant::now();
        retry(|| cpg::mcast_joined(&handle, Guarantee::TypeAgreed, &msg)).map_err(cpg_err("mcast_joined"))?;
        while PROBE.with_borrow(|p| p.echoed) != Some(seq) {
            retry(|| cpg::dispatch(&handle, DispatchFlags::One)).map_err(cpg_err("dispatch"))?;
        }
        times.push(sent.elapsed());
    }
    let _ = retry(|| cpg::leave(&handle, group));
    // Dropping the handle (outside any callback) disconnects.
    drop(handle);
    Ok(times)
}

/// One process's part in a round of the CPG floor ([`cpg_floor_probe`]).
#[derive(Clone, Debug)]
pub struct FloorProbe<'a> {
    /// The round's CPG group (a fresh one per round: every message in it belongs to the round).
    pub group: &'a str,
    /// Processes taking part: nobody sends before the group has them all.
    pub members: usize,
    /// Senders of the round, over all processes; every process receives every message.
    pub senders: usize,
    /// The senders this process runs (numbers below `senders`; none if it only receives).
    pub mine: &'a [u32],
    /// Messages each sender multicasts.
    pub count: usize,
    /// Payload size in bytes, at least [`FLOOR_HEADER`].
    pub size: usize,
    /// A sender's own messages in flight at most (multicast, not yet delivered back to this process).
    pub window: usize,
}

/// Bytes at the start of every floor message: send time, sender, sequence number.
pub const FLOOR_HEADER: usize = 16;

/// What one floor process measured. Times are `CLOCK_MONOTONIC` nanoseconds,
/// one clock for every process of the host (network namespaces do not
/// change it), so a message's latency is comparable across processes.
#[derive(Clone, Debug)]
pub struct FloorResult {
    /// Send-to-delivery latency of every message this process received, in nanoseconds.
    pub latencies_ns: Vec<u64>,
    /// When this process started: its first multicast (with senders) or when the group was complete.
    pub started_ns: u64,
    /// When it had received every message of the round.
    pub done_ns: u64,
}

/// What the floor's callbacks record.
#[derive(Default)]
struct FloorState {
    node: u32,
    pid: u32,
    members: usize,
    /// Per sender number: messages of this process's senders delivered back to it.
    own: Vec<usize>,
    latencies_ns: Vec<u64>,
}

thread_local! {
    static FLOOR: RefCell<FloorState> = RefCell::new(FloorState::default());
}

fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

fn on_floor_deliver(_: &Handle, _group: String, node: NodeId, pid: u32, msg: &[u8], _len: usize) {
    let now = monotonic_ns();
    let Some(sent) = msg.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes) else {
        return;
    };
    FLOOR.with_borrow_mut(|f| {
        f.latencies_ns.push(now.saturating_sub(sent));
        if (u32::from(node), pid) == (f.node, f.pid) {
            let sender = msg.get(8..12).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes);
            if let Some(own) = sender.and_then(|s| f.own.get_mut(s as usize)) {
                *own += 1;
            }
        }
    });
}

fn on_floor_confchg(_: &Handle, _group: &str, members: Vec<Address>, _left: Vec<Address>, _joined: Vec<Address>) {
    FLOOR.with_borrow_mut(|f| f.members = members.len());
}

/// The floor under the cluster backbone, measured the way `conclave bench
/// gcs` measures daemons: this process joins the round's CPG group on the
/// local corosync, waits until all `members` processes of the round are in
/// it, and then, for each of its senders (`mine`), multicasts `count` agreed
/// messages of `size` bytes, keeping at most `window` of that sender's in
/// flight, while receiving every sender's messages. Each message carries its send time;
/// every receiver takes its latency from that. Blocking (run it on a thread
/// of its own, or a process); leaves the group and disconnects at the end.
/// The caller bounds the time: a round whose other processes never come
/// waits for them.
pub fn cpg_floor_probe(probe: &FloorProbe<'_>) -> Result<FloorResult, FloorError> {
    if probe.group.is_empty() || probe.group.len() > 127 {
        return Err(FloorError::GroupName(probe.group.to_owned()));
    }
    if let Some(&s) = probe.mine.iter().find(|&&s| s as usize >= probe.senders) {
        return Err(FloorError::FloorSender { sender: s, senders: probe.senders });
    }
    let cpg_err = |what| move |err| FloorError::Cpg { what, err };
    let model = ModelData::ModelV1(Model1Data {
        flags: Model1Flags::None,
        deliver_fn: Some(on_floor_deliver),
        confchg_fn: Some(on_floor_confchg),
        totem_confchg_fn: None,
    });
    let handle = cpg::initialize(&model, 0).map_err(FloorError::Connect)?;
    let node = retry(|| cpg::local_get(&handle)).map_err(cpg_err("local_get"))?;
    let expected = probe.senders * probe.count;
    FLOOR.set(FloorState {
        node: node.into(),
        pid: std::process::id(),
        own: vec![0; probe.senders],
        latencies_ns: Vec::with_capacity(expected),
        ..FloorState::default()
    });
    retry(|| cpg::join(&handle, probe.group)).map_err(cpg_err("join"))?;
    while FLOOR.with_borrow(|f| f.members) < probe.members {
        retry(|| cpg::dispatch(&handle, DispatchFlags::One)).map_err(cpg_err("dispatch"))?;
    }
    let mut started_ns = probe.mine.is_empty().then(monotonic_ns);
    let mut msg = vec![0u8; probe.size.max(FLOOR_HEADER)];
    let mut sent = vec![0usize; probe.senders];
    'round: loop {
        if FLOOR.with_borrow(|f| f.latencies_ns.len()) >= expected {
            break;
        }
        // Each of this process's senders whose window has room sends one message.
        for &me in probe.mine {
            let k = me as usize;
            let own = FLOOR.with_borrow(|f| f.own[k]);
            if sent[k] >= probe.count || sent[k] - own >= probe.window.max(1) {
                continue;
            }
            let now = monotonic_ns();
            msg[..8].copy_from_slice(&now.to_be_bytes());
            msg[8..12].copy_from_slice(&me.to_be_bytes());
            msg[12..16].copy_from_slice(&(sent[k] as u32).to_be_bytes());
            match cpg::mcast_joined(&handle, Guarantee::TypeAgreed, &msg) {
                Ok(()) => {
                    started_ns.get_or_insert(now);
                    sent[k] += 1;
                    continue 'round;
                }
                // Corosync's queue is full: take what it delivered, then try again.
                Err(CsError::CsErrTryAgain) => {
                    cpg::dispatch(&handle, DispatchFlags::All).map_err(cpg_err("dispatch"))?;
                    std::thread::sleep(Duration::from_micros(50));
                    continue 'round;
                }
                Err(err) => return Err(FloorError::Cpg { what: "mcast_joined", err }),
            }
        }
        // Every sender here is done or waits for its window: wait for a delivery.
        retry(|| cpg::dispatch(&handle, DispatchFlags::One)).map_err(cpg_err("dispatch"))?;
    }
    let done_ns = monotonic_ns();
    let _ = retry(|| cpg::leave(&handle, probe.group));
    // Dropping the handle (outside any callback) disconnects.
    drop(handle);
    let latencies_ns = FLOOR.with_borrow_mut(|f| std::mem::take(&mut f.latencies_ns));
    Ok(FloorResult { latencies_ns, started_ns: started_ns.unwrap_or(done_ns), done_ns })
}
