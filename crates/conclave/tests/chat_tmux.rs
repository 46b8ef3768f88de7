//! `conclave chat` as a user sees it: a daemon on a temporary socket and
//! three chat clients in a detached tmux server with fixed-size windows,
//! driven with `tmux send-keys` and read with `tmux capture-pane`: messages,
//! `/who`, input history (Up), Esc not quitting, scrollback (PgUp/PgDn), a
//! quit, and a member that waits for its key while another is frozen.
//! Skipped (with a note) where tmux is not installed.

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{installed, sh_quote, Proc, Tmux};

/// How long one screen may take to show what is expected.
const WAIT: Duration = Duration::from_secs(10);

#[test]
fn three_members_chat_and_one_quits() {
    if !installed("tmux", "-V") {
        eprintln!("note: tmux is not installed; skipping the chat screen test (apt-get install tmux)");
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("conclave.sock");
    let keys = dir.path().join("keys");
    let exe = Path::new(env!("CARGO_BIN_EXE_conclave"));
    let _daemon = Proc(
        Command::new(exe)
            .env_remove("RUST_LOG")
            .arg("daemon")
            .arg("--unix")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(File::create(dir.path().join("daemon.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + WAIT;
    while !socket.exists() {
        assert!(Instant::now() < deadline, "the daemon did not create its socket");
        std::thread::sleep(Duration::from_millis(20));
    }

    let tmux = Tmux::new("chat-test", 100, WAIT);
    let names = ["alice", "bob", "carol"];
    // The pane's shell stays the chat's parent (`; true`): tmux continues a
    // stopped pane process, so only a grandchild can be frozen below.
    let command = |name: &str| {
        format!(
            "env -u RUST_LOG {} chat --create-identity --name {name} --group room --unix {} --keys {} 2>{}; true",
            sh_quote(exe),
            sh_quote(&socket),
            sh_quote(&keys),
            sh_quote(&dir.path().join(format!("{name}.err"))),
        )
    };
    for (i, name) in names.iter().enumerate() {
        tmux.start(name, &command(name));
        // Each member waits to see the group with everyone so far.
        let status = format!("{} members", i + 1);
        tmux.until(name, &[status.as_str()], Some(dir.path()));
    }
    for name in names {
        tmux.until(name, &[" alice", " bob", " carol", "rekey to epoch", "(tgdh)", "3 members"], Some(dir.path()));
    }
    assert!(std::fs::metadata(keys.join("members/alice.crt")).is_ok(), "alice's certificate was issued");
    // Said in one line before the screen started (stderr goes to NAME.err).
    let said = |name: &str| std::fs::read_to_string(dir.path().join(format!("{name}.err"))).unwrap();
    let alice = said("alice");
    assert!(alice.starts_with("conclave: created a new group authority and a certificate for alice"), "{alice}");
    let bob = said("bob");
    assert!(bob.starts_with("conclave: created a certificate for bob") && !bob.contains("authority"), "{bob}");

    for name in names {
        tmux.type_line(name, &format!("hello from {name}"));
    }
    for name in names {
        let want: Vec<String> = names.iter().map(|n| format!("{n}: hello from {n}")).collect();
        let want: Vec<&str> = want.iter().map(String::as_str).collect();
        tmux.until(name, &want, Some(dir.path()));
    }

    tmux.type_line("alice", "/who");
    tmux.until("alice", &["members of #room", "alice, bob, carol"], Some(dir.path()));

    // History: Up brings back the last line, Up again the one before; Esc does not quit.
    tmux.keys("alice", &["Up"]);
    tmux.until("alice", &["> /who"], Some(dir.path()));
    tmux.keys("alice", &["Up"]);
    tmux.until("alice", &["> hello from alice"], Some(dir.path()));
    tmux.keys("alice", &["Escape"]);
    tmux.keys("alice", &["Left", "Left", "Left", "Left", "Left"]);
    tmux.ok(&["send-keys", "-t", "alice", "-l", "dear "]);
    tmux.keys("alice", &["Home"]);
    tmux.ok(&["send-keys", "-t", "alice", "-l", "oh, "]);
    tmux.keys("alice", &["Enter"]);
    tmux.until("bob", &["alice: oh, hello from dear alice"], Some(dir.path()));

    // Scrollback: 40 more lines push the first ones off; PgUp brings them back, PgDn returns.
    for i in 0..40 {
        tmux.type_line("bob", &format!("filler {i:02}"));
    }
    tmux.until("alice", &["bob: filler 39"], Some(dir.path()));
    tmux.until_not("alice", &["hello from carol"], Some(dir.path()));
    for _ in 0..3 {
        tmux.keys("alice", &["PPage"]);
    }
    tmux.until("alice", &["hello from carol", "scrollback"], Some(dir.path()));
    assert!(!tmux.screen("alice").contains("filler 39"), "scrolled back, the newest line is below");
    for _ in 0..5 {
        tmux.keys("alice", &["NPage"]);
    }
    tmux.until("alice", &["bob: filler 39"], Some(dir.path()));
    tmux.until_not("alice", &["scrollback"], Some(dir.path()));

    tmux.type_line("carol", "/quit");
    for name in ["alice", "bob"] {
        tmux.until(name, &["carol left", "2 members"], Some(dir.path()));
    }
    tmux.type_line("bob", "still here");
    tmux.until("alice", &["bob: still here"], Some(dir.path()));

    // Waiting for a key: with bob frozen, dave cannot agree a key until the
    // group gives up on bob's certificate (1 s) and rekeys without him; his
    // screen says so meanwhile, with no fingerprint.
    let bob = tmux.child_pid("bob");
    assert!(Command::new("kill").args(["-STOP", &bob]).status().unwrap().success());
    tmux.start("dave", &command("dave"));
    tmux.until("dave", &["waiting for key"], Some(dir.path()));
    assert!(!tmux.screen("dave").contains("│key "), "no key shown while waiting:\n{}", tmux.screen("dave"));
    tmux.until("alice", &["refused bob"], Some(dir.path()));
    assert!(Command::new("kill").args(["-CONT", &bob]).status().unwrap().success());
    for name in ["alice", "bob", "dave"] {
        tmux.until(name, &[" alice", " bob", " dave", "3 members"], Some(dir.path()));
    }
    tmux.until_not("dave", &["waiting for key"], Some(dir.path()));
    tmux.type_line("dave", "got my key");
    tmux.until("bob", &["dave: got my key"], Some(dir.path()));
    println!("alice's screen at the end:\n{}", tmux.screen("alice"));
    println!("took {:?}", started.elapsed());
}
