//! The README's commands, run as a new user would type them into a shell:
//! each test reads its block out of README.md (so the README cannot drift
//! from what works), runs it with `sh -e` in a fresh home directory (`HOME`,
//! a private `XDG_RUNTIME_DIR`, the `conclave` just built first on `PATH`),
//! and checks what the user would look at. Only what a person does between
//! lines is added: waiting for a daemon started with `&` to create its socket
//! before the next line, and stopping it at the end.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{installed, sh_quote, Tmux};

/// How long one block may run (`flood` sends 24,000 messages).
const LIMIT: Duration = Duration::from_secs(120);

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap()
}

/// The `fence` code block that follows the line `heading` (the first one
/// after it), as lines.
fn block_after(readme: &str, heading: &str, fence: &str) -> Vec<String> {
    let after = readme.split(heading).nth(1).unwrap_or_else(|| panic!("README has no {heading:?}"));
    let open = format!("```{fence}\n");
    let body = after.split(open.as_str()).nth(1).unwrap_or_else(|| panic!("no ```{fence} block after {heading:?}"));
    body.split("```").next().unwrap().lines().map(str::to_owned).collect()
}

/// The README's `sh` code block that contains `needle`, as lines.
fn sh_block_with(readme: &str, needle: &str) -> Vec<String> {
    readme
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains(needle))
        .unwrap_or_else(|| panic!("README has no sh block with {needle:?}"))
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A fresh home for one user: `HOME`, a private `XDG_RUNTIME_DIR` (where
/// the daemon's default socket goes) and `PATH` with this build's binary.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for sub in ["home", "run"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
            std::fs::set_permissions(dir.path().join(sub), std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        Home { dir }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn runtime(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    fn socket(&self) -> PathBuf {
        self.runtime().join("conclave.sock")
    }

    fn env(&self, cmd: &mut Command) {
        let bin = Path::new(env!("CARGO_BIN_EXE_conclave")).parent().unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        cmd.env("PATH", path)
            .env("HOME", self.home())
            .env("XDG_RUNTIME_DIR", self.runtime())
            .env_remove("XDG_STATE_HOME")
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1");
    }

    /// Runs `lines` as a shell script (stopping at the first failing line),
    /// with the daemon's log in `daemon.log`. A line that starts `conclave
    /// daemon` in the background is followed by a wait for its socket, and
    /// the daemon is stopped when the script ends, however it ends.
    fn script(&self, lines: &[String]) -> Output {
        let mut script = String::from("trap 'test -n \"$daemon\" && kill $daemon' EXIT\ndaemon=\n");
        let mut background = Vec::new();
        for line in lines {
            let code = line.split(" # ").next().unwrap().trim_end();
            if code.starts_with("conclave daemon") && code.ends_with('&') {
                script.push_str(&format!("{} 2>daemon.log\n", code.trim_end_matches('&').trim_end()));
                script.truncate(script.len() - 1);
                script.push_str(" &\ndaemon=$!\n");
                script.push_str(&format!(
                    "n=0; until [ -S {} ]; do n=$((n+1)); [ $n -lt 200 ] || exit 9; sleep 0.05; done\n",
                    sh_quote(&self.socket())
                ));
            } else if code.ends_with('&') {
                script.push_str(code);
                script.push_str("\npids=\"$pids $!\"\n");
                background.push(code.to_owned());
            } else {
                script.push_str(code);
                script.push('\n');
            }
        }
        script.push_str("for pid in $pids; do wait $pid || exit 1; done\n");
        let mut cmd = Command::new("sh");
        cmd.arg("-ec").arg(&script).current_dir(self.dir.path()).stdin(Stdio::null());
        self.env(&mut cmd);
        let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let pid = child.id();
        // A script that hangs is killed (with its process group) after LIMIT.
        let watchdog = std::thread::spawn(move || {
            let started = Instant::now();
            while started.elapsed() < LIMIT {
                std::thread::sleep(Duration::from_millis(100));
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    return;
                }
            }
            let _ = Command::new("kill").arg(pid.to_string()).status();
        });
        let out = child.wait_with_output().unwrap();
        let _ = watchdog.join();
        out
    }

    fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// "Using the daemon by hand": the daemon on its default socket, the two
/// clients (each hears both messages), and `flood`'s table for the three
/// sizes; then `conclave status` (its own section) against the same daemon
/// shows the lines the README's sample shows.
#[test]
fn the_daemon_clients_flood_and_status_run_as_written() {
    let readme = readme();
    let mut lines = block_after(&readme, "### Using the daemon by hand", "sh");
    assert!(lines[0].starts_with("conclave daemon &"), "{lines:?}");
    let status_sample = block_after(&readme, "`conclave status` (`--json` for scripts)", "text");
    let status_line = status_sample[0].strip_prefix("$ ").expect("the sample starts with the command").to_owned();
    lines.push(status_line);
    let home = Home::new();
    let out = home.script(&lines);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{lines:#?}\nstdout:\n{stdout}\nstderr:\n{stderr}\ndaemon:\n{}", home.daemon_log());
    for (who, said) in [("alice", "hello"), ("bob", "hi")] {
        let heard = stdout.lines().filter(|l| l.starts_with("[chat v") && l.ends_with(&format!("] {who}: {said}")));
        assert_eq!(heard.count(), 2, "both should hear {who}:\n{stdout}");
    }
    // flood: one row per size, each with a rate.
    for size in ["64", "1024", "65536"] {
        assert!(
            stdout.lines().any(|l| l.split_whitespace().next() == Some(size) && l.contains('.')),
            "no flood row for {size} bytes:\n{stdout}"
        );
    }
    // status: the sample's line heads, in the sample's order.
    let heads: Vec<&str> = status_sample[1..]
        .iter()
        .filter(|l| !l.trim().is_empty() && l.trim() != "...")
        .filter(|l| !l.starts_with(' '))
        .map(|l| l.split([' ', ':']).next().unwrap())
        // "3 connections": a count, which the sample's daemon has other values of.
        .filter(|head| !head.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert!(heads.len() >= 4, "{status_sample:?}");
    let mut rest = stdout.as_str();
    for head in heads {
        let at = rest.find(&format!("\n{head}")).unwrap_or_else(|| panic!("status has no line {head:?}:\n{stdout}"));
        rest = &rest[at + 1..];
    }
}

/// "Keys": the authority, a member, a revocation and the list, in `~`.
#[test]
fn the_keys_commands_run_as_written() {
    let readme = readme();
    let lines = sh_block_with(&readme, "conclave keys authority --dir");
    assert!(lines.iter().any(|l| l.starts_with("conclave keys list")), "{lines:?}");
    let home = Home::new();
    let out = home.script(&lines);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{lines:#?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let dir = home.home().join("conclave-keys");
    for file in ["authority.crt", "authority.key", "authority.crl", "members/alice.crt", "members/alice.key"] {
        assert!(dir.join(file).is_file(), "{file} missing:\n{stdout}\n{stderr}");
    }
    let list: Vec<&str> = stdout.lines().filter(|l| l.contains("alice") || l.contains("mallory")).collect();
    assert!(list.iter().any(|l| l.contains("alice") && !l.contains("revoked")), "{stdout}");
    assert!(list.iter().any(|l| l.contains("mallory") && l.contains("revoked")), "{stdout}");
}

/// Completions and the manual page, as "Using the daemon by hand" names them:
/// bash accepts the completion script, and the page is roff with a title.
#[test]
fn completions_and_man_page_as_written() {
    let readme = readme();
    assert!(readme.contains("`conclave completions bash`") && readme.contains("`conclave man | man -l -`"));
    let home = Home::new();
    let out = home.script(&["conclave completions bash > conclave.bash".into(), "conclave man > conclave.1".into()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bash = home.dir.path().join("conclave.bash");
    let check = Command::new("bash").arg("-n").arg(&bash).output().unwrap();
    assert!(check.status.success(), "bash rejects the completions: {}", text(&check.stderr));
    assert!(std::fs::read_to_string(&bash).unwrap().contains("conclave"));
    let page = std::fs::read_to_string(home.dir.path().join("conclave.1")).unwrap();
    assert!(page.contains(".TH conclave"), "{}", &page[..page.len().min(400)]);
}

/// "Chatter": on a fresh account, the daemon line, then the first chat line
/// (`--create-identity`) brings alice into her room on the chat screen and
/// says what it created before the screen starts; after `/quit`, the
/// second line (without it) finds her identity and joins again. Skipped
/// (with a note) where tmux is not installed.
#[test]
fn chat_starts_as_written() {
    if !installed("tmux", "-V") {
        eprintln!("note: tmux is not installed; skipping the chat start-up walk-through (apt-get install tmux)");
        return;
    }
    let readme = readme();
    let block: Vec<String> = sh_block_with(&readme, "--create-identity")
        .iter()
        .map(|l| l.split(" # ").next().unwrap().trim_end().to_owned())
        .collect();
    assert!(block[0].starts_with("conclave daemon &"), "{block:?}");
    let first = block.iter().find(|l| l.contains("--create-identity")).unwrap().clone();
    // The optional part of the second line, `[--policy tgdh]`, left out.
    let second = block
        .iter()
        .find(|l| l.starts_with("conclave chat") && !l.contains("--create-identity"))
        .unwrap()
        .split(" [")
        .next()
        .unwrap()
        .to_owned();
    let home = Home::new();
    // The daemon, as the block's first line, in the background for the test's length.
    let exe = Path::new(env!("CARGO_BIN_EXE_conclave"));
    let mut daemon = Command::new(exe);
    home.env(&mut daemon);
    let log = std::fs::File::create(home.dir.path().join("daemon.log")).unwrap();
    let mut daemon = common::Proc(daemon.arg("daemon").stdout(Stdio::null()).stderr(log).spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !home.socket().exists() {
        assert!(Instant::now() < deadline, "the daemon did not create {}", home.socket().display());
        assert!(daemon.0.try_wait().unwrap().is_none(), "the daemon exited: {}", home.daemon_log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let tmux = Tmux::new("readme-chat", 100, Duration::from_secs(15));
    let bin = exe.parent().unwrap();
    let shell_line = |line: &str, err: &str| {
        format!(
            "cd {dir} && env -u XDG_STATE_HOME -u RUST_LOG HOME={home} XDG_RUNTIME_DIR={run} PATH={bin}:\"$PATH\" \
             NO_COLOR=1 {line} 2>{err}; sleep 30",
            dir = sh_quote(home.dir.path()),
            home = sh_quote(&home.home()),
            run = sh_quote(&home.runtime()),
            bin = sh_quote(bin),
        )
    };
    tmux.start("first", &shell_line(&first, "first.err"));
    tmux.until("first", &["#room", " alice", "1 member"], Some(home.dir.path()));
    let said = std::fs::read_to_string(home.dir.path().join("first.err")).unwrap();
    assert!(said.contains("created a new group authority and a certificate for alice"), "{said}");
    tmux.type_line("first", "/quit");
    tmux.until_not("first", &["1 member"], Some(home.dir.path()));
    tmux.start("second", &shell_line(&second, "second.err"));
    tmux.until("second", &["#room", " alice", "1 member"], Some(home.dir.path()));
    let said = std::fs::read_to_string(home.dir.path().join("second.err")).unwrap();
    assert!(!said.contains("created"), "the second start creates nothing: {said}");
    tmux.type_line("second", "/quit");
}
