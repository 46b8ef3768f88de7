//! The `daemon` engine of `conclave bench events`: real time, real sockets.
//!
//! Every member is a `conclave-secure` session on its own connection, in its
//! own task: the whole stack an application uses, with nothing simulated.
//! The daemons are either one embedded standalone daemon per point, or with
//! `--cluster N` a Corosync cluster of N nodes in network namespaces
//! ([`conclave_testkit::netns`]), started once for the run, with the members spread
//! round-robin over the nodes (member i on node i mod N). The time of an
//! event is wall-clock time from its cause (a join or leave request, a split
//! or a heal of the network) until the last member concerned has shown the
//! new secure view (which it does only once the key is installed).
//!
//! The same events are also timed with plain group communication clients
//! (`conclave-gcs-net`'s [`Client`]: no key agreement, no secure session),
//! placed and driven the same way: the *membership* line of the paper's
//! Fig. 16, the part of each protocol's time that is the daemons' (and
//! Corosync's) membership service. Its time runs until the last member
//! concerned has received the new view, all of them with one view id.
//!
//! On the cluster, a partition moves the last ⌊N/2⌋ nodes onto a bridge of
//! their own (with 3 nodes: node 3 alone, so a third of the members against
//! two thirds); a merge moves them back. Both times include Corosync's
//! detection of the change (its token timeout and consensus, about 2 s), as
//! any application over it would see.
//!
//! With `--wan tissec2002` the nodes sit on §6.2.1's three sites as the
//! simulator's machines do: the last node at the third site (ICU), the one
//! before at the second (UCI), the rest at the first (JHU); with 3 nodes, one
//! per site. Every frame between two nodes then waits half their sites'
//! round trip (70 ms JHU–UCI, 300 ms JHU–ICU, 270 ms UCI–ICU) in a userspace
//! delay hub that replaces the bridge ([`conclave_testkit::netns`]; this machine's
//! kernel has no netem). The engine measures the round trips before the
//! first point and prints them.
//!
//! All members share this machine's CPUs, unlike the paper's 13 machines: a
//! run's time is close to the *sum* of the members' cryptography divided by
//! the number of cores, not its critical path. That is the point of the
//! engine: what one machine really does, next to the sim's model of many.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use conclave_gcs_net::daemon::JOIN_BURST;
use conclave_gcs_net::{Client, Daemon, DaemonConfig, Event};
use conclave_gka::suite::generate_signer;
use conclave_gka::suite::tally::{tally, Tally};
#[cfg(test)]
use conclave_gka::GroupId;
use conclave_gka::{ProtocolId, SignatureId, StaticDirectory};
use conclave_secure::{MemberId, Policy, SecureEvent, Session};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use tokio::sync::{mpsc, watch};

use crate::scenario::{Placement, TimedEvent, Wan};
use conclave_testkit::scripted::{self, Cmd, Report};

pub(crate) mod gauge;

/// Members that join at once while the group forms (untimed).
const FORMING_WAVE: usize = 16;

/// Longest wait for one event's secure views.
const WAIT: Duration = Duration::from_secs(120);

/// Where the members' daemons run, for a whole benchmark run.
pub struct Target {
    cluster: Option<cluster::Cluster>,
    /// With a cluster, turns true on SIGINT or SIGTERM: the point under way
    /// ends with an error, so that the cluster is removed on the way out.
    stop: Option<watch::Receiver<bool>>,
    /// Points so far, to name groups and members afresh at each.
    points: std::cell::Cell<usize>,
}

/// The daemons of one point: sockets to connect members to (member i to
/// `sockets[i % len]`), and the cluster's network if there is one.
struct Daemons<'a> {
    sockets: Vec<PathBuf>,
    net: Option<&'a cluster::Cluster>,
}

impl Target {
    /// The embedded standalone daemon (`cluster` is `None`, LAN only), or a
    /// cluster of `cluster` nodes with `wan`'s delays, started now and
    /// removed when the target is dropped. Prints what it set up, with the
    /// measured round trips of the WAN, to `out`.
    pub fn start(cluster: Option<usize>, wan: Wan, out: &mut impl std::io::Write) -> Result<Self> {
        let Some(nodes) = cluster else {
            if wan != Wan::Lan {
                bail!("--wan with --engine daemon needs --cluster 3: the delays are between the cluster's nodes");
            }
            return Ok(Target { cluster: None, stop: None, points: Default::default() });
        };
        #[cfg(not(feature = "cluster"))]
        {
            let _ = (nodes, out);
            bail!(
                "--cluster needs conclave built with the cluster feature: \
                 cargo build --release -p conclave --features cluster (needs corosync's libraries: apt-get install \
                 corosync libcorosync-common-dev libcpg-dev libquorum-dev libcfg-dev libcmap-dev libvotequorum-dev), \
                 run as root"
            );
        }
        #[cfg(feature = "cluster")]
        {
            let stop = cluster::catch_signals()?;
            let c = cluster::Cluster::start(nodes, wan, out)?;
            Ok(Target { cluster: Some(c), stop: Some(stop), points: Default::default() })
        }
    }

    /// How members sit for the simulator's bound of the same events: one
    /// machine per node (on the WAN, node k at site k), a partition's second
    /// side on the last ⌊N/2⌋ nodes. The standalone daemon: the sim's LAN.
    pub fn placement(&self) -> Placement {
        match &self.cluster {
            Some(c) => c.placement(),
            None => Placement::sim(Wan::Lan),
        }
    }

    /// Times `runs` events of one kind at group size `n` (the size after a
    /// join, before a leave, partition or merge), in wall-clock milliseconds:
    /// every member a secure session under `policy`.
    pub fn time(
        &self,
        policy: Policy,
        scheme: SignatureId,
        event: TimedEvent,
        n: usize,
        runs: usize,
        seed: u64,
    ) -> Result<Vec<Sample>> {
        self.time_line(Line::Secure(policy, scheme), event, n, runs, seed)
    }

    /// The membership line: the same events as [`Target::time`], with the
    /// same placement and the same leavers as the protocols other than STR,
    /// timed with plain group communication clients (no key agreement).
    pub fn time_membership(&self, event: TimedEvent, n: usize, runs: usize, seed: u64) -> Result<Vec<Sample>> {
        self.time_line(Line::Membership, event, n, runs, seed)
    }

    /// Many groups at once (Fig. 6 of the integrated-architecture paper):
    /// `groups` groups of `n` members each, every member a secure session
    /// under `policy` (member i of every group on node i mod N), formed one
    /// after another; then the network splits and heals once. Returns the
    /// time from the split until every member of every group shows its
    /// side's secure view, and from the heal until every member shows the
    /// merged one, in ms. Needs a cluster.
    pub fn time_groups(
        &self,
        policy: Policy,
        scheme: SignatureId,
        groups: usize,
        n: usize,
        seed: u64,
    ) -> Result<Healed> {
        if self.cluster.is_none() {
            bail!("a standalone daemon cannot partition: give --cluster N");
        }
        self.on_daemons(|daemons, _| async move {
            let c = daemons.net.expect("a cluster");
            let mut all = Vec::with_capacity(groups);
            for g in 0..groups {
                let tag = self.points.get();
                self.points.set(tag + 1);
                let mut group =
                    Group::<Secure>::start(&daemons.sockets, policy, scheme, n, tag, seed ^ g as u64).await?;
                let members: Vec<usize> = (0..n).collect();
                form(&mut group, &members).await.with_context(|| format!("group {g}"))?;
                all.push(group);
            }
            c.partition_and_merge(&mut all, n).await
        })
        .with_context(|| format!("{} groups of {n} under {policy}", groups))
    }

    fn time_line(&self, line: Line, event: TimedEvent, n: usize, runs: usize, seed: u64) -> Result<Vec<Sample>> {
        if n < 2 {
            bail!("group size {n} is too small: an event needs at least 2 members");
        }
        if self.cluster.is_none() && event.needs_a_network() {
            bail!("a standalone daemon cannot partition: give --cluster N to time {event:?}");
        }
        self.on_daemons(|daemons, tag| async move { line.point(&daemons, event, n, runs, tag, seed).await })
            .with_context(|| format!("{line} {event:?} at n = {n}"))
    }

    /// Runs `work` on this target's daemons, as [`Target::time`] runs a
    /// point: given the sockets to connect member i to (`sockets[i % len]`:
    /// the cluster's nodes, or an embedded daemon started for it and stopped
    /// after) and a tag that names this run's groups and members afresh.
    /// With a cluster, SIGINT or SIGTERM ends it with an error.
    pub(crate) fn run<T, Fut>(&self, work: impl FnOnce(Vec<PathBuf>, usize) -> Fut) -> Result<T>
    where
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.on_daemons(|daemons, tag| work(daemons.sockets, tag))
    }

    /// What every timing on this target shares: a fresh tag, a stop asked
    /// for before it starts, the daemons (the cluster's nodes, or an embedded
    /// daemon started for `work` and stopped after), and SIGINT or SIGTERM
    /// ending `work` with an error.
    fn on_daemons<'s, T, Fut>(&'s self, work: impl FnOnce(Daemons<'s>, usize) -> Fut) -> Result<T>
    where
        Fut: std::future::Future<Output = Result<T>>,
    {
        let tag = self.points.get();
        self.points.set(tag + 1);
        let mut stop = self.stop.clone();
        if stop.as_ref().is_some_and(|s| *s.borrow()) {
            bail!("interrupted");
        }
        crate::block_on(async move {
            let done = async {
                if let Some(c) = &self.cluster {
                    return work(Daemons { sockets: c.sockets(), net: Some(c) }, tag).await;
                }
                let (_dir, socket, daemon) = embedded_daemon().await?;
                let r = work(Daemons { sockets: vec![socket], net: None }, tag).await;
                daemon.shutdown().await;
                r
            };
            let r = tokio::select! {
                r = done => r,
                _ = interrupted(&mut stop) => Err(anyhow!("interrupted")),
            };
            if let (Err(_), Some(c)) = (&r, &self.cluster) {
                // What the daemons and Corosync last said, for the report.
                eprintln!("cluster logs, last lines of each:\n{}", c.log_tails(30));
            }
            r
        })
    }
}

/// An embedded standalone daemon on a Unix socket in a fresh directory
/// (removed when the returned guard is dropped).
pub(crate) async fn embedded_daemon() -> Result<(tempfile::TempDir, PathBuf, Daemon)> {
    let dir = tempfile::tempdir().context("cannot create a directory for the daemon's socket")?;
    let socket = dir.path().join("daemon.sock");
    // A benchmark's members all connect as this one Unix user: no per-user cap.
    let config =
        DaemonConfig { unix: Some(socket.clone()), max_connections_per_peer: 100_000, ..DaemonConfig::default() };
    let daemon = Daemon::start(config).await.context("starting the embedded daemon")?;
    Ok((dir, socket, daemon))
}

/// Resolves once `stop` turns true (never without a cluster's signal watch).
async fn interrupted(stop: &mut Option<watch::Receiver<bool>>) {
    match stop {
        // The sender goes only after sending true.
        Some(s) => drop(s.wait_for(|&s| s).await),
        None => std::future::pending().await,
    }
}

/// One timed event: wall-clock ms until every member concerned shows the
/// new view, and the CPU this process spent meanwhile (every member's
/// session, and the embedded daemon; not a cluster's daemons or Corosync),
/// where it is measured.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub ms: f64,
    pub cpu_ms: Option<f64>,
    /// Secure members: the longest any member concerned took from its
    /// daemon's view to the key's installation (the session's rekey time):
    /// the key management's part of `ms`, without the membership's.
    pub key_ms: Option<f64>,
    /// The exponentiations, subgroup checks, signatures and verifications
    /// this process did meanwhile, where `cpu_ms` is measured.
    pub ops: Option<Tally>,
}

/// A split of the network and its heal, timed.
#[derive(Clone, Copy, Debug)]
pub struct Healed {
    /// From the split until both sides show their views.
    pub split: Sample,
    /// From the heal until everyone shows the merged view.
    pub merge: Sample,
}

/// CPU time of this process, all threads, in ms.
pub(crate) fn process_cpu_ms() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_PROCESS_CPUTIME_ID is
    // supported on every Linux this runs on, and on failure `ts` stays 0.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// What one point times: secure sessions of one protocol, or plain clients.
#[derive(Clone, Copy)]
enum Line {
    Secure(Policy, SignatureId),
    Membership,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Line::Secure(policy, _) => write!(f, "{}", policy.protocol),
            Line::Membership => f.write_str("membership"),
        }
    }
}

impl Line {
    /// Starts this line's members of one point and times its events (see [`point`]).
    async fn point(
        self,
        daemons: &Daemons<'_>,
        event: TimedEvent,
        n: usize,
        runs: usize,
        tag: usize,
        seed: u64,
    ) -> Result<Vec<Sample>> {
        match self {
            Line::Secure(policy, scheme) => {
                let group = Group::<Secure>::start(&daemons.sockets, policy, scheme, n, tag, seed).await?;
                point(group, daemons.net, event, n, runs, seed).await
            }
            Line::Membership => {
                let group = Group::<Plain>::start(&daemons.sockets, n, tag).await?;
                point(group, daemons.net, event, n, runs, seed).await
            }
        }
    }
}

/// What a member reported, as the event choreography reads it.
enum Seen {
    /// A view (secure or plain) of `size` members, and what its members
    /// must agree on: the key's fingerprint, or the view id; for a secure
    /// view, the time from the daemon's view to the key.
    View { size: usize, agreed: String, rekey: Option<Duration> },
    /// The member's leave took effect.
    Left,
    /// Anything else.
    Other,
}

/// A kind of member: a secure session ([`Secure`]) or a plain group
/// communication client ([`Plain`]). [`Group`] and [`point`] drive both
/// alike.
trait Kind {
    /// A command to one member's task.
    type Cmd;
    /// What one member's task reports.
    type Report;
    /// What the members of one view agree on, in words.
    const AGREED: &'static str;
    /// The command to join the group.
    fn join(&self) -> Self::Cmd;
    /// The command to leave it.
    fn leave(&self) -> Self::Cmd;
    /// The protocol the members run, if any: it picks the leaver (§6.1.2).
    fn protocol(&self) -> Option<ProtocolId>;
    /// Who reported, when, and what (or why the member failed).
    fn read(report: Self::Report) -> (usize, Instant, Result<Seen, String>);
}

/// Members that are secure sessions ([`scripted`]) under one policy.
struct Secure {
    policy: Policy,
}

impl Kind for Secure {
    type Cmd = Cmd;
    type Report = Report<usize>;
    const AGREED: &'static str = "key";

    fn join(&self) -> Cmd {
        Cmd::Join(self.policy)
    }

    fn leave(&self) -> Cmd {
        Cmd::Leave
    }

    fn protocol(&self) -> Option<ProtocolId> {
        Some(self.policy.protocol)
    }

    fn read(r: Report<usize>) -> (usize, Instant, Result<Seen, String>) {
        let seen = match r.event {
            Ok(SecureEvent::View(v)) => {
                Ok(Seen::View { size: v.members.len(), agreed: v.fingerprint, rekey: Some(v.rekey_time) })
            }
            Ok(SecureEvent::Left { .. }) => Ok(Seen::Left),
            Ok(SecureEvent::DaemonError { code, text }) => Err(format!("the daemon says {code:?}: {text}")),
            Ok(_) => Ok(Seen::Other),
            Err(e) => Err(e),
        };
        (r.who, r.at, seen)
    }
}

/// Members that are plain group communication clients: the membership line.
struct Plain;

/// A command to a plain client's task.
#[derive(Clone, Copy, Debug)]
enum PlainCmd {
    Join,
    Leave,
}

/// An event of one plain client, or why it failed, and when it came.
struct PlainReport {
    who: usize,
    event: Result<Event, String>,
    at: Instant,
}

impl Kind for Plain {
    type Cmd = PlainCmd;
    type Report = PlainReport;
    const AGREED: &'static str = "view id";

    fn join(&self) -> PlainCmd {
        PlainCmd::Join
    }

    fn leave(&self) -> PlainCmd {
        PlainCmd::Leave
    }

    fn protocol(&self) -> Option<ProtocolId> {
        None
    }

    fn read(r: PlainReport) -> (usize, Instant, Result<Seen, String>) {
        let seen = match r.event {
            Ok(Event::View { view, .. }) => {
                Ok(Seen::View { size: view.members.len(), agreed: view.id.to_string(), rekey: None })
            }
            Ok(Event::Left { .. }) => Ok(Seen::Left),
            Ok(Event::Error { code, text }) => Err(format!("the daemon says {code:?}: {text}")),
            Ok(_) => Ok(Seen::Other),
            Err(e) => Err(e),
        };
        (r.who, r.at, seen)
    }
}

/// Runs plain client `who` in group `group`, as [`scripted::spawn`] runs a
/// session: commands in, every event out (stamped when it came), until the
/// command channel or the report channel closes or the connection ends.
fn spawn_plain(
    client: Client,
    group: String,
    who: usize,
    out: mpsc::UnboundedSender<PlainReport>,
) -> mpsc::UnboundedSender<PlainCmd> {
    let (tx, mut rx) = mpsc::unbounded_channel::<PlainCmd>();
    let (sender, mut receiver) = client.split();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                cmd = rx.recv() => {
                    let r = match cmd {
                        None => return,
                        Some(PlainCmd::Join) => sender.join(&group).await,
                        Some(PlainCmd::Leave) => sender.leave(&group).await,
                    };
                    if let Err(e) = r {
                        if out.send(PlainReport { who, event: Err(e.to_string()), at: Instant::now() }).is_err() {
                            return;
                        }
                    }
                }
                // Cancel-safe: an event half read when a command comes is read on.
                ev = receiver.recv() => {
                    let ended = ev.is_err();
                    let event = ev.map_err(|e| format!("connection ended: {e}"));
                    if out.send(PlainReport { who, event, at: Instant::now() }).is_err() || ended {
                        return;
                    }
                }
            }
        }
    });
    tx
}

/// Members of one group, each in its own task: secure sessions or plain clients.
/// What a member showed last: the size of its view, what its members agree
/// on (key fingerprint or view id), when, and (sessions) its key time.
type Shown = (usize, String, Instant, Option<Duration>);

struct Group<K: Kind> {
    kind: K,
    cmds: Vec<mpsc::UnboundedSender<K::Cmd>>,
    reports: mpsc::UnboundedReceiver<K::Report>,
    /// Per member since the last [`Group::forget`]: the size of the last
    /// view it showed, what its members agree on (key fingerprint or view
    /// id), and when.
    latest: BTreeMap<usize, Shown>,
    /// Members whose `Left` has arrived since their last command: only they
    /// may join again (a session refuses to join a group it is still leaving).
    gone: BTreeSet<usize>,
}

/// A connection's result, or an error once [`WAIT`] has passed: a daemon
/// that never answers a Hello (its daemon group wedged, say) ends the point
/// with an error that names the member, not with the caller's outer time
/// limit.
async fn within_wait<T, E>(connecting: impl std::future::Future<Output = Result<T, E>>) -> Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    Ok(tokio::time::timeout(WAIT, connecting).await.map_err(|_| anyhow!("no Welcome within {WAIT:?}"))??)
}

impl Group<Secure> {
    /// `tag` names the point: members and group of earlier points may still
    /// be disconnecting, so names are never reused. Member i connects to
    /// `sockets[i % sockets.len()]`.
    async fn start(
        sockets: &[PathBuf],
        policy: Policy,
        scheme: SignatureId,
        n: usize,
        tag: usize,
        seed: u64,
    ) -> Result<Self> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut directory = StaticDirectory::new();
        let mut signers = Vec::new();
        for i in 0..n {
            let name = format!("b{tag}-{i}");
            let s = generate_signer(scheme, &mut rng)?;
            directory.insert(MemberId::new(name.clone())?, s.verifier());
            signers.push((name, s));
        }
        let directory = Arc::new(directory);
        let group = format!("bench-{tag}");
        let (report_tx, reports) = mpsc::unbounded_channel();
        let mut cmds = Vec::new();
        for (member, (name, signer)) in signers.into_iter().enumerate() {
            let socket: &Path = &sockets[member % sockets.len()];
            let connecting = Session::connect_unix(socket, &name, signer, directory.clone());
            let session = within_wait(connecting)
                .await
                .with_context(|| format!("connecting member {member} ({name}) to {}", socket.display()))?;
            let tx = scripted::spawn(session, group.clone(), member, report_tx.clone());
            cmds.push(tx);
        }
        Ok(Self::new(Secure { policy }, cmds, reports))
    }
}

impl Group<Plain> {
    /// `n` plain clients, named and placed as [`Group::<Secure>::start`] names
    /// and places sessions.
    async fn start(sockets: &[PathBuf], n: usize, tag: usize) -> Result<Self> {
        let group = format!("bench-{tag}");
        let (report_tx, reports) = mpsc::unbounded_channel();
        let mut cmds = Vec::new();
        for member in 0..n {
            let socket: &Path = &sockets[member % sockets.len()];
            let name = format!("b{tag}-{member}");
            let client = within_wait(Client::connect_unix(socket, &name))
                .await
                .with_context(|| format!("connecting client {member} ({name}) to {}", socket.display()))?;
            cmds.push(spawn_plain(client, group.clone(), member, report_tx.clone()));
        }
        Ok(Self::new(Plain, cmds, reports))
    }
}

impl<K: Kind> Group<K> {
    fn new(kind: K, cmds: Vec<mpsc::UnboundedSender<K::Cmd>>, reports: mpsc::UnboundedReceiver<K::Report>) -> Self {
        Self { kind, cmds, reports, latest: BTreeMap::new(), gone: BTreeSet::new() }
    }

    /// Asks `member` to join the group.
    fn join(&mut self, member: usize) -> Result<()> {
        let cmd = self.kind.join();
        self.command(member, cmd)
    }

    /// Asks `member` to leave the group.
    fn leave(&mut self, member: usize) -> Result<()> {
        let cmd = self.kind.leave();
        self.command(member, cmd)
    }

    /// Sends a member a command. Every command changes the view, so what
    /// members showed before it no longer counts.
    fn command(&mut self, member: usize, cmd: K::Cmd) -> Result<()> {
        self.forget();
        self.gone.remove(&member);
        self.cmds[member].send(cmd).map_err(|_| anyhow!("member {member} stopped"))
    }

    /// Forgets the views shown so far: the next [`Group::settled`] waits for new ones.
    fn forget(&mut self) {
        self.latest.clear();
    }

    /// Waits until every member of `who` shows a view of `size` members
    /// (since the last command or [`Group::forget`]), all agreeing (one key;
    /// for plain clients one view id); returns when the last one did, and
    /// what they agree on.
    async fn settled(&mut self, who: &[usize], size: usize) -> Result<(Instant, String)> {
        let deadline = Instant::now() + WAIT;
        // How many of `who` show a view of `size`, kept as reports come: a
        // look at every member's last view per report was n² per event at
        // n members, the harness's own work inside the timed window (a fifth
        // of the membership line's CPU at 512).
        let mut counted = vec![false; who.iter().max().map_or(0, |m| m + 1)];
        for &m in who {
            counted[m] = true;
        }
        let shows = |latest: &BTreeMap<usize, Shown>, m: usize| latest.get(&m).is_some_and(|(s, ..)| *s == size);
        let mut showing = who.iter().filter(|&&m| shows(&self.latest, m)).count();
        loop {
            let shown: Option<Vec<&Shown>> = (showing == who.len())
                .then(|| who.iter().map(|m| self.latest.get(m).filter(|(s, ..)| *s == size)).collect())
                .flatten();
            if let Some(shown) = shown.filter(|s| !s.is_empty()) {
                let agreed = &shown[0].1;
                if shown.iter().any(|(_, a, ..)| a != agreed) {
                    bail!("members show different {}s for one view of {size}", K::AGREED);
                }
                let last = shown.iter().map(|(_, _, at, _)| *at).max().expect("not empty");
                return Ok((last, agreed.clone()));
            }
            let (who, at, seen) = match self.next(deadline).await {
                Ok(next) => next,
                Err(e) => {
                    let shown = self.shown(who);
                    return Err(e.context(format!("waiting for views of {size} members ({shown})")));
                }
            };
            if let Seen::View { size: shown, agreed, rekey } = seen {
                let of_who = counted.get(who).copied().unwrap_or(false);
                if of_who && shows(&self.latest, who) {
                    showing -= 1;
                }
                self.latest.insert(who, (shown, agreed, at, rekey));
                if of_who && shown == size {
                    showing += 1;
                }
            }
        }
    }

    /// What each of `who` showed last since the last command, in words: on a
    /// timeout, who is missing and who shows a view of another size.
    fn shown(&self, who: &[usize]) -> String {
        let each: Vec<String> = who
            .iter()
            .map(|m| match self.latest.get(m) {
                Some((size, agreed, ..)) => format!("member {m}: {size} members, {} {agreed}", K::AGREED),
                None => format!("member {m}: no view"),
            })
            .collect();
        each.join("; ")
    }

    /// The longest time from a daemon's view to the key among the views
    /// `who` showed last (secure members; `None` for plain clients).
    fn key_ms(&self, who: &[usize]) -> Option<f64> {
        who.iter().filter_map(|m| self.latest.get(m)?.3).map(|d| d.as_secs_f64() * 1e3).max_by(f64::total_cmp)
    }

    /// Waits until `member` has confirmed its leave.
    async fn departed(&mut self, member: usize) -> Result<()> {
        let deadline = Instant::now() + WAIT;
        while !self.gone.contains(&member) {
            self.next(deadline).await.with_context(|| format!("waiting for member {member} to leave"))?;
        }
        Ok(())
    }

    /// The next report (noting departures), or an error at `deadline`.
    async fn next(&mut self, deadline: Instant) -> Result<(usize, Instant, Seen)> {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = match tokio::time::timeout(left, self.reports.recv()).await {
            Ok(Some(r)) => r,
            Ok(None) => bail!("every member stopped"),
            Err(_) => bail!("timed out after {WAIT:?}"),
        };
        let (who, at, seen) = K::read(r);
        let seen = seen.map_err(|e| anyhow!("member {who}: {e}"))?;
        if let Seen::Left = seen {
            self.gone.insert(who);
        }
        Ok((who, at, seen))
    }
}

/// Forms `group` of `members`, who join in waves: all at once, n cascaded
/// views would bring each member O(n²) messages, past the daemon's queue for
/// a client that cannot keep up.
async fn form<K: Kind>(group: &mut Group<K>, members: &[usize]) -> Result<()> {
    for wave in 1..=members.len().div_ceil(FORMING_WAVE) {
        let upto = (wave * FORMING_WAVE).min(members.len());
        for &m in &members[(wave - 1) * FORMING_WAVE..upto] {
            group.join(m)?;
        }
        group.settled(&members[..upto], upto).await.context("forming the group")?;
    }
    Ok(())
}

/// Milliseconds from `t0` to `t`.
fn ms_since(t0: Instant, t: Instant) -> f64 {
    t.duration_since(t0).as_secs_f64() * 1e3
}

/// Times `runs` events of one kind at group size `n` (the size after a join,
/// before a leave, partition or merge) with `group`'s `n` members (none in
/// the group yet), in milliseconds. `net` is the cluster, for partitions and
/// merges.
async fn point<K: Kind>(
    mut group: Group<K>,
    net: Option<&cluster::Cluster>,
    event: TimedEvent,
    n: usize,
    runs: usize,
    seed: u64,
) -> Result<Vec<Sample>> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0x11fe);
    // The group of n − 1 (join) or n (the others) forms first.
    let first = if event == TimedEvent::Join { n - 1 } else { n };
    let mut inside: Vec<usize> = (0..first).collect();
    let mut outside: Vec<usize> = (first..n).collect();
    form(&mut group, &inside).await?;
    let mut times = Vec::with_capacity(runs);
    // The group's own joins came before now.
    let mut last_join = Instant::now();
    for _ in 0..runs {
        match event {
            TimedEvent::Join => {
                // A join is timed alone: one within JOIN_BURST of the join
                // before would count as a burst of joins, which a standalone
                // daemon holds until they stop coming (the time would then
                // be that wait: up to 5 ms per join).
                let apart = JOIN_BURST + Duration::from_millis(1);
                if let Some(wait) = apart.checked_sub(last_join.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
                let joiner = outside.pop().expect("one member waits outside");
                let (t0, cpu0, ops0) = (Instant::now(), process_cpu_ms(), tally());
                last_join = t0;
                group.join(joiner)?;
                inside.push(joiner);
                let ms = ms_since(t0, group.settled(&inside, n).await?.0);
                let (cpu_ms, ops) = (Some(process_cpu_ms() - cpu0), Some(tally() - ops0));
                times.push(Sample { ms, cpu_ms, key_ms: group.key_ms(&inside), ops });
                // Back to n − 1, untimed: the oldest leaves (and waits outside).
                let leaver = inside.remove(0);
                group.leave(leaver)?;
                outside.push(leaver);
                group.settled(&inside, n - 1).await?;
                group.departed(leaver).await?;
            }
            TimedEvent::Leave => {
                // The §6.1.2 choice: STR's middle member, anyone at random otherwise
                // (so CKD's controller, the oldest, leaves with chance 1/n). The
                // membership line leaves as the protocols other than STR do.
                let at = match group.kind.protocol() {
                    Some(ProtocolId::Str) => n / 2,
                    _ => (rng.next_u64() % n as u64) as usize,
                };
                let leaver = inside.remove(at);
                let (t0, cpu0, ops0) = (Instant::now(), process_cpu_ms(), tally());
                group.leave(leaver)?;
                let ms = ms_since(t0, group.settled(&inside, n - 1).await?.0);
                let (cpu_ms, ops) = (Some(process_cpu_ms() - cpu0), Some(tally() - ops0));
                times.push(Sample { ms, cpu_ms, key_ms: group.key_ms(&inside), ops });
                // Back to n, untimed, once the leaver is out.
                group.departed(leaver).await?;
                group.join(leaver)?;
                inside.push(leaver);
                group.settled(&inside, n).await?;
            }
            TimedEvent::Partition | TimedEvent::Merge => {
                let net = net.ok_or_else(|| anyhow!("a standalone daemon cannot partition"))?;
                let healed = net.partition_and_merge(std::slice::from_mut(&mut group), n).await?;
                // The cluster's daemons and Corosync run in other processes: no CPU sum.
                times.push(if event == TimedEvent::Partition { healed.split } else { healed.merge });
            }
            TimedEvent::PartitionP1 | TimedEvent::PartitionP2 | TimedEvent::PartitionHalves => {
                bail!("the member-order splits (Fig. 13's odd/even, the first/last halves) run on the simulator only")
            }
        }
    }
    Ok(times)
}

/// The cluster side of the engine: the nodes, their network, signals.
#[cfg(feature = "cluster")]
mod cluster {
    use super::*;
    use conclave_testkit::netns::NetnsCluster;

    /// Longest the cluster may take to form.
    const FORM_LIMIT: Duration = Duration::from_secs(60);

    /// A running cluster; dropping it stops every process and deletes the namespaces.
    pub struct Cluster {
        nodes: NetnsCluster,
        wan: Wan,
        /// The nodes a partition moves to the second side.
        second: Vec<usize>,
        /// The daemons' certificates (see [`certify_daemons`]).
        _certificates: tempfile::TempDir,
    }

    /// Certificates of a fresh group authority for daemons 1..=`nodes`, so
    /// that the cluster's daemons key groups (the integrated architecture):
    /// the directory, and each node's `conclave daemon` arguments.
    fn certify_daemons(nodes: usize) -> Result<(tempfile::TempDir, Vec<Vec<String>>)> {
        use conclave_secure::trust::Issuer;
        use std::time::SystemTime;
        let dir = tempfile::tempdir().context("cannot create a directory for the daemons' certificates")?;
        let now = SystemTime::now();
        let day = Duration::from_secs(86_400);
        let mut rng = rand_core::OsRng;
        let (issuer, _) = Issuer::create("conclave bench authority", now - day, now + day, &mut rng)?;
        let ca = dir.path().join("authority.crt");
        let crl = dir.path().join("authority.crl");
        std::fs::write(&ca, issuer.ca_pem())?;
        std::fs::write(&crl, issuer.crl(1, &[], now, now + day)?)?;
        let mut args = Vec::new();
        for d in 1..=nodes {
            let issued = issuer.issue(&MemberId::new(format!("daemon-{d}"))?, now - day, now + day, &mut rng)?;
            let cert = dir.path().join(format!("daemon-{d}.crt"));
            let key = dir.path().join(format!("daemon-{d}.key"));
            std::fs::write(&cert, &issued.cert_pem)?;
            std::fs::write(&key, issued.key_pem.as_bytes())?;
            let path = |p: &std::path::Path| p.display().to_string();
            args.push(vec![
                // A benchmark's members all connect as this one user.
                "--max-connections-per-peer".into(),
                "100000".into(),
                "--daemon-cert".into(),
                path(&cert),
                "--daemon-key".into(),
                path(&key),
                "--daemon-ca".into(),
                path(&ca),
                "--daemon-crl".into(),
                path(&crl),
            ]);
        }
        Ok((dir, args))
    }

    /// Catches SIGINT and SIGTERM from now on (in a thread of its own, for the
    /// rest of the process): the returned flag turns true at the first one.
    pub fn catch_signals() -> Result<watch::Receiver<bool>> {
        let (tx, rx) = watch::channel(false);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        // Registered here, before the cluster starts, so that no signal kills the process past its Drop.
        let (mut interrupt, mut terminate) = rt.block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            anyhow::Ok((signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?))
        })?;
        std::thread::spawn(move || {
            rt.block_on(async {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            });
            eprintln!("interrupted: stopping the cluster");
            let _ = tx.send(true);
        });
        Ok(rx)
    }

    impl Cluster {
        /// Starts `nodes` nodes (namespaces, corosync and `conclave daemon
        /// --backbone cluster`, this executable) and puts `wan`'s delays on them.
        pub fn start(nodes: usize, wan: Wan, out: &mut impl std::io::Write) -> Result<Self> {
            if !(2..=16).contains(&nodes) {
                bail!("--cluster takes 2 to 16 nodes (a partition needs two sides)");
            }
            if wan == Wan::Tissec2002 && nodes < 3 {
                bail!("--wan tissec2002 needs at least 3 nodes: one per site of §6.2.1");
            }
            let exe = std::env::current_exe().context("cannot find this executable to run the cluster's daemons")?;
            let group = format!("conclave-events-{}", std::process::id());
            eprintln!(
                "starting a {nodes}-node cluster (network namespaces, corosync, conclave daemon --backbone cluster)"
            );
            let (certificates, daemon_args) = certify_daemons(nodes)?;
            let args_of = |i: usize| daemon_args[i - 1].clone();
            let mut nodes_up =
                NetnsCluster::start_with(nodes, &exe, &group, FORM_LIMIT, &args_of).with_context(|| {
                    format!(
                    "cannot start the {nodes}-node cluster (needs root, iproute2, corosync and this executable built \
                     with --features cluster; see the README)"
                )
                })?;
            let second: Vec<usize> = (nodes - nodes / 2..nodes).collect();
            let place = Placement { machines: nodes, wan, second_side_from: Some(second[0]) };
            if wan == Wan::Tissec2002 {
                let one_way = |a: usize, b: usize| crate::scenario::one_way(place.site(a), place.site(b));
                nodes_up.delay((0..nodes).map(|a| (0..nodes).map(|b| one_way(a, b)).collect()).collect())?;
            }
            let c = Cluster { nodes: nodes_up, wan, second, _certificates: certificates };
            let list = |v: &[usize]| v.iter().map(|i| (i + 1).to_string()).collect::<Vec<_>>().join(", ");
            let first: Vec<usize> = (0..nodes - nodes / 2).collect();
            writeln!(
                out,
                "Cluster: {nodes} Corosync nodes in network namespaces on one bridge, member i on node i mod {nodes} + 1; \
                 a partition puts nodes {} on a bridge of their own (nodes {} stay), a merge puts them back.",
                list(&c.second),
                list(&first)
            )?;
            if wan == Wan::Tissec2002 {
                let sites: Vec<String> =
                    (0..nodes).map(|i| format!("node {} {}", i + 1, crate::scenario::SITES[place.site(i)])).collect();
                let mut measured = Vec::new();
                for (a, b) in [(0, nodes - 2), (0, nodes - 1), (nodes - 2, nodes - 1)] {
                    let rtt = c.rtt_ms(a, b)?;
                    let profile = 2.0 * crate::scenario::one_way(place.site(a), place.site(b));
                    measured.push(format!("nodes {}–{} {rtt:.1} ms (profile {profile:.0})", a + 1, b + 1));
                }
                writeln!(
                    out,
                    "WAN tissec2002: {}; a delay hub holds every frame for half its sites' round trip; measured round \
                     trips (UDP echo, median of 5): {}.",
                    sites.join(", "),
                    measured.join(", ")
                )?;
            }
            Ok(c)
        }

        /// The median of 5 UDP echo round trips between nodes `a` and `b`, in ms.
        pub fn rtt_ms(&self, a: usize, b: usize) -> Result<f64> {
            let mut rtts = self.nodes.rtt(a, b, 5)?;
            rtts.sort_by(f64::total_cmp);
            Ok(rtts[rtts.len() / 2])
        }

        /// The daemons' Unix sockets, node 1 first.
        pub fn sockets(&self) -> Vec<PathBuf> {
            self.nodes.nodes.iter().map(|n| n.socket.clone()).collect()
        }

        /// The last `lines` lines of every node's daemon and Corosync log.
        pub fn log_tails(&self, lines: usize) -> String {
            self.nodes.log_tails(lines)
        }

        /// See [`Target::placement`].
        pub fn placement(&self) -> Placement {
            Placement { machines: self.nodes.nodes.len(), wan: self.wan, second_side_from: Some(self.second[0]) }
        }

        /// Splits the network and heals it again, with the `n` members of
        /// each of `groups` in one view before and after; returns the time
        /// from the split until both sides of every group show their views
        /// (secure views, for sessions), and from the heal until all show the
        /// merged ones, in ms. Checks one key (plain clients: one view id)
        /// per side of each group, and that the two sides' differ.
        pub(super) async fn partition_and_merge<K: Kind>(&self, groups: &mut [Group<K>], n: usize) -> Result<Healed> {
            let nodes = self.nodes.nodes.len();
            let all: Vec<usize> = (0..n).collect();
            let (second, first): (Vec<usize>, Vec<usize>) =
                all.iter().partition(|&&m| self.second.contains(&(m % nodes)));
            if first.is_empty() || second.is_empty() {
                bail!("{n} members leave one side of the partition empty: give at least {nodes} members");
            }
            for group in groups.iter_mut() {
                group.forget();
            }
            let t0 = Instant::now();
            self.nodes.split(&self.second)?;
            let (mut last, mut key) = (t0, None::<f64>);
            for (i, group) in groups.iter_mut().enumerate() {
                let (a, key_a) = group
                    .settled(&first, first.len())
                    .await
                    .with_context(|| format!("group {i}: the first side of the partition"))?;
                let (b, key_b) = group
                    .settled(&second, second.len())
                    .await
                    .with_context(|| format!("group {i}: the second side of the partition"))?;
                if key_a == key_b {
                    bail!("both sides of the partition show one {} in group {i}", K::AGREED);
                }
                last = last.max(a).max(b);
                key = key.into_iter().chain(group.key_ms(&all)).max_by(f64::total_cmp);
            }
            let split = Sample { ms: ms_since(t0, last), cpu_ms: None, key_ms: key, ops: None };
            for group in groups.iter_mut() {
                group.forget();
            }
            let t1 = Instant::now();
            self.nodes.unsplit(&self.second)?;
            let (mut last, mut key) = (t1, None::<f64>);
            for (i, group) in groups.iter_mut().enumerate() {
                let (m, _) = group.settled(&all, n).await.with_context(|| format!("group {i}: the merge"))?;
                last = last.max(m);
                key = key.into_iter().chain(group.key_ms(&all)).max_by(f64::total_cmp);
            }
            Ok(Healed { split, merge: Sample { ms: ms_since(t1, last), cpu_ms: None, key_ms: key, ops: None } })
        }
    }
}

/// Without the `cluster` feature there is never a cluster.
#[cfg(not(feature = "cluster"))]
mod cluster {
    use super::*;

    /// No value: [`Target::start`] refuses `--cluster` in this build.
    pub enum Cluster {}

    impl Cluster {
        pub fn sockets(&self) -> Vec<PathBuf> {
            match *self {}
        }

        pub fn placement(&self) -> Placement {
            match *self {}
        }

        pub fn log_tails(&self, _: usize) -> String {
            match *self {}
        }

        pub(super) async fn partition_and_merge<K: Kind>(&self, _: &mut [Group<K>], _: usize) -> Result<Healed> {
            match *self {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_and_leaves_over_a_real_daemon_agree_and_are_timed() {
        let target = Target::start(None, Wan::Lan, &mut std::io::sink()).unwrap();
        for protocol in [ProtocolId::Tgdh, ProtocolId::Gdh] {
            for event in [TimedEvent::Join, TimedEvent::Leave] {
                let policy = Policy::new(protocol, GroupId::Ristretto255);
                let samples = target.time(policy, SignatureId::Ed25519, event, 3, 2, 9).unwrap();
                assert!(samples.iter().all(|s| s.cpu_ms.is_some_and(|c| c > 0.0)), "{samples:?}");
                // Every run's members exponentiate and confirm (signing).
                let did_crypto = |s: &Sample| s.ops.is_some_and(|o| o.exponentiations > 0 && o.signatures > 0);
                assert!(samples.iter().all(did_crypto), "{samples:?}");
                let times: Vec<f64> = samples.iter().map(|s| s.ms).collect();
                assert_eq!(times.len(), 2);
                assert!(times.iter().all(|&t| t > 0.0 && t < WAIT.as_secs_f64() * 1e3), "{times:?}");
            }
        }
    }

    #[test]
    fn the_membership_line_times_joins_and_leaves_with_plain_clients() {
        let target = Target::start(None, Wan::Lan, &mut std::io::sink()).unwrap();
        for event in [TimedEvent::Join, TimedEvent::Leave] {
            let times: Vec<f64> = target.time_membership(event, 3, 2, 9).unwrap().iter().map(|s| s.ms).collect();
            assert_eq!(times.len(), 2);
            assert!(times.iter().all(|&t| t.is_finite() && t > 0.0 && t < WAIT.as_secs_f64() * 1e3), "{times:?}");
        }
    }

    /// A plain group fed `views` (member, view id, size) as its clients' reports.
    fn plain_group_seeing(views: &[(usize, u64, usize)]) -> Group<Plain> {
        use conclave_gcs::view::{Cause, View, ViewId, ViewMember};
        let (tx, rx) = mpsc::unbounded_channel();
        for &(who, id, size) in views {
            let members = (0..size)
                .map(|i| ViewMember { id: conclave_gcs::MemberId::new(format!("m{i}")).unwrap(), prev: None })
                .collect();
            let view = View { id: ViewId::new(0, id), members, cause: Cause::Join };
            let event = Ok(Event::View { group: conclave_gcs::GroupName::new("g").unwrap(), view });
            tx.send(PlainReport { who, event, at: Instant::now() }).unwrap();
        }
        // The sender goes: a group still waiting after these reports fails at once.
        Group::new(Plain, Vec::new(), rx)
    }

    #[test]
    fn plain_clients_settle_only_on_one_view_id() {
        crate::block_on(async {
            // One view id for both: settled, on that id; an older view of another size does not count.
            let mut group = plain_group_seeing(&[(0, 7, 1), (0, 8, 2), (1, 8, 2)]);
            assert_eq!(group.settled(&[0, 1], 2).await?.1, "v8.0000");
            // Two view ids for one size: refused.
            let mut group = plain_group_seeing(&[(0, 8, 2), (1, 9, 2)]);
            let e = group.settled(&[0, 1], 2).await.unwrap_err();
            assert!(e.to_string().contains("different view ids for one view of 2"), "{e:#}");
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn a_wait_that_fails_says_what_each_member_showed() {
        crate::block_on(async {
            let mut group = plain_group_seeing(&[(0, 8, 2), (2, 7, 1)]);
            let e = group.settled(&[0, 1, 2], 2).await.unwrap_err();
            let text = format!("{e:#}");
            assert!(text.contains("every member stopped"), "{text}");
            assert!(text.contains("member 0: 2 members, view id v8.0000"), "{text}");
            assert!(text.contains("member 1: no view"), "{text}");
            assert!(text.contains("member 2: 1 members, view id v7.0000"), "{text}");
            anyhow::Ok(())
        })
        .unwrap();
    }

    #[test]
    fn partitions_and_wan_without_a_cluster_are_refused_with_a_reason() {
        let target = Target::start(None, Wan::Lan, &mut std::io::sink()).unwrap();
        let policy = Policy::default();
        let e = target.time(policy, SignatureId::Ed25519, TimedEvent::Merge, 4, 1, 1).unwrap_err();
        assert!(format!("{e:#}").contains("cannot partition"), "{e:#}");
        let e = Target::start(None, Wan::Tissec2002, &mut std::io::sink()).err().expect("refused");
        assert!(e.to_string().contains("needs --cluster 3"), "{e}");
    }
}
