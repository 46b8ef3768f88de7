//! Key files and sockets on a shared machine (issue 18, "Safe files"): key
//! directories that are links, open to others or someone else's are refused;
//! no default path lies in a shared `/tmp`; `conclave chat` creates no
//! authority or certificate unless asked to (`--create-identity`).

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn conclave() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_conclave"));
    c.env_remove("RUST_LOG").stdin(Stdio::null());
    c
}

/// Runs `cmd`; returns success, stdout and stderr.
fn run(cmd: &mut Command) -> (bool, String, String) {
    let Output { status, stdout, stderr } = cmd.output().expect("run conclave");
    (status.success(), String::from_utf8_lossy(&stdout).into(), String::from_utf8_lossy(&stderr).into())
}

fn private_dir(path: &Path) {
    std::fs::DirBuilder::new().mode(0o700).create(path).unwrap();
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

#[test]
fn a_key_directory_that_is_a_symlink_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let (real, link) = (t.path().join("real"), t.path().join("link"));
    private_dir(&real);
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let (ok, _, err) = run(conclave().args(["keys", "authority", "--dir"]).arg(&link));
    assert!(!ok && err.contains("is a symbolic link") && err.contains(link.to_str().unwrap()), "{err}");
    assert!(entries(&real).is_empty(), "written through the link: {:?}", entries(&real));
}

#[test]
fn a_key_directory_open_to_group_or_others_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let keys = t.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ok, _, err) = run(conclave().args(["keys", "authority", "--dir"]).arg(&keys));
    let fix = format!("chmod 700 {}", keys.display());
    assert!(!ok && err.contains("mode 755") && err.contains(&fix), "{err}");
    assert!(entries(&keys).is_empty(), "{:?}", entries(&keys));
    // The same for chat, before anything else.
    let (ok, _, err) = run(conclave()
        .args(["chat", "--name", "alice", "--group", "room", "--create-identity", "--keys"])
        .arg(&keys)
        .args(["--unix", "/nonexistent/conclave.sock"]));
    assert!(!ok && err.contains(&fix), "{err}");
    // Fixed as told: accepted.
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (ok, _, err) = run(conclave().args(["keys", "authority", "--dir"]).arg(&keys));
    assert!(ok, "{err}");
}

#[test]
fn a_key_directory_of_another_user_is_refused() {
    let t = tempfile::tempdir().unwrap();
    if std::fs::metadata(t.path()).unwrap().uid() != 0 {
        eprintln!("note: not root; skipping the test of a key directory owned by another user");
        return;
    }
    let keys = t.path().join("keys");
    private_dir(&keys);
    std::os::unix::fs::chown(&keys, Some(12345), Some(12345)).unwrap();
    let (ok, _, err) = run(conclave().args(["keys", "authority", "--dir"]).arg(&keys));
    assert!(!ok && err.contains("owned by uid 12345") && err.contains(keys.to_str().unwrap()), "{err}");
    assert!(entries(&keys).is_empty(), "{:?}", entries(&keys));
    // Its members/ directory too.
    let keys = t.path().join("keys2");
    private_dir(&keys);
    private_dir(&keys.join("members"));
    std::os::unix::fs::chown(keys.join("members"), Some(12345), Some(12345)).unwrap();
    let (ok, _, err) = run(conclave().args(["keys", "authority", "--dir"]).arg(&keys));
    assert!(!ok && err.contains("owned by uid 12345"), "{err}");
}

/// Without `--create-identity`, chat exits before its screen, creates nothing
/// (not even a mistyped directory) and says which command creates the
/// identity; with it but no daemon to reach, it still creates nothing.
#[test]
fn chat_without_create_identity_creates_nothing_and_says_how() {
    let t = tempfile::tempdir().unwrap();
    let keys = t.path().join("keys");
    private_dir(&keys);
    let chat = |keys: &Path, extra: &[&str]| {
        run(conclave()
            .args(["chat", "--name", "alice", "--group", "room", "--unix", "/nonexistent/conclave.sock", "--keys"])
            .arg(keys)
            .args(extra))
    };
    let (ok, out, err) = chat(&keys, &[]);
    assert!(!ok, "{out}\n{err}");
    assert!(err.contains("no certificate for alice"), "{err}");
    assert!(err.contains("conclave keys issue alice") && err.contains("--create-identity"), "{err}");
    assert!(entries(&keys).is_empty(), "chat created {:?}", entries(&keys));
    let typo = t.path().join("kyes");
    let (ok, _, err) = chat(&typo, &[]);
    assert!(!ok && err.contains("--create-identity"), "{err}");
    assert!(!typo.exists(), "chat created the mistyped directory");
    // Asked to, but the daemon is not there: checked first, nothing created.
    let (ok, _, err) = chat(&keys, &["--create-identity"]);
    assert!(!ok && err.contains("cannot connect"), "{err}");
    assert!(entries(&keys).is_empty(), "chat created {:?}", entries(&keys));
}

/// No default path is in `/tmp`: without `$XDG_RUNTIME_DIR` there is no
/// default socket, without `$XDG_STATE_HOME` and `$HOME` no default key
/// directory, and the commands say which option to pass; the help texts name
/// the defaults.
#[test]
fn default_paths_never_start_with_tmp() {
    let bare = || {
        let mut c = conclave();
        c.env_remove("XDG_RUNTIME_DIR").env_remove("XDG_STATE_HOME").env_remove("HOME");
        c
    };
    let (ok, _, err) = run(bare().args(["keys", "list"]));
    assert!(!ok && err.contains("--dir") && !err.contains("/tmp"), "{err}");
    let (ok, _, err) = run(bare().args(["chat", "--name", "alice", "--group", "room"]));
    assert!(!ok && err.contains("--keys") && !err.contains("/tmp"), "{err}");
    let (ok, _, err) = run(bare().args(["client", "--name", "alice"]));
    assert!(!ok && err.contains("--unix") && !err.contains("/tmp"), "{err}");
    let (ok, _, err) = run(bare().arg("daemon"));
    assert!(!ok && err.contains("--unix") && !err.contains("/tmp"), "{err}");

    for help in
        [&["keys", "authority", "--help"][..], &["chat", "--help"], &["client", "--help"], &["daemon", "--help"]]
    {
        let (ok, out, _) = run(conclave().args(help));
        assert!(ok && !out.contains("/tmp") && out.contains("XDG_"), "{help:?}: {out}");
    }

    // $HOME alone: ~/.local/state/conclave/keys, every directory created private.
    let t = tempfile::tempdir().unwrap();
    let (ok, out, err) = run(bare().env("HOME", t.path()).args(["keys", "authority"]));
    assert!(ok, "{out}\n{err}");
    let mut dir = t.path().to_owned();
    for part in [".local", "state", "conclave", "keys"] {
        dir.push(part);
        let mode = std::fs::symlink_metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }
    assert!(dir.join("authority.crt").is_file());
    // $XDG_STATE_HOME first.
    let state = t.path().join("state-home");
    let (ok, out, err) = run(bare().env("HOME", t.path()).env("XDG_STATE_HOME", &state).args(["keys", "authority"]));
    assert!(ok, "{out}\n{err}");
    assert!(state.join("conclave/keys/authority.crt").is_file());
}
