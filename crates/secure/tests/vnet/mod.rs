//! The in-memory harness of the sans-IO tests: real [`SessionCore`]s as
//! clients of one real daemon [`Core`], delivering in memory, in virtual
//! time (nothing sleeps; every run is the same).

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conclave_gcs::core::{ConnId, Core, DaemonId, Delivery, Limits, Op, Output};
use conclave_gcs::MemberId;
use conclave_gka::suite::{generate_signer, CryptoError, SignatureId, Verifier};
use conclave_gka::StaticDirectory;
use conclave_secure::core::SessionCore;
use conclave_secure::payload::tag;
use conclave_secure::{Policy, SecureEvent};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

/// The group every test uses.
pub const GROUP: &str = "vnet";

pub struct Member {
    pub name: MemberId,
    /// Key confirmation signatures this member checked.
    pub confirm_checks: Arc<AtomicU64>,
    pub conn: ConnId,
    pub session: SessionCore,
    pub inbox: VecDeque<Delivery>,
    pub log: Vec<SecureEvent>,
}

/// What a forged key confirmation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forgery {
    /// The MAC (and so the signature over it): made without the key.
    Mac,
    /// Only the signature: the real MAC, copied.
    Signature,
}

/// One daemon core and its members, delivering in memory.
pub struct Net {
    pub core: Core,
    pub members: Vec<Member>,
    base: Instant,
    now: Duration,
    /// A compromised link: ahead of every key confirmation this member
    /// sends, it sends a forged copy.
    pub forge_confirmations_of: Option<(usize, Forgery)>,
    /// Every key confirmation (unicast to the collector) and verdict
    /// (multicast): (sender's index, payload length).
    pub confirmations_sent: Vec<(usize, usize)>,
    /// Multicasts and unicasts the members sent.
    pub messages_sent: usize,
    /// Every verdict multicast: (collector's index, payload).
    pub verdicts_sent: Vec<(usize, bytes::Bytes)>,
    /// The next connection's local number.
    next_local: u64,
    /// A compromised link to this member flips the policy's unsigned
    /// sender-signatures bit of every key agreement message from others.
    pub flip_policy_bit_for: Option<usize>,
}

/// A member's view of another's identity key that counts the key
/// confirmation signatures checked with it.
struct Counting {
    key: Arc<dyn Verifier>,
    confirm_checks: Arc<AtomicU64>,
}

impl Verifier for Counting {
    fn scheme(&self) -> SignatureId {
        self.key.scheme()
    }
    fn verify(&self, msg: &[u8], sig: &[u8]) -> Result<(), CryptoError> {
        if msg.starts_with(b"conclave/secure/v1/confirm-signature\0") {
            self.confirm_checks.fetch_add(1, Ordering::Relaxed);
        }
        self.key.verify(msg, sig)
    }
    fn public_bytes(&self) -> Vec<u8> {
        self.key.public_bytes()
    }
}

impl Net {
    pub fn new(names: &[&str], seed: u64) -> Net {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let signers: Vec<_> = names.iter().map(|_| generate_signer(SignatureId::Ed25519, &mut rng).unwrap()).collect();
        let base = Instant::now();
        let mut net = Net {
            core: Core::new(DaemonId(0), Limits::default(), seed),
            members: Vec::new(),
            base,
            now: Duration::ZERO,
            forge_confirmations_of: None,
            confirmations_sent: Vec::new(),
            messages_sent: 0,
            verdicts_sent: Vec::new(),
            flip_policy_bit_for: None,
            next_local: 0,
        };
        for (i, (n, signer)) in names.iter().zip(&signers).enumerate() {
            let rng = Box::new(ChaCha20Rng::seed_from_u64(seed * 100 + i as u64));
            // Each member its own directory, so that each counts its own checks.
            let confirm_checks = Arc::new(AtomicU64::new(0));
            let mut directory = StaticDirectory::new();
            for (other, s) in names.iter().zip(&signers) {
                let key = Arc::new(Counting { key: s.verifier(), confirm_checks: confirm_checks.clone() });
                directory.insert(MemberId::new(*other).unwrap(), key);
            }
            let me = MemberId::new(*n).unwrap();
            let session = |now| SessionCore::new(me, signer.clone(), Arc::new(directory), rng, now);
            net.add_counted(n, confirm_checks, session);
        }
        net
    }

    pub fn now(&self) -> Instant {
        self.base + self.now
    }

    /// A connection id not used before.
    fn new_conn(&mut self) -> ConnId {
        self.next_local += 1;
        ConnId { daemon: DaemonId(0), local: self.next_local }
    }

    /// Adds a member with a session of its own making (given the present),
    /// connected; returns its index.
    pub fn add(&mut self, name: &str, session: impl FnOnce(Instant) -> SessionCore) -> usize {
        self.add_counted(name, Arc::new(AtomicU64::new(0)), session)
    }

    /// [`Net::add`], with the counter the member's directory counts its
    /// confirmation checks in.
    fn add_counted(
        &mut self,
        name: &str,
        confirm_checks: Arc<AtomicU64>,
        session: impl FnOnce(Instant) -> SessionCore,
    ) -> usize {
        let (name, conn) = (MemberId::new(name).unwrap(), self.new_conn());
        let session = session(self.now());
        let (inbox, log) = (VecDeque::new(), Vec::new());
        self.members.push(Member { name: name.clone(), confirm_checks, conn, session, inbox, log });
        self.submit(Op::Connect { conn, name });
        self.members.len() - 1
    }

    /// A plain daemon client, with no session: what it is sent is dropped.
    pub fn outsider(&mut self, name: &str) -> ConnId {
        let conn = self.new_conn();
        self.submit(Op::Connect { conn, name: MemberId::new(name).unwrap() });
        conn
    }

    /// Lets `d` of virtual time pass: every session's timer fires when it
    /// is due, and what follows is delivered.
    pub fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        loop {
            let due = self.members.iter().filter_map(|m| m.session.poll_timeout()).min();
            let Some(due) = due.map(|t| t.saturating_duration_since(self.base)).filter(|t| *t <= end) else { break };
            self.now = self.now.max(due);
            let now = self.now();
            for i in 0..self.members.len() {
                if self.members[i].session.poll_timeout().is_some_and(|t| t <= now) {
                    self.members[i].session.handle_timeout(now).unwrap();
                    self.drain(i);
                }
            }
            self.settle();
        }
        self.now = self.now.max(end);
    }

    pub fn submit(&mut self, op: Op) {
        if matches!(op, Op::Multicast { .. } | Op::Unicast { .. }) {
            self.messages_sent += 1;
        }
        match &op {
            Op::Unicast { conn, group, to, payload } if payload.first() == Some(&tag::CONFIRM) => {
                let i = self.members.iter().position(|m| m.conn == *conn).expect("a member's connection");
                if let Some((_, forgery)) = self.forge_confirmations_of.filter(|(f, _)| *f == i) {
                    let mut forged = payload.to_vec();
                    // tag ‖ epoch ‖ MAC (32) ‖ Ed25519 signature (64)
                    let at = match forgery {
                        Forgery::Mac => forged.len() - 64 - 1,
                        Forgery::Signature => forged.len() - 1,
                    };
                    forged[at] ^= 1;
                    let (conn, group, to) = (*conn, group.clone(), to.clone());
                    self.core_handle(Op::Unicast { conn, group, to, payload: forged.into() });
                }
                self.confirmations_sent.push((i, payload.len()));
            }
            Op::Multicast { conn, payload, .. } if payload.first() == Some(&tag::VERDICT) => {
                let i = self.members.iter().position(|m| m.conn == *conn).expect("a member's connection");
                self.confirmations_sent.push((i, payload.len()));
                self.verdicts_sent.push((i, payload.clone()));
            }
            _ => {}
        }
        self.core_handle(op);
    }

    /// Applies an operation at the daemon core and queues what it delivers.
    fn core_handle(&mut self, op: Op) {
        let mut out = Vec::new();
        self.core.handle(op, &mut out);
        for o in out {
            let Output::Deliver { to, delivery } = o else { continue };
            for c in to {
                if let Some(m) = self.members.iter_mut().find(|m| m.conn == c) {
                    m.inbox.push_back(delivery.clone());
                }
            }
        }
    }

    /// Moves member `i`'s transmits to the daemon and its events to its log.
    pub fn drain(&mut self, i: usize) {
        let held = self.drain_holding(i, &|_| false);
        debug_assert!(held.is_empty());
    }

    /// Delivers everything, round-robin, until nothing is left.
    pub fn settle(&mut self) {
        let held = self.settle_holding(&|_| false);
        debug_assert!(held.is_empty());
    }

    /// The next delivery in member `i`'s inbox, as its link hands it over
    /// (see [`Net::flip_policy_bit_for`]).
    fn next_delivery(&mut self, i: usize) -> Option<Delivery> {
        let mut d = self.members[i].inbox.pop_front()?;
        if self.flip_policy_bit_for == Some(i) {
            if let Delivery::Message { sender, payload, .. } = &mut d {
                if payload.first() == Some(&tag::KA) && *sender != self.members[i].name {
                    let mut p = payload.to_vec();
                    p[1] ^= conclave_secure::payload::UNSIGNED_DATA;
                    *payload = p.into();
                }
            }
        }
        Some(d)
    }

    /// As [`Net::settle`], but each member takes its deliveries in batches
    /// ([`SessionCore::handle_deliveries`]): at each step, the first 1 to
    /// `max_batch` of its queue (drawn from `seed`), as a member that fell
    /// behind finds them already arrived.
    pub fn settle_batched(&mut self, max_batch: usize, seed: u64) {
        let mut rng = seed;
        for _ in 0..100_000 {
            self.now += Duration::from_millis(1);
            let now = self.now();
            let mut idle = true;
            for i in 0..self.members.len() {
                if self.members[i].inbox.is_empty() {
                    continue;
                }
                idle = false;
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let k = 1 + (rng >> 33) as usize % max_batch;
                let k = k.min(self.members[i].inbox.len());
                let batch: Vec<Delivery> = self.members[i].inbox.drain(..k).collect();
                self.members[i].session.handle_deliveries(now, batch).unwrap();
                self.drain(i);
            }
            if idle {
                return;
            }
        }
        panic!("deliveries never ran out");
    }

    /// Moves member `i`'s events to its log and its requests to the daemon,
    /// except those `hold` picks (a slow link holds them back): returned.
    pub fn drain_holding(&mut self, i: usize, hold: &dyn Fn(&Op) -> bool) -> Vec<Op> {
        let conn = self.members[i].conn;
        let mut held = Vec::new();
        while let Some(t) = self.members[i].session.poll_transmit() {
            let op = t.into_op(conn);
            if hold(&op) {
                held.push(op);
            } else {
                self.submit(op);
            }
        }
        while let Some(e) = self.members[i].session.poll_event() {
            self.members[i].log.push(e);
        }
        held
    }

    /// [`Net::settle`], holding back the requests `hold` picks: returned.
    pub fn settle_holding(&mut self, hold: &dyn Fn(&Op) -> bool) -> Vec<Op> {
        let mut held = Vec::new();
        for _ in 0..100_000 {
            self.now += Duration::from_millis(1);
            let mut idle = true;
            let now = self.now();
            for i in 0..self.members.len() {
                let Some(d) = self.next_delivery(i) else { continue };
                idle = false;
                self.members[i].session.handle_delivery(now, d).unwrap();
                held.extend(self.drain_holding(i, hold));
            }
            if idle {
                return held;
            }
        }
        panic!("deliveries never ran out");
    }

    pub fn join(&mut self, i: usize, policy: Policy) {
        let now = self.now();
        self.members[i].session.join(now, GROUP, policy).unwrap();
        self.drain(i);
        self.settle();
    }

    /// The last secure view member `i` delivered: its epoch and fingerprint,
    /// and how many members it has.
    pub fn last_view(&self, i: usize) -> Option<(conclave_gka::Epoch, String, usize)> {
        self.members[i].log.iter().rev().find_map(|e| match e {
            SecureEvent::View(v) => Some((v.epoch, v.fingerprint.clone(), v.members.len())),
            _ => None,
        })
    }
}
