//! The MLS peer of `conclave bench events`: the equivalent add and remove
//! commits of MLS (RFC 9420) with mls-rs, timed on this machine in the same run.
//!
//! Ciphersuite: MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519 (mls-rs
//! `CURVE25519_AES128`) with the pure-Rust RustCrypto provider. It is RFC 9420's
//! mandatory-to-implement suite and the nearest to our default
//! ristretto255/Ed25519 suite: the same curve (X25519 and ristretto255 are both
//! Curve25519, at the same 128-bit security level) and the same signature
//! scheme, so the two sides spend their time on comparable operations.
//!
//! For a group size n:
//! * **join**: a group of n−1 adds one member. The committer builds the add
//!   commit (with an UpdatePath, as our protocols also refresh the sponsor's
//!   share) and the Welcome; every existing member processes the commit and the
//!   newcomer processes the Welcome.
//! * **leave**: in the group of n, the same committer removes a random other
//!   member; every remaining member processes the commit.
//!
//! The reported time assumes every member runs on its own CPU: membership
//! notification and one message delay as in our simulator (see
//! [`super::events::one_round_network_ms`]), plus the commit's CPU time, plus the
//! slowest receiver's CPU time. At large n only a seeded random sample of the
//! receivers is timed (the slowest of the sample stands for the slowest of all);
//! the output says how many.
//!
//! The tree is set up the way a long-lived group would have it rather than the
//! way a bulk add leaves it: after the creator adds everyone in one commit,
//! every parent node is blank and a commit would encrypt to O(n) leaves. Members
//! spread over the tree then commit empty updates until the parent nodes are
//! filled (every second leaf up to n = 513; every fourth, which leaves some
//! lowest-level parents blank, above that, to keep setup time quadratic in at
//! most 256 committers).

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use mls_rs::client_builder::MlsConfig;
use mls_rs::identity::basic::{BasicCredential, BasicIdentityProvider};
use mls_rs::identity::SigningIdentity;
use mls_rs::mls_rules::{CommitOptions, DefaultMlsRules};
use mls_rs::{CipherSuite, CipherSuiteProvider, Client, CryptoProvider, Group, MlsMessage};
use mls_rs_crypto_rustcrypto::RustCryptoProvider;
use rand_core::{RngCore, SeedableRng};

/// The ciphersuite (see the module documentation for why this one).
const SUITE: CipherSuite = CipherSuite::CURVE25519_AES128;
/// Most receivers timed per commit; above this a random sample is timed.
pub const MAX_TIMED: usize = 32;
/// Most members that commit empty updates to fill the tree during setup.
const MAX_FILLERS: usize = 256;

/// CPU times of one MLS commit, in ms.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct CommitTimes {
    /// The committer building the commit (and Welcome) and applying it.
    pub commit_ms: f64,
    /// The slowest timed receiver processing the commit (or the Welcome).
    pub max_receive_ms: f64,
    /// Receivers timed.
    pub timed: usize,
    /// Receivers in all (members other than the committer that get the new epoch).
    pub receivers: usize,
}

/// MLS add (join) and remove (leave) for one group size.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct MlsSize {
    /// Group size after the add / before the remove.
    pub n: usize,
    /// Adding the n-th member.
    pub join: CommitTimes,
    /// Removing one of n members.
    pub leave: CommitTimes,
}

fn client(name: usize) -> Result<Client<impl MlsConfig>> {
    let provider = RustCryptoProvider::default();
    let suite = provider.cipher_suite_provider(SUITE).context("MLS ciphersuite not supported")?;
    let (secret, public) = suite.signature_key_generate().map_err(|e| anyhow::anyhow!("MLS key generation: {e:?}"))?;
    let credential = BasicCredential::new(format!("member {name}").into_bytes());
    Ok(Client::builder()
        .identity_provider(BasicIdentityProvider)
        .crypto_provider(provider)
        // Every commit carries an UpdatePath, so the committer refreshes its
        // own key material, as the sponsor does in our protocols.
        .mls_rules(DefaultMlsRules::new().with_commit_options(CommitOptions::new().with_path_required(true)))
        .signing_identity(SigningIdentity::new(credential.into_credential(), public), secret, SUITE)
        .build())
}

/// A point on this thread's CPU clock. mls-rs runs single-threaded here (its
/// rayon feature is off), so CPU time is the work a member does, without the
/// preemption noise that wall-clock time picks up on a shared machine; and the
/// slowest receiver is a maximum, which that noise would inflate.
#[derive(Clone, Copy)]
struct Instant(f64);

impl Instant {
    fn now() -> Self {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is
        // supported on every Linux this runs on, and on failure `ts` stays 0.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Instant(ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6)
    }
}

fn ms_since(t: Instant) -> f64 {
    Instant::now().0 - t.0
}

/// Processes `commit` at every member in `groups` except `skip`; returns the
/// time of the slowest of `timed`.
fn process_all<C: MlsConfig>(
    groups: &mut BTreeMap<u32, Group<C>>,
    commit: &MlsMessage,
    skip: u32,
    timed: &[u32],
) -> Result<f64> {
    let mut slowest: f64 = 0.0;
    for (&leaf, group) in groups.iter_mut().filter(|(&leaf, _)| leaf != skip) {
        let t = Instant::now();
        group.process_incoming_message(commit.clone()).with_context(|| format!("MLS member {leaf}: commit"))?;
        if timed.contains(&leaf) {
            slowest = slowest.max(ms_since(t));
        }
    }
    Ok(slowest)
}

/// Checks that every group in `groups` is in the same epoch with the same
/// epoch authenticator as `reference`, so a timing is never of a failed commit.
fn check_agreement<'a, C: MlsConfig + 'a>(
    reference: &Group<C>,
    others: impl Iterator<Item = &'a Group<C>>,
) -> Result<()> {
    let auth = reference.epoch_authenticator()?;
    for g in others {
        if g.current_epoch() != reference.current_epoch() || g.epoch_authenticator()? != auth {
            bail!("MLS member {} disagrees on the epoch after a commit", g.current_member_index());
        }
    }
    Ok(())
}

/// Sizes above this are measured once: setting up their group takes seconds.
pub const MAX_REPEATED: usize = 200;

/// [`measure`] `reps` times (once above [`MAX_REPEATED`]) with seeds from
/// `seed` on, keeping the median of every time: a single wall-clock run on a
/// shared machine is too noisy at small n.
pub fn measure_median(n: usize, seed: u64, reps: usize) -> Result<MlsSize> {
    let reps = if n > MAX_REPEATED { 1 } else { reps.max(1) };
    let runs = (0..reps as u64).map(|r| measure(n, seed + r)).collect::<Result<Vec<_>>>()?;
    let median = |f: &dyn Fn(&MlsSize) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut out = runs[0];
    out.join.commit_ms = median(&|m| m.join.commit_ms);
    out.join.max_receive_ms = median(&|m| m.join.max_receive_ms);
    out.leave.commit_ms = median(&|m| m.leave.commit_ms);
    out.leave.max_receive_ms = median(&|m| m.leave.max_receive_ms);
    Ok(out)
}

/// Times MLS add and remove commits at group size `n` (3 ≤ n), sampling
/// receivers with `seed`.
pub fn measure(n: usize, seed: u64) -> Result<MlsSize> {
    if n < 3 {
        bail!("MLS peer: group size {n} too small (at least 3: committer, one other member, one joiner or leaver)");
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // Members 0..n-1 form the group before the join, member n-1 joins.
    let clients = (0..n).map(client).collect::<Result<Vec<_>>>()?;
    let key_package = |i: usize| {
        clients[i].generate_key_package_message(Default::default(), Default::default(), None).context("key package")
    };
    let mut creator = clients[0].create_group(Default::default(), Default::default(), None)?;
    let mut builder = creator.commit_builder();
    for i in 1..n - 1 {
        builder = builder.add_member(key_package(i)?)?;
    }
    let setup = builder.build()?;
    creator.apply_pending_commit()?;
    let welcome = setup.welcome_messages.first().context("MLS setup: no Welcome")?;

    // Leaf i is member i (the creator is leaf 0, the bulk add fills leaves in order).
    let existing: Vec<u32> = (1..n as u32 - 1).collect();
    let leaver = existing[(rng.next_u64() % existing.len() as u64) as usize];
    let mut pool: Vec<u32> = existing.iter().copied().filter(|&i| i != leaver).collect();
    // Partial Fisher–Yates: the first MAX_TIMED of `pool` become the sample.
    for i in 0..pool.len().min(MAX_TIMED) {
        let j = i + (rng.next_u64() % (pool.len() - i) as u64) as usize;
        pool.swap(i, j);
    }
    pool.truncate(MAX_TIMED);
    let timed = pool;
    let stride = (2..).step_by(2).find(|s| (n - 1).div_ceil(*s) <= MAX_FILLERS).unwrap_or(2);
    let fillers: Vec<u32> = (1..n as u32 - 1).step_by(stride).collect();

    let mut groups: BTreeMap<u32, Group<_>> = BTreeMap::new();
    groups.insert(0, creator);
    for &leaf in timed.iter().chain(&fillers).chain(std::iter::once(&leaver)) {
        if groups.contains_key(&leaf) {
            continue;
        }
        let (group, _) = clients[leaf as usize].join_group(None, welcome, None)?;
        if group.current_member_index() != leaf {
            bail!("MLS setup: member {leaf} landed at leaf {}", group.current_member_index());
        }
        groups.insert(leaf, group);
    }
    // Fill the tree's parent nodes; a filler that is not needed later leaves.
    for &f in &fillers {
        let mut group = groups.remove(&f).expect("filler joined");
        let fill = group.commit(Vec::new())?;
        group.apply_pending_commit()?;
        process_all(&mut groups, &fill.commit_message, f, &[])?;
        if timed.contains(&f) || f == leaver {
            groups.insert(f, group);
        }
    }

    // Join: member 0 adds member n-1.
    let committer = groups.get_mut(&0).expect("creator");
    let kp = key_package(n - 1)?;
    let t = Instant::now();
    let add = committer.commit_builder().add_member(kp)?.build()?;
    committer.apply_pending_commit()?;
    let add_commit_ms = ms_since(t);
    // The leaver is still a member here and receives the add like the others.
    let mut timed_join = timed.clone();
    timed_join.push(leaver);
    let mut slowest = process_all(&mut groups, &add.commit_message, 0, &timed_join)?;
    let t = Instant::now();
    let welcome = add.welcome_messages.first().context("MLS add: no Welcome")?;
    let (newcomer, _) = clients[n - 1].join_group(None, welcome, None)?;
    slowest = slowest.max(ms_since(t));
    groups.insert(n as u32 - 1, newcomer);
    check_agreement(&groups[&0], groups.values())?;
    let join = CommitTimes {
        commit_ms: add_commit_ms,
        max_receive_ms: slowest,
        timed: timed_join.len() + 1,
        receivers: n - 1,
    };

    // Leave: member 0 removes `leaver`; the newcomer is one of the timed
    // receivers, the removed member processes nothing.
    let committer = groups.get_mut(&0).expect("creator");
    let t = Instant::now();
    let remove = committer.commit_builder().remove_member(leaver)?.build()?;
    committer.apply_pending_commit()?;
    let remove_commit_ms = ms_since(t);
    groups.remove(&leaver);
    let mut timed_leave = timed.clone();
    timed_leave.push(n as u32 - 1);
    let slowest = process_all(&mut groups, &remove.commit_message, 0, &timed_leave)?;
    check_agreement(&groups[&0], groups.values())?;
    let leave = CommitTimes {
        commit_ms: remove_commit_ms,
        max_receive_ms: slowest,
        timed: timed_leave.len(),
        receivers: n - 2,
    };
    Ok(MlsSize { n, join, leave })
}

/// Forming a group of n with mls-rs as a deployment creating a big group
/// would: every joiner publishes a key package, the creator adds all n − 1
/// in one commit (one Welcome for all), and every joiner processes the
/// Welcome. CPU times in ms.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct MlsForm {
    /// Group size.
    pub n: usize,
    /// All n − 1 key packages, generated (each by its joiner).
    pub key_packages_ms: f64,
    /// The creator building the one commit that adds everybody (and the Welcome), and applying it.
    pub commit_ms: f64,
    /// The slowest Welcome processing timed.
    pub max_welcome_ms: f64,
    /// All n − 1 Welcome processings: measured for each if `timed` = n − 1,
    /// else the mean of the `timed` ones times n − 1.
    pub welcomes_ms: f64,
    /// Welcome processings timed.
    pub timed: usize,
}

impl MlsForm {
    /// Every member's CPU summed: what one machine spends forming the group.
    pub fn total_cpu_ms(&self) -> f64 {
        self.key_packages_ms + self.commit_ms + self.welcomes_ms
    }

    /// The time on one machine of `cpus` CPUs shared by all members: the key
    /// packages and the Welcomes run in parallel, the commit between them.
    pub fn on_cpus_ms(&self, cpus: usize) -> f64 {
        let c = cpus.max(1) as f64;
        self.key_packages_ms / c + self.commit_ms + self.welcomes_ms / c
    }
}

/// Times [`MlsForm`] at group size `n` (at least 2), processing at most
/// `sample` Welcomes (the first ones; every joiner's is the same work).
pub fn form(n: usize, sample: usize) -> Result<MlsForm> {
    if n < 2 {
        bail!("MLS: a group of {n} needs no forming");
    }
    let clients = (0..n).map(client).collect::<Result<Vec<_>>>()?;
    let t = Instant::now();
    let mut packages = Vec::with_capacity(n - 1);
    for c in &clients[1..] {
        packages.push(c.generate_key_package_message(Default::default(), Default::default(), None)?);
    }
    let key_packages_ms = ms_since(t);
    let mut creator = clients[0].create_group(Default::default(), Default::default(), None)?;
    let t = Instant::now();
    let mut builder = creator.commit_builder();
    for kp in packages {
        builder = builder.add_member(kp)?;
    }
    let setup = builder.build()?;
    creator.apply_pending_commit()?;
    let commit_ms = ms_since(t);
    let welcome = setup.welcome_messages.first().context("MLS: no Welcome")?;
    let timed = sample.clamp(1, n - 1);
    let (mut sum, mut max) = (0.0f64, 0.0f64);
    for c in &clients[1..=timed] {
        let t = Instant::now();
        let (group, _) = c.join_group(None, welcome, None)?;
        let ms = ms_since(t);
        if group.epoch_authenticator()? != creator.epoch_authenticator()? {
            bail!("MLS: a joiner disagrees with the creator on the epoch");
        }
        sum += ms;
        max = max.max(ms);
    }
    let welcomes_ms = sum / timed as f64 * (n - 1) as f64;
    Ok(MlsForm { n, key_packages_ms, commit_ms, max_welcome_ms: max, welcomes_ms, timed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_group_times_every_receiver() {
        let m = measure(5, 1).expect("MLS at n = 5");
        assert_eq!((m.join.timed, m.join.receivers), (4, 4));
        assert_eq!((m.leave.timed, m.leave.receivers), (3, 3));
        assert!(m.join.commit_ms > 0.0 && m.join.max_receive_ms > 0.0 && m.leave.commit_ms > 0.0);
    }

    #[test]
    fn larger_group_samples_receivers() {
        let m = measure(MAX_TIMED + 10, 2).expect("MLS at n = 42");
        assert_eq!(m.join.timed, MAX_TIMED + 2, "the sample plus the leaver-to-be and the newcomer");
        assert_eq!(m.leave.timed, MAX_TIMED + 1);
        assert_eq!(m.leave.receivers, MAX_TIMED + 8);
    }

    #[test]
    fn too_small_is_an_error() {
        assert!(measure(2, 1).is_err());
    }
}
