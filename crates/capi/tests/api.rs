//! The C API called from Rust as C would call it: every bad argument (NULL
//! pointers, bad UTF-8, unknown policies, bad names and endpoints, missing
//! or unsafe key files) and every refused operation (joining twice, sending
//! outside a group, a daemon that is gone) gives its documented return
//! code and a message, never a crash; and a group of two works end to end.

use std::ffi::c_char;
use std::ptr::{null, null_mut};

use conclave::*;

mod common;
use common::{c, last_error, members_of, recv_until, string, until_view, World};

const BAD_UTF8: &[u8] = b"caf\xe9\0";

fn bad() -> *const c_char {
    BAD_UTF8.as_ptr().cast()
}

#[test]
fn init_refuses_null_and_bad_arguments() {
    let w = World::new(&["alice"]);
    let sock = c(w.socket.to_str().unwrap());
    let keys = c(w.keys.to_str().unwrap());
    let alice = c("alice");
    let init = |e: *const c_char, n: *const c_char, k: *const c_char| {
        let mut h = std::ptr::dangling_mut::<conclave_t>(); // Must be reset to NULL on failure.
        let rc = unsafe { conclave_init(e, n, k, &mut h) };
        assert!(h.is_null(), "a failed init leaves *out NULL");
        (rc, last_error())
    };
    assert_eq!(unsafe { conclave_init(sock.as_ptr(), alice.as_ptr(), keys.as_ptr(), null_mut()) }, CONCLAVE_ERR_NULL);
    assert!(last_error().contains("out is NULL"), "{}", last_error());
    let (rc, msg) = init(null(), alice.as_ptr(), keys.as_ptr());
    assert_eq!(rc, CONCLAVE_ERR_NULL);
    assert!(msg.contains("endpoint"), "{msg}");
    assert_eq!(init(sock.as_ptr(), null(), keys.as_ptr()).0, CONCLAVE_ERR_NULL);
    let (rc, msg) = init(sock.as_ptr(), alice.as_ptr(), null());
    assert_eq!(rc, CONCLAVE_ERR_NULL);
    assert!(msg.contains("keys_dir") && msg.contains("conclave keys"), "{msg}");
    let (rc, msg) = init(bad(), alice.as_ptr(), keys.as_ptr());
    assert_eq!(rc, CONCLAVE_ERR_UTF8);
    assert!(msg.contains("endpoint is not valid UTF-8"), "{msg}");
    assert_eq!(init(sock.as_ptr(), bad(), keys.as_ptr()).0, CONCLAVE_ERR_UTF8);
    assert_eq!(init(sock.as_ptr(), alice.as_ptr(), bad()).0, CONCLAVE_ERR_UTF8);
    // Bad names and endpoints.
    let (rc, msg) = init(sock.as_ptr(), c("").as_ptr(), keys.as_ptr());
    assert_eq!(rc, CONCLAVE_ERR_INVALID, "{msg}");
    let (rc, msg) = init(sock.as_ptr(), c("../alice").as_ptr(), keys.as_ptr());
    assert_eq!(rc, CONCLAVE_ERR_INVALID, "{msg}");
    let (rc, msg) = init(c("tcp:nowhere").as_ptr(), alice.as_ptr(), keys.as_ptr());
    assert_eq!(rc, CONCLAVE_ERR_INVALID);
    assert!(msg.contains("bad daemon endpoint"), "{msg}");
    // No certificate for the name; no daemon behind the socket.
    let (rc, msg) = init(sock.as_ptr(), c("mallory").as_ptr(), keys.as_ptr());
    assert_eq!(rc, CONCLAVE_ERR_IDENTITY);
    assert!(msg.contains("mallory.crt") && msg.contains("no such file"), "{msg}");
    let missing = c(w.dir.path().join("missing.sock").to_str().unwrap());
    let (rc, msg) = init(missing.as_ptr(), alice.as_ptr(), keys.as_ptr());
    assert_eq!(rc, CONCLAVE_ERR_CONNECT);
    assert!(msg.contains("no such socket"), "{msg}");
    // Two handles with one name: the daemon refuses the second.
    let h = w.member("alice");
    let (rc, msg) = init(sock.as_ptr(), alice.as_ptr(), keys.as_ptr());
    assert_eq!(rc, CONCLAVE_ERR_CONNECT, "{msg}");
    assert_eq!(unsafe { conclave_destroy(h) }, CONCLAVE_OK);
}

#[test]
fn unsafe_key_files_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::new(&["alice", "bob"]);
    let sock = c(w.socket.to_str().unwrap());
    let keys = c(w.keys.to_str().unwrap());
    let init = |name: &str| {
        let mut h = null_mut();
        let rc = unsafe { conclave_init(sock.as_ptr(), c(name).as_ptr(), keys.as_ptr(), &mut h) };
        assert!(h.is_null());
        (rc, last_error())
    };
    // A secret key others may read.
    let key = w.keys.join("members/alice.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (rc, msg) = init("alice");
    assert_eq!(rc, CONCLAVE_ERR_IDENTITY);
    assert!(msg.contains("accessible by group or others") && !msg.contains("PRIVATE KEY"), "{msg}");
    // A symbolic link in place of a key file.
    let bob_key = w.keys.join("members/bob.key");
    std::fs::rename(&bob_key, w.dir.path().join("elsewhere.key")).unwrap();
    std::os::unix::fs::symlink(w.dir.path().join("elsewhere.key"), &bob_key).unwrap();
    let (rc, msg) = init("bob");
    assert_eq!(rc, CONCLAVE_ERR_IDENTITY);
    assert!(msg.contains("symbolic link"), "{msg}");
    // A certificate issued to someone else under this name.
    std::fs::copy(w.keys.join("members/alice.crt"), w.keys.join("members/carol.crt")).unwrap();
    std::fs::copy(w.dir.path().join("elsewhere.key"), w.keys.join("members/carol.key")).unwrap();
    std::fs::set_permissions(w.keys.join("members/carol.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let (rc, msg) = init("carol");
    assert_eq!(rc, CONCLAVE_ERR_IDENTITY, "{msg}");
}

#[test]
fn null_handles_events_and_lists_are_harmless() {
    let g = c("room");
    let mut ev = null_mut();
    let mut list = null_mut();
    unsafe {
        assert_eq!(conclave_join(null_mut(), g.as_ptr(), null()), CONCLAVE_ERR_NULL);
        assert!(last_error().contains("handle is NULL"));
        assert_eq!(conclave_send(null_mut(), g.as_ptr(), b"x".as_ptr(), 1), CONCLAVE_ERR_NULL);
        assert_eq!(conclave_recv(null_mut(), 0, &mut ev), CONCLAVE_ERR_NULL);
        assert!(ev.is_null());
        assert_eq!(conclave_read_membership(null_mut(), g.as_ptr(), &mut list), CONCLAVE_ERR_NULL);
        assert!(list.is_null());
        assert_eq!(conclave_leave(null_mut(), g.as_ptr()), CONCLAVE_ERR_NULL);
        assert_eq!(conclave_destroy(null_mut()), CONCLAVE_OK);
        // Accessors of NULL give NULL or 0; frees of NULL do nothing.
        assert_eq!(conclave_event_kind(null()), CONCLAVE_EVENT_CLOSED);
        assert!(conclave_event_group(null()).is_null());
        assert!(conclave_event_sender(null()).is_null());
        assert!(conclave_event_text(null()).is_null());
        assert!(conclave_event_epoch(null()).is_null());
        assert!(conclave_event_fingerprint(null()).is_null());
        assert!(conclave_event_protocol(null()).is_null());
        let mut len = 99;
        assert!(conclave_event_data(null(), &mut len).is_null());
        assert_eq!(len, 0);
        assert!(conclave_event_data(null(), null_mut()).is_null());
        assert_eq!(conclave_event_member_count(null()), 0);
        assert!(conclave_event_member(null(), 0).is_null());
        assert_eq!(conclave_members_count(null()), 0);
        assert!(conclave_members_get(null(), 0).is_null());
        conclave_event_free(null_mut());
        conclave_members_free(null_mut());
        assert_eq!(string(conclave_version()).unwrap(), format!("conclave-capi {}", env!("CARGO_PKG_VERSION")));
    }
}

#[test]
fn last_error_is_per_thread() {
    let g = c("room");
    assert_eq!(unsafe { conclave_leave(null_mut(), g.as_ptr()) }, CONCLAVE_ERR_NULL);
    let here = last_error();
    assert!(!here.is_empty());
    let there = std::thread::spawn(last_error).join().unwrap();
    assert_eq!(there, "", "another thread has no error yet");
    assert_eq!(last_error(), here);
}

#[test]
fn refused_operations_give_their_codes() {
    let w = World::new(&["alice"]);
    let h = w.member("alice");
    let room = c("room");
    let mut ev = null_mut();
    let mut list = null_mut();
    unsafe {
        // Nothing to receive yet: a timeout, not an error.
        assert_eq!(conclave_recv(h, 0, &mut ev), CONCLAVE_TIMEOUT);
        assert!(ev.is_null());
        assert_eq!(conclave_recv(h, 50, &mut ev), CONCLAVE_TIMEOUT);
        assert!(ev.is_null());
        assert_eq!(conclave_recv(h, 0, null_mut()), CONCLAVE_ERR_NULL);
        // Not joined yet.
        assert_eq!(conclave_send(h, room.as_ptr(), b"x".as_ptr(), 1), CONCLAVE_ERR_NOT_JOINED);
        assert!(last_error().contains("not joined"), "{}", last_error());
        assert_eq!(conclave_leave(h, room.as_ptr()), CONCLAVE_ERR_NOT_JOINED);
        assert_eq!(conclave_read_membership(h, room.as_ptr(), &mut list), CONCLAVE_ERR_NOT_JOINED);
        assert!(list.is_null());
        // Bad arguments to join.
        assert_eq!(conclave_join(h, null(), null()), CONCLAVE_ERR_NULL);
        assert_eq!(conclave_join(h, bad(), null()), CONCLAVE_ERR_UTF8);
        assert_eq!(conclave_join(h, room.as_ptr(), bad()), CONCLAVE_ERR_UTF8);
        assert_eq!(conclave_join(h, c("no spaces allowed?").as_ptr(), null()), CONCLAVE_ERR_INVALID);
        assert_eq!(conclave_join(h, room.as_ptr(), c("rsa-9000").as_ptr()), CONCLAVE_ERR_POLICY);
        let msg = last_error();
        assert!(msg.contains("unknown key agreement policy \"rsa-9000\"") && msg.contains("queue-batch"), "{msg}");
        assert_eq!(conclave_join(h, room.as_ptr(), c("batch:0s").as_ptr()), CONCLAVE_ERR_POLICY);
        // Join, then join again.
        assert_eq!(conclave_join(h, room.as_ptr(), c("tgdh-interval:batch:1s").as_ptr()), CONCLAVE_OK);
        assert_eq!(conclave_join(h, room.as_ptr(), null()), CONCLAVE_ERR_ALREADY_JOINED);
        assert!(last_error().contains("already joined"), "{}", last_error());
        // Sends: NULL data with a length, too long a length.
        assert_eq!(conclave_send(h, room.as_ptr(), null(), 3), CONCLAVE_ERR_NULL);
        assert_eq!(conclave_send(h, room.as_ptr(), b"x".as_ptr(), usize::MAX), CONCLAVE_ERR_INVALID);
        let big = vec![7u8; 64 << 20];
        assert_eq!(conclave_send(h, room.as_ptr(), big.as_ptr(), big.len()), CONCLAVE_ERR_TOO_LARGE);
        // Before the first secure view there is no membership to read (or
        // the view came already).
        let rc = conclave_read_membership(h, room.as_ptr(), &mut list);
        assert!(rc == CONCLAVE_ERR_NO_VIEW || rc == CONCLAVE_OK, "{rc:?}");
        conclave_members_free(list);
        // Then there is; an empty message goes out and comes back.
        until_view(h, "room", &["alice"]);
        assert_eq!(conclave_read_membership(h, room.as_ptr(), &mut list), CONCLAVE_OK);
        assert_eq!(conclave_members_count(list), 1);
        assert_eq!(string(conclave_members_get(list, 0)).as_deref(), Some("alice"));
        assert!(conclave_members_get(list, 1).is_null());
        conclave_members_free(list);
        assert_eq!(conclave_send(h, room.as_ptr(), null(), 0), CONCLAVE_OK);
        recv_until(h, "the empty message", |ev| {
            let mut len = 99;
            let data = conclave_event_data(ev, &mut len);
            (conclave_event_kind(ev) == CONCLAVE_EVENT_MESSAGE && len == 0 && !data.is_null()).then_some(())
        });
        // Leave: joining again before the Left event is refused, after it works.
        assert_eq!(conclave_leave(h, room.as_ptr()), CONCLAVE_OK);
        let rc = conclave_join(h, room.as_ptr(), null());
        assert!(rc == CONCLAVE_ERR_STILL_LEAVING || rc == CONCLAVE_OK, "{rc:?}: {}", last_error());
        if rc == CONCLAVE_ERR_STILL_LEAVING {
            recv_until(h, "left", |ev| (conclave_event_kind(ev) == CONCLAVE_EVENT_LEFT).then_some(()));
            assert_eq!(conclave_join(h, room.as_ptr(), null()), CONCLAVE_OK);
        }
        assert_eq!(conclave_destroy(h), CONCLAVE_OK);
    }
}

#[test]
fn two_members_exchange_messages() {
    let w = World::new(&["alice", "bob"]);
    let (alice, bob) = (w.member("alice"), w.member("bob"));
    let room = c("room");
    unsafe {
        assert_eq!(conclave_join(alice, room.as_ptr(), c("tgdh").as_ptr()), CONCLAVE_OK);
        until_view(alice, "room", &["alice"]);
        assert_eq!(conclave_join(bob, room.as_ptr(), null()), CONCLAVE_OK);
        // Both see the same view with the same key fingerprint.
        let fp = |h| {
            recv_until(h, "view alice, bob", |ev| {
                (conclave_event_kind(ev) == CONCLAVE_EVENT_VIEW && members_of(ev) == ["alice", "bob"]).then(|| {
                    assert_eq!(string(conclave_event_protocol(ev)).as_deref(), Some("tgdh"));
                    assert!(string(conclave_event_epoch(ev)).is_some());
                    string(conclave_event_fingerprint(ev)).unwrap()
                })
            })
        };
        assert_eq!(fp(alice), fp(bob));
        let hello = b"hello\0with a NUL inside";
        assert_eq!(conclave_send(bob, room.as_ptr(), hello.as_ptr(), hello.len()), CONCLAVE_OK);
        recv_until(alice, "bob's message", |ev| {
            if conclave_event_kind(ev) != CONCLAVE_EVENT_MESSAGE {
                return None;
            }
            let mut len = 0;
            let data = conclave_event_data(ev, &mut len);
            assert_eq!(std::slice::from_raw_parts(data, len), hello);
            assert_eq!(string(conclave_event_sender(ev)).as_deref(), Some("bob"));
            assert_eq!(string(conclave_event_group(ev)).as_deref(), Some("room"));
            Some(())
        });
        // Bob leaves; alice's view shrinks.
        assert_eq!(conclave_leave(bob, room.as_ptr()), CONCLAVE_OK);
        recv_until(bob, "left", |ev| {
            (conclave_event_kind(ev) == CONCLAVE_EVENT_LEFT).then(|| {
                assert_eq!(string(conclave_event_group(ev)).as_deref(), Some("room"));
            })
        });
        until_view(alice, "room", &["alice"]);
        assert_eq!(conclave_destroy(bob), CONCLAVE_OK);
        assert_eq!(conclave_destroy(alice), CONCLAVE_OK);
    }
}

#[test]
fn a_daemon_that_goes_away_closes_the_session() {
    let mut w = World::new(&["alice"]);
    let h = w.member("alice");
    let room = c("room");
    unsafe {
        assert_eq!(conclave_join(h, room.as_ptr(), null()), CONCLAVE_OK);
        until_view(h, "room", &["alice"]);
        w.stop_daemon();
        recv_until(h, "the end of the session", |ev| {
            (conclave_event_kind(ev) == CONCLAVE_EVENT_CLOSED).then(|| {
                assert!(string(conclave_event_text(ev)).unwrap().contains("session ended"));
            })
        });
        let mut ev = null_mut();
        assert_eq!(conclave_recv(h, 1000, &mut ev), CONCLAVE_ERR_CLOSED);
        assert!(ev.is_null());
        assert_eq!(conclave_send(h, room.as_ptr(), b"x".as_ptr(), 1), CONCLAVE_ERR_CLOSED);
        assert_eq!(conclave_join(h, c("other").as_ptr(), null()), CONCLAVE_ERR_CLOSED);
        let mut list = null_mut();
        assert_eq!(conclave_read_membership(h, room.as_ptr(), &mut list), CONCLAVE_ERR_NOT_JOINED);
        assert_eq!(conclave_destroy(h), CONCLAVE_OK);
    }
}

#[test]
fn calls_from_inside_a_tokio_runtime_are_refused() {
    // Only a Rust caller can do this; it must get an error, not a panic
    // (or an abort from dropping a runtime inside another).
    let w = World::new(&["alice"]);
    let h = w.member("alice");
    let (sock, keys) = (c(w.socket.to_str().unwrap()), c(w.keys.to_str().unwrap()));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut other = null_mut();
        let rc = unsafe { conclave_init(sock.as_ptr(), c("alice").as_ptr(), keys.as_ptr(), &mut other) };
        assert_eq!(rc, CONCLAVE_ERR_INVALID);
        assert!(last_error().contains("inside a tokio runtime"), "{}", last_error());
        let mut ev = null_mut();
        assert_eq!(unsafe { conclave_recv(h, 0, &mut ev) }, CONCLAVE_ERR_INVALID);
        assert_eq!(unsafe { conclave_join(h, c("room").as_ptr(), null()) }, CONCLAVE_ERR_INVALID);
        assert_eq!(unsafe { conclave_destroy(h) }, CONCLAVE_OK);
    });
}

/// SEAL_set_passwd: a member key protected by a passphrase is refused by
/// `conclave_init` (saying which call opens it), refused with a wrong or
/// empty passphrase, and opens with the right one over TLS, where the key
/// also signs the client certificate handshake.
#[test]
fn a_protected_member_key_opens_only_with_its_passphrase() {
    use rand_core::SeedableRng;
    let w = World::new_tls(&["alice", "bob"]);
    let key = w.keys.join("members/bob.key");
    let plain = std::fs::read_to_string(&key).unwrap();
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(11);
    let protected = conclave_secure::trust::protect_key(&plain, b"correct horse", &mut rng).unwrap();
    std::fs::write(&key, protected.as_bytes()).unwrap();
    let (endpoint, keys) = (c(&w.endpoint), c(w.keys.to_str().unwrap()));
    let mut h = null_mut();
    unsafe {
        let rc = conclave_init(endpoint.as_ptr(), c("bob").as_ptr(), keys.as_ptr(), &mut h);
        assert_eq!(rc, CONCLAVE_ERR_IDENTITY);
        assert!(h.is_null());
        assert!(last_error().contains("conclave_init_protected"), "{}", last_error());
        for (pass, code, says) in
            [(c("wrong"), CONCLAVE_ERR_IDENTITY, "passphrase does not open"), (c(""), CONCLAVE_ERR_INVALID, "empty")]
        {
            let rc =
                conclave_init_protected(endpoint.as_ptr(), c("bob").as_ptr(), keys.as_ptr(), pass.as_ptr(), &mut h);
            assert_eq!(rc, code, "{}", last_error());
            assert!(h.is_null());
            assert!(last_error().contains(says), "{}", last_error());
        }
        let rc = conclave_init_protected(endpoint.as_ptr(), c("bob").as_ptr(), keys.as_ptr(), null(), &mut h);
        assert_eq!(rc, CONCLAVE_ERR_NULL);
        let pass = c("correct horse");
        let rc = conclave_init_protected(endpoint.as_ptr(), c("bob").as_ptr(), keys.as_ptr(), pass.as_ptr(), &mut h);
        assert_eq!(rc, CONCLAVE_OK, "{}", last_error());
        let bob = h;
        let alice = w.member("alice");
        let room = c("room");
        assert_eq!(conclave_join(alice, room.as_ptr(), null()), CONCLAVE_OK);
        until_view(alice, "room", &["alice"]);
        assert_eq!(conclave_join(bob, room.as_ptr(), null()), CONCLAVE_OK);
        until_view(bob, "room", &["alice", "bob"]);
        until_view(alice, "room", &["alice", "bob"]);
        assert_eq!(conclave_destroy(bob), CONCLAVE_OK);
        assert_eq!(conclave_destroy(alice), CONCLAVE_OK);
    }
}
