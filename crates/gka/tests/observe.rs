//! The engine contract for drivers that hold key agreement back: every view
//! is observed (`Engine::observe`), runs begin later with an explicit set of
//! admitted members (`Engine::start`), and the engine alone works out who
//! stayed with it from the views' `prev` entries.

use std::collections::VecDeque;
use std::sync::Arc;

use conclave_gcs::view::Cause;
use conclave_gcs::{MemberId, View, ViewId, ViewMember};
use conclave_gka::suite::{generate_signer, SignatureId, Signer};
use conclave_gka::{new_engine, Config, Engine, GroupId, Output, ProtocolId, SecureView, StaticDirectory};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

struct Members {
    names: Vec<MemberId>,
    signers: Vec<Arc<dyn Signer>>,
    engines: Vec<Box<dyn Engine>>,
    rng: ChaCha20Rng,
}

impl Members {
    fn new(protocol: ProtocolId, n: usize) -> Members {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let names: Vec<MemberId> = (0..n).map(|i| MemberId::new(format!("m{i}")).unwrap()).collect();
        let signers: Vec<_> = names.iter().map(|_| generate_signer(SignatureId::Ed25519, &mut rng).unwrap()).collect();
        let mut m = Members { names, signers, engines: Vec::new(), rng };
        m.engines = (0..n).map(|i| m.fresh(protocol, i)).collect();
        m
    }

    /// A new engine for member `i` (a member that crashed and came back).
    fn fresh(&self, protocol: ProtocolId, i: usize) -> Box<dyn Engine> {
        new_engine(Config {
            protocol,
            group_id: GroupId::Ristretto255,
            group: "observe".into(),
            me: self.names[i].clone(),
            signer: self.signers[i].clone(),
            directory: Arc::new(StaticDirectory::new()),
        })
    }

    /// Everyone's keys, as a run's explicit admission.
    fn admitted(&self, who: &[usize]) -> StaticDirectory {
        let mut d = StaticDirectory::new();
        for &i in who {
            d.insert(self.names[i].clone(), self.signers[i].verifier());
        }
        d
    }

    /// View `seq` of `(member, previous view)`, in that order.
    fn view(&self, seq: u64, members: &[(usize, Option<u64>)]) -> View {
        let members =
            members.iter().map(|&(i, p)| ViewMember { id: self.names[i].clone(), prev: p.map(|p| ViewId::new(1, p)) });
        View { id: ViewId::new(1, seq), members: members.collect(), cause: Cause::Join }
    }

    /// Runs the started run of `who` to the end, delivering every message
    /// to the members it is for (agreed order); returns what each installed.
    fn run(&mut self, who: &[usize], first: Vec<(usize, Vec<Output>)>) -> Vec<Option<SecureView>> {
        let mut installed = vec![None; self.engines.len()];
        let mut queue: VecDeque<(usize, Output)> =
            first.into_iter().flat_map(|(i, outs)| outs.into_iter().map(move |o| (i, o))).collect();
        while let Some((from, out)) = queue.pop_front() {
            match out {
                Output::Installed(sv) => installed[from] = Some(sv),
                Output::Send { to, bytes } => {
                    for &j in who {
                        if to.as_ref().is_some_and(|t| *t != self.names[j]) {
                            continue;
                        }
                        let sender = self.names[from].clone();
                        // Messages a member cannot use (not for its role) are dropped, as drivers do.
                        let outs = self.engines[j].on_message(&sender, &bytes, &mut self.rng).unwrap_or_default();
                        queue.extend(outs.into_iter().map(|o| (j, o)));
                    }
                }
            }
        }
        installed
    }

    fn observe(&mut self, view: &View, who: &[usize]) {
        for &i in who {
            self.engines[i].observe(view).unwrap();
        }
    }

    fn start(&mut self, who: &[usize]) -> Vec<Option<SecureView>> {
        let admitted = self.admitted(who);
        let first: Vec<_> =
            who.iter().map(|&i| (i, self.engines[i].start(&admitted, &mut self.rng).unwrap())).collect();
        self.run(who, first)
    }
}

/// m1 leaves, comes back as a new process, and the view after its return is
/// the first in which a run starts: every member then names the same `prev`,
/// but m1 holds none of the state m0 and m2 kept from before. The engines
/// must work that out from the views they observed: all three agree on one
/// key. (CKD once read "who came with me" from the run's view alone and sent
/// m1 a key over a channel m1 no longer had.)
fn a_member_back_from_a_crash_between_runs_gets_the_key(protocol: ProtocolId) {
    let mut m = Members::new(protocol, 3);
    let all = [0, 1, 2];
    let v1 = m.view(1, &[(0, None), (1, None), (2, None)]);
    m.observe(&v1, &all);
    let keys = m.start(&all);
    assert!(keys.iter().all(|k| k.is_some()), "{protocol}: the first run installs everywhere");
    // m1 crashes: a view without it, held (no run).
    let v2 = m.view(2, &[(0, Some(1)), (2, Some(1))]);
    m.observe(&v2, &[0, 2]);
    // m1 comes back, a new process; that view is held too.
    m.engines[1] = m.fresh(protocol, 1);
    let v3 = m.view(3, &[(0, Some(2)), (2, Some(2)), (1, None)]);
    m.observe(&v3, &all);
    // The next view comes from v3 for everyone, and its run starts.
    let v4 = m.view(4, &[(0, Some(3)), (2, Some(3)), (1, Some(3))]);
    m.observe(&v4, &all);
    let keys = m.start(&all);
    let keys: Vec<SecureView> = keys.into_iter().map(|k| k.unwrap_or_else(|| panic!("{protocol}: no key"))).collect();
    assert!(keys.iter().all(|k| k.key == keys[0].key && k.view_id == ViewId::new(1, 4)), "{protocol}: one key");
}

/// A member refused in a view stands aside while the others install a key
/// without it; in the next view (all three, from that view) it counts as a
/// newcomer, and all three agree.
fn a_member_that_stood_aside_is_a_newcomer_next_time(protocol: ProtocolId) {
    let mut m = Members::new(protocol, 3);
    let all = [0, 1, 2];
    let v1 = m.view(1, &[(0, None), (1, None), (2, None)]);
    m.observe(&v1, &all);
    assert!(m.start(&all).iter().all(|k| k.is_some()));
    let v2 = m.view(2, &[(0, Some(1)), (1, Some(1)), (2, Some(1))]);
    m.observe(&v2, &all);
    m.engines[1].stand_aside();
    let keys = m.start(&[0, 2]);
    assert!(keys[0].is_some() && keys[2].is_some() && keys[1].is_none(), "{protocol}: the two agree alone");
    let v3 = m.view(3, &[(0, Some(2)), (1, Some(2)), (2, Some(2))]);
    m.observe(&v3, &all);
    let keys: Vec<SecureView> = m.start(&all).into_iter().map(|k| k.expect("a key")).collect();
    assert!(keys.iter().all(|k| k.key == keys[0].key), "{protocol}: one key after standing aside");
}

/// Observing a view forgets the previous key: no secure view until a run of
/// the new view installs one.
#[test]
fn observing_a_view_forgets_the_previous_key() {
    let mut m = Members::new(ProtocolId::Tgdh, 2);
    let v1 = m.view(1, &[(0, None), (1, None)]);
    m.observe(&v1, &[0, 1]);
    m.start(&[0, 1]);
    assert!(m.engines[0].secure_view().is_some());
    let v2 = m.view(2, &[(0, Some(1)), (1, Some(1))]);
    m.observe(&v2, &[0, 1]);
    assert!(m.engines[0].secure_view().is_none() && !m.engines[0].in_progress());
    let others = m.admitted(&[1]);
    assert!(m.engines[0].start(&others, &mut m.rng).is_err(), "a run this member is not admitted to");
}

#[test]
fn every_protocol_follows_the_views_it_observes() {
    for p in ProtocolId::ALL {
        a_member_back_from_a_crash_between_runs_gets_the_key(p);
        a_member_that_stood_aside_is_a_newcomer_next_time(p);
    }
}
