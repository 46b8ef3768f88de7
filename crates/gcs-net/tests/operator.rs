//! The operator's side of the daemon: the status report (what it shows, and
//! whom it is refused to) and the group access rules of its configuration
//! (create, join and send; by bound member name, by pattern and by Unix user;
//! refusals reach the client as AccessDenied and the connection goes on).
//!
//! The tests run as one Unix user, so "another user" is a uid no test
//! process has (4242); names are bound to the test's user through
//! `uncertified_names` (the daemon's `[unix_names]`). Certified names over
//! TLS are in tests/tls.rs.

use std::collections::BTreeMap;
use std::time::Duration;

use conclave_gcs::wire::{self, Request, Status};
use conclave_gcs::{GroupName, MemberId};
use conclave_gcs_net::client::{status_tcp, status_unix};
use conclave_gcs_net::{
    AccessPolicy, Client, ClientError, ErrorCode, Event, GroupRule, Service, UncertifiedNames, Who,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::{start, within, Setup};

impl Setup {
    async fn status(&self) -> Status {
        within("status", status_unix(self.daemon.unix_path().unwrap())).await.unwrap()
    }
}

/// Receives until a view of `group` with `n` members arrives; fails on an error.
async fn until_view(c: &mut Client, group: &str, n: usize) {
    within("view", async {
        loop {
            match c.recv().await.unwrap() {
                Event::View { group: g, view } if g.as_str() == group && view.members.len() == n => return,
                Event::Error { code, text } => panic!("error {code:?} waiting for a view of {group}: {text}"),
                _ => {}
            }
        }
    })
    .await
}

/// The next error the client gets, skipping views and messages.
async fn next_error(c: &mut Client) -> (conclave_gcs_net::ErrorCode, String) {
    within("error", async {
        loop {
            if let Event::Error { code, text } = c.recv().await.unwrap() {
                return (code, text);
            }
        }
    })
    .await
}

/// The next message the client gets in `group`, skipping views; fails on an error.
async fn next_message(c: &mut Client, group: &str) -> (String, Vec<u8>) {
    within("message", async {
        loop {
            match c.recv().await.unwrap() {
                Event::Message { group: g, sender, payload, .. } if g.as_str() == group => {
                    return (sender.to_string(), payload.to_vec())
                }
                Event::Error { code, text } => panic!("error {code:?} waiting for a message in {group}: {text}"),
                _ => {}
            }
        }
    })
    .await
}

async fn until_left(c: &mut Client) {
    within("left", async { while !matches!(c.recv().await.unwrap(), Event::Left { .. }) {} }).await
}

fn count(s: &Status, name: &str) -> u64 {
    s.counters.iter().find(|(k, _)| k == name).unwrap_or_else(|| panic!("no counter {name}")).1
}

fn limit(s: &Status, name: &str) -> u64 {
    s.limits.iter().find(|(k, _)| k == name).unwrap_or_else(|| panic!("no limit {name}")).1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_shows_groups_members_connections_limits_and_the_daemon_group() {
    let s = start(|c| {
        c.queue_depth = 77;
        c.max_connections_per_peer = 55;
    })
    .await;
    let empty = s.status().await;
    assert!(empty.groups.is_empty(), "{empty:?}");
    assert_eq!(count(&empty, "clients"), 0);

    let mut alice = s.unix("alice").await;
    let mut bob = s.unix("bob").await;
    alice.join_open("chat").await.unwrap();
    until_view(&mut alice, "chat", 1).await;
    bob.join("chat").await.unwrap();
    until_view(&mut bob, "chat", 2).await;
    alice.join_keyed("vault").await.unwrap();
    until_view(&mut alice, "vault", 1).await;
    tokio::time::sleep(Duration::from_millis(20)).await;

    let st = s.status().await;
    assert!(!st.truncated);
    assert_eq!(st.backbone, "standalone");
    assert_eq!(st.daemon, 0);
    assert_eq!(st.configuration.as_ref().map(|(_, d)| d.clone()), Some(vec![0]));
    assert!(st.uptime_ms >= 20, "uptime {}", st.uptime_ms);
    let groups: Vec<(&str, bool, bool, Vec<&str>)> = st
        .groups
        .iter()
        .map(|g| {
            (
                g.name.as_str(),
                g.open,
                g.mode == conclave_gcs::core::GroupMode::Keyed,
                g.members.iter().map(|m| m.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(groups, [("chat", true, false, vec!["alice", "bob"]), ("vault", false, true, vec!["alice"])]);
    // alice, bob, and the status connection itself (no Hello).
    let conns: Vec<(Option<&str>, u32)> =
        st.connections.iter().map(|c| (c.name.as_ref().map(|n| n.as_str()), c.groups)).collect();
    assert_eq!(conns, [(Some("alice"), 2), (Some("bob"), 1), (None, 0)]);
    assert!(st.connections.iter().all(|c| c.peer.starts_with("unix: uid ")), "{:?}", st.connections);
    assert_eq!(count(&st, "connections"), 3);
    assert_eq!(count(&st, "clients"), 2);
    assert_eq!(count(&st, "groups"), 2);
    assert_eq!(count(&st, "memberships"), 3);
    assert_eq!(limit(&st, "queue_depth"), 77);
    assert_eq!(limit(&st, "max_connections_per_peer"), 55);
    assert_eq!(limit(&st, "max_message_size"), wire::DEFAULT_MAX_PAYLOAD as u64);
    assert!(st.policy[0].starts_with("no access rules"), "{:?}", st.policy);

    // bob leaves: the next status says so.
    drop(bob);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let st = s.status().await;
    assert_eq!(st.groups[0].members.iter().map(|m| m.as_str()).collect::<Vec<_>>(), ["alice"]);
    assert_eq!(count(&st, "clients"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_is_refused_to_clients_that_are_not_operators_and_shows_them_nothing() {
    let s = start(|_| {}).await;
    let mut alice = s.unix("alice").await;
    alice.join("secret-plans").await.unwrap();
    until_view(&mut alice, "secret-plans", 1).await;

    // Over TCP the daemon knows no one: refused, with a reason and nothing else.
    let tcp = s.daemon.tcp_addr().unwrap();
    match within("status over tcp", status_tcp(tcp)).await {
        Err(ClientError::Refused { code, text }) => {
            assert_eq!(code, wire::ACCESS_DENIED);
            assert!(text.contains("may not read this daemon's status"), "{text}");
            assert!(!text.contains("  "), "{text}");
            assert!(!text.contains("secret") && !text.contains("alice"), "{text}");
        }
        r => panic!("a TCP client read the status: {r:?}"),
    }
    // The raw answer is that one error frame, then the connection closes.
    let mut raw = tokio::net::TcpStream::connect(tcp).await.unwrap();
    let mut frame = bytes::BytesMut::new();
    wire::encode_request(&Request::Status, &mut frame);
    raw.write_all(&frame).await.unwrap();
    let mut all = Vec::new();
    within("close", raw.read_to_end(&mut all)).await.unwrap();
    let reply = wire::decode_status_reply(bytes::Bytes::copy_from_slice(&all[4..])).unwrap();
    assert!(matches!(reply, wire::StatusReply::Error { code, .. } if code == wire::ACCESS_DENIED), "{reply:?}");
    assert_eq!(all.len(), 4 + u32::from_be_bytes(all[..4].try_into().unwrap()) as usize, "one frame only");

    // A Status after Hello is refused, not fatal: the client library has no
    // call for it, so the frames go by hand.
    let mut sock = tokio::net::UnixStream::connect(s.daemon.unix_path().unwrap()).await.unwrap();
    let mut out = bytes::BytesMut::new();
    let carol = MemberId::new("carol").unwrap();
    wire::encode_request(&Request::Hello { name: carol.clone(), view_changes: false }, &mut out);
    wire::encode_request(&Request::Status, &mut out);
    wire::encode_request(
        &Request::Join {
            group: GroupName::new("g").unwrap(),
            open: false,
            mode: conclave_gcs::core::GroupMode::Members,
        },
        &mut out,
    );
    sock.write_all(&out).await.unwrap();
    let mut frames = wire::FrameReader::new(1 << 20);
    let mut buf = bytes::BytesMut::new();
    let mut got = Vec::new();
    within("three answers", async {
        while got.len() < 3 {
            while let Some(f) = frames.next_frame(&mut buf).unwrap() {
                got.push(wire::decode_delivery(f).unwrap());
            }
            if got.len() < 3 {
                assert!(sock.read_buf(&mut buf).await.unwrap() > 0, "closed after {got:?}");
            }
        }
    })
    .await;
    assert_eq!(got[0], Event::Welcome { member: carol });
    assert!(
        matches!(&got[1], Event::Error { code: ErrorCode::AlreadyConnected, text } if text.contains("of its own")),
        "{got:?}"
    );
    assert!(matches!(&got[2], Event::View { group, .. } if group.as_str() == "g"), "{got:?}");

    // The daemon's own user (these tests' user) may; so may anyone the
    // configuration names, here everyone, even over TCP.
    let names: Vec<String> = s.status().await.groups.iter().map(|g| g.name.to_string()).collect();
    assert_eq!(names, ["g", "secret-plans"]);
    let open = start(|c| c.operators = vec![Who::Anyone]).await;
    let st = within("status", status_tcp(open.daemon.tcp_addr().unwrap())).await.unwrap();
    assert!(st.connections.iter().any(|c| c.peer.starts_with("tcp: 127.0.0.1:")), "{:?}", st.connections);
    // Operators named by Unix user: another user's id lets no one of ours in over TCP.
    let other = start(|c| c.operators = vec![Who::Uid(4242)]).await;
    assert!(matches!(
        within("status", status_tcp(other.daemon.tcp_addr().unwrap())).await,
        Err(ClientError::Refused { .. })
    ));
}

fn who(list: &[&str]) -> Vec<Who> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

/// A daemon where the test's Unix user may take the names alice, bob,
/// carol and bot-* (so they are bound, and name rules see them), under
/// `rules`.
async fn with_rules(rules: Vec<GroupRule>) -> Setup {
    let uid = rustix_uid();
    start(move |c| {
        c.uncertified_names = UncertifiedNames::ByUid(BTreeMap::from([(
            uid,
            vec!["alice".into(), "bob".into(), "carol".into(), "bot-*".into()],
        )]));
        c.access = Some(AccessPolicy { rules });
    })
    .await
}

/// This process's Unix user.
fn rustix_uid() -> u32 {
    std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap()
}

fn denied(e: &(conclave_gcs_net::ErrorCode, String), says: &str) {
    assert_eq!(e.0, wire::ACCESS_DENIED, "{e:?}");
    assert!(e.1.contains(says), "{:?} does not say {says:?}", e.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_join_and_send_follow_the_rules_by_name_and_pattern() {
    let s =
        with_rules(vec![
            GroupRule::new("team", who(&["alice"]), who(&["bot-*", "carol"]), who(&["alice", "carol"])).unwrap()
        ])
        .await;
    let mut alice = s.unix("alice").await;
    let mut bob = s.unix("bob").await;
    let mut bot = s.unix("bot-7").await;
    let mut carol = s.unix("carol").await;

    // Create: bob may not (and learns nothing of whether the group exists); alice may.
    bob.join("team").await.unwrap();
    denied(&next_error(&mut bob).await, "you may not join group team");
    bot.join("team").await.unwrap();
    denied(&next_error(&mut bot).await, "may join group team when it exists, but not create it");
    alice.join("team").await.unwrap();
    until_view(&mut alice, "team", 1).await;

    // Join: by pattern (bot-*) and by name (carol); bob still may not.
    bot.join("team").await.unwrap();
    until_view(&mut bot, "team", 2).await;
    carol.join("team").await.unwrap();
    until_view(&mut carol, "team", 3).await;
    bob.join("team").await.unwrap();
    denied(&next_error(&mut bob).await, "you may not join group team");

    // Send: alice and carol may, bot-7 (a member) may not.
    bot.multicast("team", Service::Agreed, &b"from bot"[..]).await.unwrap();
    denied(&next_error(&mut bot).await, "you may not send to group team");
    bot.unicast("team", "alice", &b"psst"[..]).await.unwrap();
    denied(&next_error(&mut bot).await, "you may not send to group team");
    carol.multicast("team", Service::Agreed, &b"from carol"[..]).await.unwrap();
    assert_eq!(next_message(&mut alice, "team").await, ("carol".to_owned(), b"from carol".to_vec()));
    // The refused connections go on: bot still hears the group.
    assert_eq!(next_message(&mut bot, "team").await, ("carol".to_owned(), b"from carol".to_vec()));

    // A group no rule names is closed to everyone, its creator's name notwithstanding.
    alice.join("elsewhere").await.unwrap();
    denied(&next_error(&mut alice).await, "which name no such group");

    // The status shows the rules in force.
    let st = s.status().await;
    assert_eq!(
        st.policy[..2],
        [
            "groups team: create: alice; join: bot-*, carol; send: alice, carol".to_owned(),
            "any other group: no one may create, join or send to it".to_owned()
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_by_unix_user_match_the_socket_peer_and_unbound_names_match_nothing() {
    let uid = rustix_uid();
    let me = format!("uid:{uid}");
    let s = with_rules(vec![
        GroupRule::new("local", who(&[&me]), who(&[&me]), who(&["uid:4242"])).unwrap(),
        GroupRule::new("open-*", who(&["*"]), who(&["*"]), who(&["*"])).unwrap(),
    ])
    .await;
    let mut alice = s.unix("alice").await;
    alice.join("local").await.unwrap();
    until_view(&mut alice, "local", 1).await;
    // Only another user may send there.
    alice.multicast("local", Service::Fifo, &b"x"[..]).await.unwrap();
    denied(&next_error(&mut alice).await, &format!("does not let alice (Unix user {uid})"));

    // Over TCP the daemon knows no user and binds no name: `*` lets it in, nothing else does.
    let plain = start(|c| {
        c.access = Some(AccessPolicy {
            rules: vec![
                GroupRule::new("local", who(&[&me]), who(&[&me]), who(&[&me])).unwrap(),
                GroupRule::new("named", who(&["tcp-user"]), who(&["tcp-user"]), who(&["tcp-user"])).unwrap(),
                GroupRule::new("open-*", who(&["*"]), who(&["*"]), who(&["*"])).unwrap(),
            ],
        })
    })
    .await;
    let mut t = within("tcp", Client::connect_tcp(plain.daemon.tcp_addr().unwrap(), "tcp-user")).await.unwrap();
    t.join("local").await.unwrap();
    denied(&next_error(&mut t).await, "you may not join group local");
    // A name is first come, first served here: a name rule does not match it.
    t.join("named").await.unwrap();
    denied(&next_error(&mut t).await, "you may not join group named");
    t.join("open-1").await.unwrap();
    until_view(&mut t, "open-1", 1).await;
    t.multicast("open-1", Service::Agreed, &b"hi"[..]).await.unwrap();
    assert_eq!(next_message(&mut t, "open-1").await, ("tcp-user".to_owned(), b"hi".to_vec()));
    // On the Unix socket of the same daemon, the user rule matches.
    let mut u = within("unix", Client::connect_unix(plain.daemon.unix_path().unwrap(), "someone")).await.unwrap();
    u.join("local").await.unwrap();
    until_view(&mut u, "local", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_that_may_not_create_cannot_recreate_an_emptied_group() {
    let s = with_rules(vec![GroupRule::new("room", who(&["alice"]), who(&["bob"]), who(&["*"])).unwrap()]).await;
    let mut alice = s.unix("alice").await;
    let mut bob = s.unix("bob").await;
    alice.join("room").await.unwrap();
    until_view(&mut alice, "room", 1).await;
    bob.join("room").await.unwrap();
    until_view(&mut bob, "room", 2).await;
    bob.leave("room").await.unwrap();
    until_left(&mut bob).await;
    alice.leave("room").await.unwrap();
    until_left(&mut alice).await;
    // The group is gone: bob may join it, not create it, however often he tries.
    for _ in 0..20 {
        bob.join("room").await.unwrap();
        match within("answer", bob.recv()).await.unwrap() {
            Event::Error { code, text } if code == wire::ACCESS_DENIED => {
                assert!(text.contains("not create it"), "{text}");
            }
            other => panic!("bob's join of the empty group was not refused: {other:?}"),
        }
    }
    let st = s.status().await;
    assert!(st.groups.is_empty(), "{:?}", st.groups);
}

/// Asks the daemon on `$CONCLAVE_TEST_SOCKET` for its status and prints
/// the outcome; run as another Unix user by
/// `another_unix_user_reads_the_status_only_if_listed_as_an_operator`.
#[test]
#[ignore = "run by another_unix_user_reads_the_status_only_if_listed_as_an_operator"]
fn status_child() {
    let path = std::env::var_os("CONCLAVE_TEST_SOCKET").expect("CONCLAVE_TEST_SOCKET");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    match rt.block_on(status_unix(path)) {
        Ok(st) => println!("STATUS groups={}", st.groups.len()),
        Err(ClientError::Refused { code, text }) => println!("REFUSED {} {text}", code.to_u16()),
        Err(e) => println!("FAILED {e}"),
    }
}

/// On the Unix socket, a process of another Unix user (nobody, 65534) is
/// refused the status, unless the configuration lists its uid among the
/// operators. Needs root, to run the child as nobody; skipped otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_unix_user_reads_the_status_only_if_listed_as_an_operator() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if rustix_uid() != 0 {
        eprintln!("skipped: running a process as another user needs root");
        return;
    }
    for (operators, expect) in [(vec![], "REFUSED 19 "), (vec![Who::Uid(65534)], "STATUS groups=1")] {
        let s = start(|c| c.operators = operators).await;
        let mut alice = s.unix("alice").await;
        alice.join("g").await.unwrap();
        until_view(&mut alice, "g", 1).await;
        let path = s.daemon.unix_path().unwrap().to_owned();
        // Let nobody reach the socket: the test's own directory and socket are private.
        std::fs::set_permissions(path.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let out = within(
            "child",
            tokio::task::spawn_blocking(move || {
                std::process::Command::new(std::env::current_exe().unwrap())
                    .args(["--exact", "status_child", "--ignored", "--nocapture", "--test-threads", "1"])
                    .env("CONCLAVE_TEST_SOCKET", &path)
                    .uid(65534)
                    .gid(65534)
                    .output()
                    .unwrap()
            }),
        )
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().find_map(|l| {
            l.split_once("STATUS ")
                .map(|(_, r)| format!("STATUS {r}"))
                .or_else(|| l.split_once("REFUSED ").map(|(_, r)| format!("REFUSED {r}")))
        });
        let line = line.unwrap_or_else(|| {
            panic!("the child said nothing useful: {stdout}\n{}", String::from_utf8_lossy(&out.stderr))
        });
        assert!(line.starts_with(expect), "expected {expect:?}, the child said {line:?}");
        if expect.starts_with("REFUSED") {
            assert!(!line.contains(" g ") && !line.contains("alice"), "{line}");
        }
    }
}
