//! The C example, `examples/chat_pair.c`, built with the system's C
//! compiler (`$CC`, else `cc`) against the generated header and the cdylib
//! this test was built with, and run twice at once, as alice and bob, on an
//! embedded daemon: each joins the group, sees the other in a secure view,
//! reads the membership, sends one message, receives both, leaves. It also
//! links with the staticlib and the system libraries docs/capi.md names.

use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::cbuild::{build_example, cc, compile, finish, lib_dir};
use common::World;

/// The example links with the staticlib and the system libraries
/// docs/capi.md names, and runs (here: to its usage message).
#[test]
fn c_example_links_statically() {
    let out = tempfile::tempdir().unwrap();
    let exe = out.path().join("chat_pair_static");
    let mut cmd = cc();
    cmd.arg(lib_dir().join("libconclave.a")).args(["-lssl", "-lcrypto", "-lpthread", "-ldl", "-lm", "-o"]).arg(&exe);
    compile(cmd);
    let run = Command::new(&exe).output().unwrap();
    assert_eq!(run.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&run.stderr).contains("usage:"), "{run:?}");
}

/// Runs alice and bob at once with `policy`; returns their outputs.
fn run_pair(policy: &str) -> [String; 2] {
    let w = World::new(&["alice", "bob"]);
    let exe = build_example(w.dir.path());
    let start = |me: &str, peer: &str| {
        Command::new(&exe)
            .arg(&w.socket)
            .arg(me)
            .arg(&w.keys)
            .arg("room")
            .arg(peer)
            .arg(policy)
            // Cargo's LD_LIBRARY_PATH names target/<profile> first, where an
            // older libconclave.so (from `cargo build`) may lie: the rpath
            // to the one built with this test decides instead.
            .env_remove("LD_LIBRARY_PATH")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (alice, bob) = (start("alice", "bob"), start("bob", "alice"));
    let outs = [finish(alice, Duration::from_secs(90)), finish(bob, Duration::from_secs(90))];
    outs.map(|o| {
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "chat_pair failed ({}):\n{stdout}\n{stderr}", o.status);
        stdout
    })
}

fn check(outs: &[String; 2]) {
    for (me, peer, out) in [("alice", "bob", &outs[0]), ("bob", "alice", &outs[1])] {
        let lines: Vec<&str> = out.lines().collect();
        let has = |l: &str| lines.contains(&l);
        assert!(lines.iter().all(|l| l.starts_with(&format!("{me}: "))), "{out}");
        assert!(has(&format!("{me}: joining again: CONCLAVE_ERR_ALREADY_JOINED")), "{out}");
        // Oldest first: whoever joined first.
        assert!(has(&format!("{me}: members: alice bob")) || has(&format!("{me}: members: bob alice")), "{out}");
        assert!(has(&format!("{me}: received from {peer}: hello from {peer}")), "{out}");
        assert!(has(&format!("{me}: received from {me}: hello from {me}")), "{out}");
        assert_eq!(lines.last(), Some(&format!("{me}: left room").as_str()), "{out}");
        assert!(!out.contains("note:"), "nothing was refused or rejected:\n{out}");
    }
}

#[test]
fn c_example_pair_exchanges_messages() {
    let outs = run_pair("tgdh");
    check(&outs);
    assert!(outs[0].contains("alice: secure view of room (tgdh, 2 members)"), "{}", outs[0]);
}

#[test]
fn c_example_pair_with_integrated_keying() {
    // The daemon keys the group (Integrated VS), confirmed by the session.
    check(&run_pair("integrated-vs"));
}

#[test]
fn c_example_pair_with_interval_rekeying() {
    // SEAL's Queue-batch with a short interval: the joiner waits for the
    // next rekey, then both exchange as before.
    let outs = run_pair("queue-batch:500ms");
    check(&outs);
}

/// The C example with a member that is not C: bob is a Rust session set up
/// as `conclave chat` sets up its own (certified, from the same key
/// directory, `Session::connect_certified`), and behaves as chat_pair does.
#[test]
fn c_example_with_a_certified_rust_member() {
    use conclave_secure::trust::{Authority, Identity};
    use conclave_secure::{MemberId, Policy, SecureEvent, Session};
    use std::sync::Arc;

    let w = World::new(&["alice", "bob"]);
    let exe = build_example(w.dir.path());
    let read = |p: &str| std::fs::read_to_string(w.keys.join(p)).unwrap();
    let identity = Identity::from_pem(&read("members/bob.crt"), &read("members/bob.key")).unwrap();
    let authority = Arc::new(Authority::from_pem(&read("authority.crt"), None).unwrap());
    let socket = w.socket.clone();
    let bob = w.rt.spawn(async move {
        let client = conclave_gcs_net::Client::connect_unix(&socket, "bob").await.unwrap();
        let mut s = Session::connect_certified(client, MemberId::new("bob").unwrap(), identity, authority);
        s.join("room", Policy::default()).unwrap();
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let ev = tokio::time::timeout_at(deadline, s.recv()).await.expect("bob timed out").unwrap();
            match ev {
                SecureEvent::View(v) if v.members.iter().any(|m| m.as_str() == "alice") => {
                    s.send("room", b"hello from bob").unwrap();
                }
                SecureEvent::Message { sender, data, .. } if sender.as_str() == "alice" => {
                    got.push(String::from_utf8(data.to_vec()).unwrap());
                    s.leave("room").unwrap();
                }
                SecureEvent::Left { .. } => return got,
                _ => {}
            }
        }
    });
    let alice = Command::new(&exe)
        .arg(&w.socket)
        .args(["alice"])
        .arg(&w.keys)
        .args(["room", "bob", "tgdh"])
        .env_remove("LD_LIBRARY_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = finish(alice, Duration::from_secs(90));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "chat_pair failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.lines().any(|l| l == "alice: received from bob: hello from bob"), "{stdout}");
    assert!(stdout.lines().any(|l| l == "alice: received from alice: hello from alice"), "{stdout}");
    assert_eq!(w.rt.block_on(bob).unwrap(), ["hello from alice"]);
}
