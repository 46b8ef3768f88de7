//! The integrated architecture on three Conclave daemons over Corosync CPG,
//! one per network namespace: daemons certified by the group authority
//! (`--daemon-cert`) agree a key among themselves, give every view of every
//! keyed group its key, and re-key every keyed group when the daemon group
//! partitions and merges; a daemon certified by another authority is kept
//! out of the daemons' key. Half the groups are Optimized EVS: after the
//! merge, a message sealed under a key of one side's partition view is
//! re-encrypted by that side's daemons and reported lost on the other.
//! A daemon that restarts (and so numbers the daemon group's changes
//! from one again) takes part in the daemons' key again.
//!
//! Needs root, `ip` and corosync; run by `.ci/run`'s cluster step:
//! `cargo nextest run -p conclave --features cluster --run-ignored ignored-only -E 'binary(cluster_keyed)'`.
#![cfg(feature = "cluster")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use conclave_gcs::core::{GroupMode, Service, ViewKey};
use conclave_gcs::{Cause, GroupName, MemberId, View, ViewId};
use conclave_gcs_net::{Client, ClientSender, Event};
use conclave_integrated::evs::{self, Envelope, NoticeReason, Writer};
use conclave_secure::trust::Issuer;
use conclave_testkit::netns::NetnsCluster;

/// Keyed groups every client joins: the first half Integrated VS, the
/// second Optimized EVS.
const GROUPS: usize = 20;
/// Every wait of the test is bounded by this.
const WAIT: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Log {
    /// Per group, the views in order.
    views: BTreeMap<String, Vec<View>>,
    /// Per (group, view), the key that came with it.
    keys: BTreeMap<(String, ViewId), [u8; 32]>,
    /// Per group, the messages (the view each came in, its payload).
    messages: BTreeMap<String, Vec<(ViewId, Bytes)>>,
    errors: Vec<String>,
}

struct Member {
    name: String,
    tx: ClientSender,
    log: Arc<Mutex<Log>>,
}

impl Member {
    async fn connect(socket: &Path, name: &str) -> Self {
        let client = Client::connect_unix(socket, name).await.unwrap_or_else(|e| panic!("connect {name}: {e}"));
        let (tx, mut rx) = client.split();
        let log = Arc::new(Mutex::new(Log::default()));
        let sink = log.clone();
        tokio::spawn(async move {
            while let Ok(ev) = rx.recv().await {
                let mut log = sink.lock().unwrap();
                match ev {
                    Event::View { group, view } => log.views.entry(group.as_str().to_owned()).or_default().push(view),
                    Event::GroupKey { group, view, key } => {
                        log.keys.insert((group.as_str().to_owned(), view), *key.expose_secret());
                    }
                    Event::Message { group, view, payload, .. } => {
                        log.messages.entry(group.as_str().to_owned()).or_default().push((view, payload))
                    }
                    Event::Error { code, text } => log.errors.push(format!("{code:?}: {text}")),
                    _ => {}
                }
            }
        });
        Member { name: name.to_owned(), tx, log }
    }

    /// The last view of `group`, with its key if one came.
    fn last(&self, group: &str) -> Option<(View, Option<[u8; 32]>)> {
        let log = self.log.lock().unwrap();
        let view = log.views.get(group)?.last()?.clone();
        let key = log.keys.get(&(group.to_owned(), view.id)).copied();
        Some((view, key))
    }
}

fn groups() -> Vec<String> {
    (0..GROUPS).map(|i| format!("k{i}")).collect()
}

/// The mode of group `g` of [`groups`].
fn mode(g: &str) -> GroupMode {
    let i: usize = g[1..].parse().unwrap();
    if i < GROUPS / 2 {
        GroupMode::Keyed
    } else {
        GroupMode::OptimizedEvs
    }
}

/// Waits until `m` got a message in `group`; returns the last one.
async fn until_message(m: &Member, group: &str) -> (ViewId, Bytes) {
    let start = Instant::now();
    loop {
        if let Some(last) = m.log.lock().unwrap().messages.get(group).and_then(|v| v.last().cloned()) {
            return last;
        }
        assert!(start.elapsed() < WAIT, "{}: no message in {group}", m.name);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every member's last view of every group has `n` members and
/// cause `cause`, and (with `keyed`) came with a key; returns, per group,
/// the view and each member's key.
async fn settle(
    members: &[&Member],
    n: usize,
    cause: Cause,
    keyed: bool,
    what: &str,
) -> BTreeMap<String, (ViewId, Vec<Option<[u8; 32]>>)> {
    let start = Instant::now();
    loop {
        let mut out = BTreeMap::new();
        let mut ready = true;
        'groups: for g in groups() {
            let mut ids = BTreeSet::new();
            let mut keys = Vec::new();
            for m in members {
                match m.last(&g) {
                    Some((v, key)) if v.members.len() == n && v.cause == cause && (key.is_some() || !keyed) => {
                        ids.insert(v.id);
                        keys.push(key);
                    }
                    _ => {
                        ready = false;
                        break 'groups;
                    }
                }
            }
            if ids.len() != 1 {
                ready = false;
                break;
            }
            out.insert(g, (ids.into_iter().next().unwrap(), keys));
        }
        if ready {
            return out;
        }
        if start.elapsed() > WAIT {
            let state: Vec<String> = members
                .iter()
                .map(|m| format!("{}: {:?} errors {:?}", m.name, m.last("k0"), m.log.lock().unwrap().errors))
                .collect();
            panic!("timed out waiting for {what}:\n{}", state.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An authority's files in `dir`: the CA, its CRL, and certificates for
/// `daemon-1`..`daemon-n` issued by `issuer`.
fn certify(dir: &Path, issuer: &Issuer, daemons: &[usize], tag: &str) -> BTreeMap<usize, (PathBuf, PathBuf)> {
    let mut rng = rand_core::OsRng;
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let mut out = BTreeMap::new();
    for &d in daemons {
        let issued =
            issuer.issue(&MemberId::new(format!("daemon-{d}")).unwrap(), now - day, now + day, &mut rng).unwrap();
        let cert = dir.join(format!("{tag}-daemon-{d}.crt"));
        let key = dir.join(format!("{tag}-daemon-{d}.key"));
        std::fs::write(&cert, &issued.cert_pem).unwrap();
        std::fs::write(&key, issued.key_pem.as_bytes()).unwrap();
        out.insert(d, (cert, key));
    }
    out
}

fn authority(dir: &Path, name: &str) -> (Issuer, PathBuf, PathBuf) {
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let (issuer, _key) = Issuer::create(name, now - day, now + day, &mut rand_core::OsRng).unwrap();
    let ca = dir.join(format!("{name}.crt"));
    let crl = dir.join(format!("{name}.crl"));
    std::fs::write(&ca, issuer.ca_pem()).unwrap();
    std::fs::write(&crl, issuer.crl(1, &[], now, now + day).unwrap()).unwrap();
    (issuer, ca, crl)
}

/// The daemon arguments of node `i`: its certificate from `certs`, checked
/// against `ca` and `crl`.
fn daemon_args(certs: &BTreeMap<usize, (PathBuf, PathBuf)>, ca: &Path, crl: &Path, i: usize) -> Vec<String> {
    let (cert, key) = &certs[&i];
    [("--daemon-cert", cert.as_path()), ("--daemon-key", key), ("--daemon-ca", ca), ("--daemon-crl", crl)]
        .into_iter()
        .flat_map(|(flag, path)| [flag.to_owned(), path.display().to_string()])
        .collect()
}

async fn start(daemon_args: impl Fn(usize) -> Vec<String> + Send + 'static) -> NetnsCluster {
    let bin = Path::new(env!("CARGO_BIN_EXE_conclave")).to_owned();
    tokio::task::spawn_blocking(move || {
        NetnsCluster::start_with(3, &bin, "conclave-keyed", Duration::from_secs(30), &daemon_args)
            .unwrap_or_else(|e| panic!("cannot start the cluster: {e:#}"))
    })
    .await
    .unwrap()
}

async fn join_all(cluster: &NetnsCluster) -> Vec<Member> {
    let mut members = Vec::new();
    for (i, node) in cluster.nodes.iter().enumerate() {
        members.push(Member::connect(&node.socket, &format!("n{}", i + 1)).await);
    }
    for m in &members {
        for g in groups() {
            m.tx.join_mode(&g, mode(&g)).await.expect("join");
        }
    }
    members
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, network namespaces and corosync: run by .ci/run's cluster step"]
async fn certified_daemons_key_every_group_and_rekey_them_on_a_partition_and_a_merge() {
    let begin = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (issuer, ca, crl) = authority(dir.path(), "authority");
    let certs = certify(dir.path(), &issuer, &[1, 2, 3], "good");
    let cluster = start(move |i| daemon_args(&certs, &ca, &crl, i)).await;
    let members = join_all(&cluster).await;
    let all: Vec<&Member> = members.iter().collect();
    let joined = settle(&all, 3, Cause::Join, true, "every keyed group's view of all three, keyed").await;
    for (g, (_, keys)) in &joined {
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "members of {g}'s view got different keys");
    }
    let distinct: BTreeSet<_> = joined.values().map(|(_, k)| k[0]).collect();
    assert_eq!(distinct.len(), GROUPS, "two groups' views share a key");
    eprintln!("keyed after {:?}", begin.elapsed());

    cluster.cut(2).unwrap();
    let big = settle(&all[..2], 2, Cause::Network, true, "nodes 1-2's keyed network views").await;
    let small = settle(&all[2..], 1, Cause::Network, true, "node 3's keyed network views").await;
    for g in groups() {
        let (b, s, j) = (&big[&g].1, &small[&g].1, &joined[&g].1);
        assert_eq!(b[0], b[1], "nodes 1 and 2 hold different keys for {g}");
        assert_ne!(b[0], s[0], "the two sides of the partition share {g}'s key");
        assert_ne!(b[0], j[0], "{g}'s key did not change in the partition");
        assert_ne!(s[0], j[0], "{g}'s key did not change on node 3");
    }
    eprintln!("partitioned after {:?}", begin.elapsed());

    cluster.heal(2).unwrap();
    let merged = settle(&all, 3, Cause::Network, true, "the merged keyed views").await;
    for g in groups() {
        let m = &merged[&g].1;
        assert!(m.windows(2).all(|w| w[0] == w[1]), "members of {g}'s merged view got different keys");
        assert!(m[0] != big[&g].1[0] && m[0] != small[&g].1[0], "{g}'s merged key is an old one");
    }
    eprintln!("merged after {:?}", begin.elapsed());

    // Optimized EVS: n1 sends, after the merge, a message sealed under its
    // side's partition key. Nodes 1 and 2 held that view's key: they
    // re-encrypt it under the merged view's; node 3 never had it: a notice.
    let g = format!("k{}", GROUPS - 1);
    let (big_view, big_keys) = &big[&g];
    let old_key = ViewKey::new(big_keys[0].unwrap());
    let group = GroupName::new(g.as_str()).unwrap();
    let sealed = evs::seal(&old_key, &group, *big_view, &Writer::Member(MemberId::new("n1").unwrap()), 0, 1, b"late");
    members[0].tx.multicast(&g, Service::Agreed, Bytes::from(sealed)).await.unwrap();
    let (merged_view, merged_keys) = &merged[&g];
    for (i, m) in members.iter().enumerate() {
        let (view, payload) = until_message(m, &g).await;
        assert_eq!(view, *merged_view, "{}: delivered in the merged view", m.name);
        let env = Envelope::decode(&payload).unwrap();
        if i < 2 {
            let key = ViewKey::new(merged_keys[i].unwrap());
            assert!(
                matches!(&env, Envelope::Sealed { key_view, writer: Writer::Daemon(_), .. } if key_view == merged_view)
            );
            assert_eq!(evs::open(&key, &group, &env).unwrap().as_slice(), b"late", "{}", m.name);
        } else {
            let notice = Envelope::Notice {
                delivered_in: *merged_view,
                reason: NoticeReason::KeyGone,
                key_view: *big_view,
                seq: 0,
                messages: 1,
            };
            assert_eq!(env, notice, "{}", m.name);
        }
    }
    for m in &members {
        assert!(m.log.lock().unwrap().errors.is_empty(), "{}: {:?}", m.name, m.log.lock().unwrap().errors);
    }
    drop(cluster);
}

/// A cluster whose node 3 another authority certified: nodes 1 and 2 admit
/// each other only, node 3 only itself.
async fn with_a_rogue_node(dir: &Path, extra: &'static [&'static str]) -> NetnsCluster {
    let (issuer, ca, crl) = authority(dir, "authority");
    let (rogue, rogue_ca, rogue_crl) = authority(dir, "rogue");
    let mut certs = certify(dir, &issuer, &[1, 2], "good");
    certs.extend(certify(dir, &rogue, &[3], "rogue"));
    // Node 3 trusts its own authority as well as it can: it checks the
    // others against the rogue one, so it admits only itself; nodes 1 and 2
    // check against the real one and admit each other only.
    start(move |i| {
        let (ca, crl) = if i == 3 { (&rogue_ca, &rogue_crl) } else { (&ca, &crl) };
        let mut args = daemon_args(&certs, ca, crl, i);
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    })
    .await
}

fn said_why_daemon_3_is_out(cluster: &NetnsCluster) {
    for node in &cluster.nodes[..2] {
        let log = std::fs::read_to_string(&node.daemon_log).unwrap();
        assert!(
            log.contains("not admitted to the daemons' key agreement daemon=3"),
            "a certified daemon did not say why it kept daemon 3 out:\n{log}"
        );
    }
}

/// With the sealed backbone (the default), a daemon the others do not admit
/// can neither read their clients' operations nor get its own to them: its
/// client never appears in the certified daemons' views, and it sees none of
/// theirs, while their clients share every group's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, network namespaces and corosync: run by .ci/run's cluster step"]
async fn a_daemon_another_authority_certified_is_kept_out_of_the_sealed_backbone() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = with_a_rogue_node(dir.path(), &[]).await;
    let members = join_all(&cluster).await;
    let all: Vec<&Member> = members.iter().collect();
    let keyed = settle(&all[..2], 2, Cause::Join, true, "nodes 1-2's clients, between them, keyed").await;
    for g in groups() {
        assert_eq!(keyed[&g].1[0], keyed[&g].1[1], "nodes 1 and 2 hold different keys for {g}");
    }
    said_why_daemon_3_is_out(&cluster);
    let alone = settle(&all[2..], 1, Cause::Join, false, "node 3's client alone in every group").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for g in groups() {
        let view = members[0].last(&g).unwrap().0;
        assert!(view.members.iter().all(|m| m.id.as_str() != "n3"), "n3 reached the certified daemons' {g}");
        let view = members[2].last(&g).unwrap().0;
        assert_eq!(view.id, alone[&g].0, "node 3's client saw more of {g}: {view:?}");
    }
}

/// With the backbone unsealed (`--plain-backbone`), daemon 3's client is in
/// every group's views, but the key the certified daemons share never
/// reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, network namespaces and corosync: run by .ci/run's cluster step"]
async fn a_daemon_another_authority_certified_is_kept_out_of_the_daemons_key() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = with_a_rogue_node(dir.path(), &["--plain-backbone"]).await;
    let members = join_all(&cluster).await;
    let all: Vec<&Member> = members.iter().collect();
    let views = settle(&all, 3, Cause::Join, false, "every group's view of all three").await;
    // Nodes 1 and 2 agreed without node 3: their clients get the same keys.
    let keyed = settle(&all[..2], 3, Cause::Join, true, "nodes 1-2's clients' keys").await;
    for g in groups() {
        assert_eq!(keyed[&g].0, views[&g].0);
        assert_eq!(keyed[&g].1[0], keyed[&g].1[1], "nodes 1 and 2 hold different keys for {g}");
    }
    said_why_daemon_3_is_out(&cluster);
    // Node 3 admitted only itself, so whatever key it gave its client is
    // not the one the certified daemons share.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n3 = members[2].log.lock().unwrap();
    for g in groups() {
        if let Some(key) = n3.keys.get(&(g.clone(), views[&g].0)) {
            assert_ne!(Some(*key), keyed[&g].1[0], "the uncertified daemon holds the certified daemons' key for {g}");
        }
    }
}

/// Each daemon numbers the changes of the daemon group it sees, and a
/// daemon that restarts numbers them from one again, far behind the
/// others. The daemons still agree their key with it: its new client's
/// keyed groups are keyed, with the keys the others' clients hold. (With
/// the credentials bound to that number, the daemons refused each other's
/// from the restart on, and no keyed group got a view again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, network namespaces and corosync: run by .ci/run's cluster step"]
async fn a_restarted_daemon_takes_part_in_the_daemons_key_again() {
    let dir = tempfile::tempdir().unwrap();
    let (issuer, ca, crl) = authority(dir.path(), "authority");
    let certs = certify(dir.path(), &issuer, &[1, 2, 3], "good");
    let mut cluster = start(move |i| daemon_args(&certs, &ca, &crl, i)).await;
    let members = join_all(&cluster).await;
    let all: Vec<&Member> = members.iter().collect();
    settle(&all, 3, Cause::Join, true, "every keyed group's view of all three, keyed").await;

    let bin = Path::new(env!("CARGO_BIN_EXE_conclave")).to_owned();
    tokio::task::block_in_place(|| cluster.restart_daemon(0, &bin, "conclave-keyed", WAIT))
        .unwrap_or_else(|e| panic!("restarting node 1's daemon: {e:#}"));
    for i in 0..3 {
        tokio::task::block_in_place(|| cluster.wait_log(i, "daemon group: [1, 2, 3]", WAIT)).unwrap();
    }
    let epochs: Vec<String> = cluster.nodes.iter().map(|n| n.daemon_group()).collect();
    eprintln!("after the restart: {epochs:?}");
    // Bounded: the sealed backbone holds a client's operations (its
    // connection's too) until the daemons have their key.
    let again = tokio::time::timeout(WAIT, Member::connect(&cluster.nodes[0].socket, "n1"))
        .await
        .unwrap_or_else(|_| panic!("n1's connection still waits after {WAIT:?}: the daemons have no key"));
    for g in groups() {
        tokio::time::timeout(WAIT, again.tx.join_mode(&g, mode(&g)))
            .await
            .unwrap_or_else(|_| panic!("n1's join of {g} still waits after {WAIT:?}: the daemons have no key"))
            .expect("join");
    }
    let all = [&again, &members[1], &members[2]];
    let keyed = settle(&all, 3, Cause::Join, true, "the restarted daemon's new client's keyed views").await;
    for (g, (_, keys)) in &keyed {
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "members of {g}'s view got different keys");
    }
    for m in all {
        assert!(m.log.lock().unwrap().errors.is_empty(), "{}: {:?}", m.name, m.log.lock().unwrap().errors);
    }
}
