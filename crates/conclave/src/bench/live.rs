//! The `daemon` engine of `conclave bench events`: real time, real sockets.
//!
//! A standalone daemon runs in this process on a private Unix socket, and
//! every member is a `conclave-secure` session on its own connection, in its
//! own task: the whole stack an application uses, with nothing simulated.
//! The time of an event is wall-clock time from the request (a join or a
//! leave) until the last member that stays has shown the new secure view
//! (which it does only once the key is installed).
//!
//! All members share this machine's CPUs, unlike the paper's 13 machines: a
//! run's time is close to the *sum* of the members' cryptography divided by
//! the number of cores, not its critical path. That is the point of the
//! engine: what one machine really does, next to the sim's model of many.
//!
//! A standalone daemon cannot partition, so this engine times joins and
//! leaves.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use conclave_gcs_net::{Daemon, DaemonConfig};
use conclave_gka::suite::generate_signer;
#[cfg(test)]
use conclave_gka::GroupId;
use conclave_gka::{ProtocolId, SignatureId, StaticDirectory};
use conclave_secure::{MemberId, Policy, SecureEvent, Session};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use tokio::sync::mpsc;

use super::events::TimedEvent;
use crate::scripted::{self, Cmd, Report};

/// Members that join at once while the group forms (untimed).
const FORMING_WAVE: usize = 16;

/// Longest wait for one event's secure views.
const WAIT: Duration = Duration::from_secs(120);

/// Members of one group, each a session in its own task.
struct Group {
    cmds: Vec<mpsc::UnboundedSender<Cmd>>,
    reports: mpsc::UnboundedReceiver<Report<usize>>,
    policy: Policy,
    /// Last secure view size shown per member, and its key fingerprint.
    latest: BTreeMap<usize, (usize, String)>,
    /// Members whose `Left` has arrived since their last command: only they
    /// may join again (a session refuses to join a group it is still leaving).
    gone: BTreeSet<usize>,
}

impl Group {
    /// `tag` names the point: members and group of earlier points may still
    /// be disconnecting, so names are never reused.
    async fn start(
        socket: &Path,
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
            let session = Session::connect_unix(socket, &name, signer, directory.clone())
                .await
                .with_context(|| format!("connecting member {member}"))?;
            let tx = scripted::spawn(session, group.clone(), member, report_tx.clone());
            cmds.push(tx);
        }
        Ok(Self { cmds, reports, policy, latest: BTreeMap::new(), gone: BTreeSet::new() })
    }

    /// Sends a member a command. Every command changes the view, so what
    /// members showed before it no longer counts.
    fn command(&mut self, member: usize, cmd: Cmd) -> Result<()> {
        self.latest.clear();
        self.gone.remove(&member);
        self.cmds[member].send(cmd).map_err(|_| anyhow!("member {member} stopped"))
    }

    /// Waits until every member of `who` shows a secure view of `size`
    /// members, all under one key; returns when the last one did.
    async fn settled(&mut self, who: &[usize], size: usize) -> Result<Instant> {
        let deadline = Instant::now() + WAIT;
        let mut last = None;
        loop {
            let mut fingerprints = who.iter().map(|m| self.latest.get(m).filter(|(s, _)| *s == size).map(|(_, f)| f));
            if let Some(Some(first)) = fingerprints.next() {
                if fingerprints.clone().all(|f| f.is_some()) {
                    if fingerprints.any(|f| f != Some(first)) {
                        bail!("members show different keys for one view of {size}");
                    }
                    if let Some(at) = last {
                        return Ok(at);
                    }
                }
            }
            let r = self.next(deadline).await.with_context(|| format!("waiting for secure views of {size} members"))?;
            let Ok(SecureEvent::View(v)) = r.event else { continue };
            if who.contains(&r.who) && v.members.len() == size {
                last = Some(last.map_or(r.at, |l: Instant| l.max(r.at)));
            }
            self.latest.insert(r.who, (v.members.len(), v.fingerprint));
        }
    }

    /// Waits until `member`'s session has confirmed its leave.
    async fn departed(&mut self, member: usize) -> Result<()> {
        let deadline = Instant::now() + WAIT;
        while !self.gone.contains(&member) {
            self.next(deadline).await.with_context(|| format!("waiting for member {member} to leave"))?;
        }
        Ok(())
    }

    /// The next report (noting departures), or an error at `deadline`.
    async fn next(&mut self, deadline: Instant) -> Result<Report<usize>> {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = match tokio::time::timeout(left, self.reports.recv()).await {
            Ok(Some(r)) => r,
            Ok(None) => bail!("every member stopped"),
            Err(_) => bail!("timed out after {WAIT:?}"),
        };
        match &r.event {
            Ok(SecureEvent::Left { .. }) => {
                self.gone.insert(r.who);
            }
            Ok(SecureEvent::DaemonError { code, text }) => bail!("member {}: the daemon says {code:?}: {text}", r.who),
            Ok(_) => {}
            Err(e) => bail!("member {}: {e}", r.who),
        }
        Ok(r)
    }
}

/// Times `runs` events of one kind at group size `n` (the size after a join,
/// before a leave), in milliseconds.
#[allow(clippy::too_many_arguments)]
async fn point(
    socket: &Path,
    policy: Policy,
    scheme: SignatureId,
    event: TimedEvent,
    n: usize,
    runs: usize,
    tag: usize,
    seed: u64,
) -> Result<Vec<f64>> {
    let mut group = Group::start(socket, policy, scheme, n, tag, seed).await?;
    let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0x11fe);
    // The group of n − 1 (join) or n (leave) forms first; members join at once.
    let first = if event == TimedEvent::Join { n - 1 } else { n };
    let mut inside: Vec<usize> = (0..first).collect();
    let mut outside: Vec<usize> = (first..n).collect();
    // In waves: all at once, n cascaded views would bring each member O(n²)
    // messages, past the daemon's queue for a client that cannot keep up.
    for wave in 1..=inside.len().div_ceil(FORMING_WAVE) {
        let upto = (wave * FORMING_WAVE).min(inside.len());
        for &m in &inside[(wave - 1) * FORMING_WAVE..upto] {
            group.command(m, Cmd::Join(group.policy))?;
        }
        group.settled(&inside[..upto], upto).await.context("forming the group")?;
    }
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        match event {
            TimedEvent::Join => {
                let joiner = outside.pop().expect("one member waits outside");
                let t0 = Instant::now();
                group.command(joiner, Cmd::Join(group.policy))?;
                inside.push(joiner);
                times.push(group.settled(&inside, n).await?.duration_since(t0).as_secs_f64() * 1e3);
                // Back to n − 1, untimed: the oldest leaves (and waits outside).
                let leaver = inside.remove(0);
                group.command(leaver, Cmd::Leave)?;
                outside.push(leaver);
                group.settled(&inside, n - 1).await?;
                group.departed(leaver).await?;
            }
            TimedEvent::Leave => {
                // The §6.1.2 choice: STR's middle member, anyone at random otherwise
                // (so CKD's controller, the oldest, leaves with chance 1/n).
                let at = match policy.protocol {
                    ProtocolId::Str => n / 2,
                    _ => (rng.next_u64() % n as u64) as usize,
                };
                let leaver = inside.remove(at);
                let t0 = Instant::now();
                group.command(leaver, Cmd::Leave)?;
                times.push(group.settled(&inside, n - 1).await?.duration_since(t0).as_secs_f64() * 1e3);
                // Back to n, untimed, once the leaver's session is out.
                group.departed(leaver).await?;
                group.command(leaver, Cmd::Join(group.policy))?;
                inside.push(leaver);
                group.settled(&inside, n).await?;
            }
            TimedEvent::Partition | TimedEvent::Merge => bail!("the daemon engine times joins and leaves only"),
        }
    }
    Ok(times)
}

/// Times `runs` events of one kind at group size `n` over a fresh embedded
/// standalone daemon; wall-clock milliseconds.
pub fn time(
    policy: Policy,
    scheme: SignatureId,
    event: TimedEvent,
    n: usize,
    runs: usize,
    seed: u64,
) -> Result<Vec<f64>> {
    if matches!(event, TimedEvent::Partition | TimedEvent::Merge) {
        bail!("--engine daemon times join and leave only (a standalone daemon cannot partition); drop {event:?} from --events");
    }
    if n < 2 {
        bail!("group size {n} is too small: a join or leave needs at least 2 members");
    }
    crate::block_on(async move {
        let dir = tempfile_dir()?;
        let socket = dir.join("daemon.sock");
        let daemon = Daemon::start(DaemonConfig { unix: Some(socket.clone()), ..DaemonConfig::default() })
            .await
            .context("starting the embedded daemon")?;
        let result = point(&socket, policy, scheme, event, n, runs, 0, seed).await;
        daemon.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
        result.with_context(|| format!("{} {event:?} at n = {n}", policy.protocol))
    })
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("conclave-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_and_leaves_over_a_real_daemon_agree_and_are_timed() {
        for protocol in [ProtocolId::Tgdh, ProtocolId::Gdh] {
            for event in [TimedEvent::Join, TimedEvent::Leave] {
                let policy = Policy { protocol, group_id: GroupId::Ristretto255 };
                let times = time(policy, SignatureId::Ed25519, event, 3, 2, 9).unwrap();
                assert_eq!(times.len(), 2);
                assert!(times.iter().all(|&t| t > 0.0 && t < WAIT.as_secs_f64() * 1e3), "{times:?}");
            }
        }
    }

    #[test]
    fn partitions_are_refused_with_a_reason() {
        let policy = Policy::default();
        let e = time(policy, SignatureId::Ed25519, TimedEvent::Merge, 4, 1, 1).unwrap_err();
        assert!(e.to_string().contains("join and leave only"), "{e}");
    }
}
