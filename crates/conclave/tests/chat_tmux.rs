//! `conclave chat` as a user sees it: a daemon on a temporary socket and
//! three chat clients in a detached tmux server with fixed-size windows,
//! driven with `tmux send-keys` and read with `tmux capture-pane`: messages,
//! `/who`, input history (Up), Esc not quitting, scrollback (PgUp/PgDn), a
//! quit, and a member that waits for its key while another is frozen.
//! Skipped (with a note) where tmux is not installed.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long one screen may take to show what is expected.
const WAIT: Duration = Duration::from_secs(10);

/// A spawned process, killed when the test ends however it ends.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A private tmux server, killed when the test ends however it ends.
struct Tmux {
    socket: String,
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux").args(["-L", &self.socket, "-f", "/dev/null"]).args(args).output().expect("run tmux")
    }

    fn ok(&self, args: &[&str]) {
        let out = self.cmd(args);
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// A detached 100x30 session named `name` running `command`.
    fn start(&self, name: &str, command: &str) {
        self.ok(&["new-session", "-d", "-s", name, "-x", "100", "-y", "30", command]);
    }

    fn screen(&self, name: &str) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", name]).stdout).into_owned()
    }

    fn type_line(&self, name: &str, text: &str) {
        self.ok(&["send-keys", "-t", name, "-l", text]);
        self.ok(&["send-keys", "-t", name, "Enter"]);
    }

    /// Presses keys by tmux's names (Up, PPage, Escape, C-u, ...).
    fn keys(&self, name: &str, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", name];
        args.extend_from_slice(keys);
        self.ok(&args);
    }

    /// The process id of the command that the shell of `name`'s pane runs.
    fn child_pid(&self, name: &str) -> String {
        let out = self.cmd(&["display-message", "-p", "-t", name, "#{pane_pid}"]);
        let shell = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let out = Command::new("pgrep").args(["-P", &shell]).output().expect("run pgrep");
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(!pid.is_empty() && !pid.contains('\n'), "one child of pane {name}'s shell {shell}: {pid:?}");
        pid
    }

    /// Polls the screen of `name` until it shows none of `gone`.
    fn until_not(&self, name: &str, gone: &[&str], dir: &Path) {
        let start = Instant::now();
        loop {
            let screen = self.screen(name);
            if !gone.iter().any(|w| screen.contains(w)) {
                return;
            }
            if start.elapsed() > WAIT {
                let err = std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
                panic!("{name}: timed out waiting for {gone:?} to go; screen:\n{screen}\nstderr:\n{err}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls the screen of `name` until it shows every one of `want`.
    fn until(&self, name: &str, want: &[&str], dir: &Path) {
        let start = Instant::now();
        loop {
            let screen = self.screen(name);
            if want.iter().all(|w| screen.contains(w)) {
                return;
            }
            if start.elapsed() > WAIT {
                let err = std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
                panic!("{name}: timed out waiting for {want:?}; screen:\n{screen}\nstderr:\n{err}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn tmux_installed() -> bool {
    Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success())
}

fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

#[test]
fn three_members_chat_and_one_quits() {
    if !tmux_installed() {
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

    let tmux = Tmux { socket: format!("conclave-chat-test-{}", std::process::id()) };
    let names = ["alice", "bob", "carol"];
    // The pane's shell stays the chat's parent (`; true`): tmux continues a
    // stopped pane process, so only a grandchild can be frozen below.
    let command = |name: &str| {
        format!(
            "env -u RUST_LOG {} chat --name {name} --group room --unix {} --keys {} 2>{}; true",
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
        tmux.until(name, &[status.as_str()], dir.path());
    }
    for name in names {
        tmux.until(name, &[" alice", " bob", " carol", "rekey to epoch", "(tgdh)", "3 members"], dir.path());
    }
    assert!(std::fs::metadata(keys.join("members/alice.crt")).is_ok(), "alice's certificate was issued");

    for name in names {
        tmux.type_line(name, &format!("hello from {name}"));
    }
    for name in names {
        let want: Vec<String> = names.iter().map(|n| format!("{n}: hello from {n}")).collect();
        let want: Vec<&str> = want.iter().map(String::as_str).collect();
        tmux.until(name, &want, dir.path());
    }

    tmux.type_line("alice", "/who");
    tmux.until("alice", &["members of #room", "alice, bob, carol"], dir.path());

    // History: Up brings back the last line, Up again the one before; Esc does not quit.
    tmux.keys("alice", &["Up"]);
    tmux.until("alice", &["> /who"], dir.path());
    tmux.keys("alice", &["Up"]);
    tmux.until("alice", &["> hello from alice"], dir.path());
    tmux.keys("alice", &["Escape"]);
    tmux.keys("alice", &["Left", "Left", "Left", "Left", "Left"]);
    tmux.ok(&["send-keys", "-t", "alice", "-l", "dear "]);
    tmux.keys("alice", &["Home"]);
    tmux.ok(&["send-keys", "-t", "alice", "-l", "oh, "]);
    tmux.keys("alice", &["Enter"]);
    tmux.until("bob", &["alice: oh, hello from dear alice"], dir.path());

    // Scrollback: 40 more lines push the first ones off; PgUp brings them back, PgDn returns.
    for i in 0..40 {
        tmux.type_line("bob", &format!("filler {i:02}"));
    }
    tmux.until("alice", &["bob: filler 39"], dir.path());
    tmux.until_not("alice", &["hello from carol"], dir.path());
    for _ in 0..3 {
        tmux.keys("alice", &["PPage"]);
    }
    tmux.until("alice", &["hello from carol", "scrollback"], dir.path());
    assert!(!tmux.screen("alice").contains("filler 39"), "scrolled back, the newest line is below");
    for _ in 0..5 {
        tmux.keys("alice", &["NPage"]);
    }
    tmux.until("alice", &["bob: filler 39"], dir.path());
    tmux.until_not("alice", &["scrollback"], dir.path());

    tmux.type_line("carol", "/quit");
    for name in ["alice", "bob"] {
        tmux.until(name, &["carol left", "2 members"], dir.path());
    }
    tmux.type_line("bob", "still here");
    tmux.until("alice", &["bob: still here"], dir.path());

    // Waiting for a key: with bob frozen, dave cannot agree a key until the
    // group gives up on bob's certificate (1 s) and rekeys without him; his
    // screen says so meanwhile, with no fingerprint.
    let bob = tmux.child_pid("bob");
    assert!(Command::new("kill").args(["-STOP", &bob]).status().unwrap().success());
    tmux.start("dave", &command("dave"));
    tmux.until("dave", &["waiting for key"], dir.path());
    assert!(!tmux.screen("dave").contains("│key "), "no key shown while waiting:\n{}", tmux.screen("dave"));
    tmux.until("alice", &["refused bob"], dir.path());
    assert!(Command::new("kill").args(["-CONT", &bob]).status().unwrap().success());
    for name in ["alice", "bob", "dave"] {
        tmux.until(name, &[" alice", " bob", " dave", "3 members"], dir.path());
    }
    tmux.until_not("dave", &["waiting for key"], dir.path());
    tmux.type_line("dave", "got my key");
    tmux.until("bob", &["dave: got my key"], dir.path());
    println!("alice's screen at the end:\n{}", tmux.screen("alice"));
    println!("took {:?}", started.elapsed());
}
