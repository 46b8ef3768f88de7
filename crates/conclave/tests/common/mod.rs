//! What the terminal-driving tests share: processes killed however a test
//! ends, and a private tmux server whose screens are polled.
// Each test binary uses some of these helpers, not all.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// A spawned process, killed when the test ends however it ends.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A private tmux server, killed when the test ends however it ends.
pub struct Tmux {
    socket: String,
    /// Width of every session's window.
    width: u16,
    /// How long one screen may take to show what is expected.
    wait: Duration,
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

impl Tmux {
    /// A server named after `test` and this process, with `width`-column windows.
    pub fn new(test: &str, width: u16, wait: Duration) -> Tmux {
        Tmux { socket: format!("conclave-{test}-{}", std::process::id()), width, wait }
    }

    pub fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux").args(["-L", &self.socket, "-f", "/dev/null"]).args(args).output().expect("run tmux")
    }

    pub fn ok(&self, args: &[&str]) {
        let out = self.cmd(args);
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// A detached session of 30 lines named `name` running `command`.
    pub fn start(&self, name: &str, command: &str) {
        let width = self.width.to_string();
        self.ok(&["new-session", "-d", "-s", name, "-x", &width, "-y", "30", command]);
    }

    pub fn screen(&self, name: &str) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", name]).stdout).into_owned()
    }

    pub fn type_line(&self, name: &str, text: &str) {
        self.ok(&["send-keys", "-t", name, "-l", text]);
        self.ok(&["send-keys", "-t", name, "Enter"]);
    }

    /// Presses keys by tmux's names (Up, PPage, Escape, C-u, ...).
    pub fn keys(&self, name: &str, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", name];
        args.extend_from_slice(keys);
        self.ok(&args);
    }

    /// The process id of the command that the shell of `name`'s pane runs.
    pub fn child_pid(&self, name: &str) -> String {
        let out = self.cmd(&["display-message", "-p", "-t", name, "#{pane_pid}"]);
        let shell = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let out = Command::new("pgrep").args(["-P", &shell]).output().expect("run pgrep");
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(!pid.is_empty() && !pid.contains('\n'), "one child of pane {name}'s shell {shell}: {pid:?}");
        pid
    }

    /// Polls the screen of `name` until it shows every one of `want`; on a
    /// timeout, panics with the screen and `name.err` from `stderr_dir`.
    pub fn until(&self, name: &str, want: &[&str], stderr_dir: Option<&Path>) {
        self.poll(name, stderr_dir, &format!("{want:?}"), |screen| want.iter().all(|w| screen.contains(w)));
    }

    /// Polls the screen of `name` until it shows none of `gone`.
    pub fn until_not(&self, name: &str, gone: &[&str], stderr_dir: Option<&Path>) {
        self.poll(name, stderr_dir, &format!("{gone:?} to go"), |screen| !gone.iter().any(|w| screen.contains(w)));
    }

    fn poll(&self, name: &str, stderr_dir: Option<&Path>, what: &str, done: impl Fn(&str) -> bool) {
        let start = Instant::now();
        loop {
            let screen = self.screen(name);
            if done(&screen) {
                return;
            }
            if start.elapsed() > self.wait {
                let err = stderr_dir
                    .and_then(|d| std::fs::read_to_string(d.join(format!("{name}.err"))).ok())
                    .unwrap_or_default();
                panic!("{name}: timed out waiting for {what}; screen:\n{screen}\nstderr:\n{err}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether `cmd arg` runs and succeeds (a tool is installed).
pub fn installed(cmd: &str, arg: &str) -> bool {
    Command::new(cmd).arg(arg).output().is_ok_and(|o| o.status.success())
}

/// `p` quoted for a POSIX shell.
pub fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}
