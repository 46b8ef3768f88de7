//! A C program does not ignore SIGPIPE (Rust programs do), so a write to a
//! daemon connection that has closed could kill the whole process: over
//! TLS, rustls writes with writev, which raises SIGPIPE (plain socket
//! writes use send with MSG_NOSIGNAL). The library's threads, which do all
//! the socket I/O, block SIGPIPE, so such a write fails with EPIPE and the
//! session ends with CONCLAVE_EVENT_CLOSED.
//!
//! This binary restores SIGPIPE's default action (so it holds only these
//! tests: they change the process's signal disposition). One test checks
//! the mechanism: every library thread has SIGPIPE blocked (from
//! /proc/self/task). The other stops a TLS daemon under a member that keeps
//! sending, and survives; it could not be made to hit the closed
//! connection reliably (it passed without the blocking too), so it is a
//! smoke test of the TLS endpoint and of a daemon going away.

use std::ffi::c_char;
use std::ptr::{null, null_mut};

use conclave::*;

mod common;
use common::{c, recv_until, until_view, World};

/// Names and blocked-signal masks of this process's threads.
fn threads() -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let Ok(status) = std::fs::read_to_string(task.unwrap().path().join("status")) else { continue };
        let field = |f: &str| status.lines().find_map(|l| l.strip_prefix(f)).map(str::trim).unwrap_or("").to_owned();
        out.push((field("Name:"), u64::from_str_radix(&field("SigBlk:"), 16).unwrap_or(0)));
    }
    out
}

#[test]
fn library_threads_block_sigpipe() {
    // SAFETY: restores the default action, as in a C program.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let w = World::new(&["alice"]);
    let h = w.member("alice");
    let ours: Vec<_> = threads().into_iter().filter(|(name, _)| name == "conclave-capi").collect();
    assert!(!ours.is_empty(), "no library thread found: {:?}", threads());
    let pipe = 1u64 << (libc::SIGPIPE - 1);
    for (name, blocked) in &ours {
        assert!(blocked & pipe != 0, "{name}: SIGPIPE not blocked (SigBlk {blocked:x})");
    }
    assert_eq!(unsafe { conclave_destroy(h) }, CONCLAVE_OK);
}

#[test]
fn a_closed_connection_does_not_kill_a_c_program() {
    // SAFETY: restores the default action, as in a C program.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let mut w = World::new_tls(&["alice"]);
    let h = w.member("alice");
    let room = c("room");
    let msg = vec![b'x'; 60_000];
    unsafe {
        assert_eq!(conclave_join(h, room.as_ptr(), null::<c_char>()), CONCLAVE_OK);
        until_view(h, "room", &["alice"]);
        // Queue more than the daemon takes in at once, then stop it: the
        // writer is still writing when the connection closes.
        for _ in 0..400 {
            assert_eq!(conclave_send(h, room.as_ptr(), msg.as_ptr(), msg.len()), CONCLAVE_OK);
        }
        w.stop_daemon();
        for _ in 0..100 {
            let rc = conclave_send(h, room.as_ptr(), msg.as_ptr(), msg.len());
            assert!(rc == CONCLAVE_OK || rc == CONCLAVE_ERR_CLOSED, "{rc:?}");
        }
        recv_until(h, "the end of the session", |ev| (conclave_event_kind(ev) == CONCLAVE_EVENT_CLOSED).then_some(()));
        let mut ev = null_mut();
        assert_eq!(conclave_recv(h, 100, &mut ev), CONCLAVE_ERR_CLOSED);
        assert_eq!(conclave_destroy(h), CONCLAVE_OK);
    }
}
