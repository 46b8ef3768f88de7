//! The engine of a group keyed by its daemons (the integrated architecture's
//! Integrated VS): the members run no key agreement; each view's key comes
//! from the daemons, delivered just before the view
//! ([`Engine::daemon_key`]), and is installed when the view is.
//!
//! It sends nothing and accepts no message. Without its key a view installs
//! nothing (the session reports it); a key for another view is dropped. The
//! application key is derived from the daemons' key as every engine derives
//! its own from the agreed secret, bound to the group and the epoch.
//!
//! The daemons give the key to every member of the view, trusted or not: they,
//! not the members, decide who is in a keyed group. So a view with a member
//! that this member does not trust (not in its directory, or not admitted in
//! certified mode) installs nothing: the key is known to someone it refused,
//! and nothing is sent under it. The group waits for a view without them — an
//! untrusted client that joins stalls a keyed group until it leaves, which is
//! why a daemon that keys groups should control who may join them.

use conclave_gcs::{MemberId, Members, View, ViewId};
use rand_core::CryptoRngCore;

use std::sync::Arc;

use crate::engine::{Directory, Engine, Error, Output, StaticDirectory};
use crate::key::{Epoch, GroupKey, SecureView};
use crate::meter::Costs;
use crate::ProtocolId;

/// See the [module docs](self).
pub struct KeyedEngine {
    me: MemberId,
    group: String,
    /// Taken as fixed: a member it trusted in one view is not looked up
    /// again in the next (see [`KeyedEngine::trusted`]).
    directory: Arc<dyn Directory>,
    /// The current view: its id and members (shared with its key's
    /// [`SecureView`]).
    view: Option<(ViewId, Members)>,
    /// The last view every member of which `directory` trusts: a member of
    /// the next view that comes from it (its `prev`) was checked there.
    /// Only the others are looked up, so a view costs lookups for what
    /// changed, not for the hundreds who stayed.
    trusted: Option<ViewId>,
    /// The key the daemons gave for a view, until that view comes.
    offered: Option<(ViewId, zeroize::Zeroizing<[u8; 32]>)>,
    installed: Option<SecureView>,
    /// This member's place in the last view: where to look for it first in
    /// the next (a leave before it moves it by one), not through the names
    /// of hundreds.
    place: usize,
}

impl KeyedEngine {
    /// The engine of member `me` in the group whose context is `group`,
    /// trusting the members `directory` knows (see [`Engine::start`] for
    /// certified groups).
    pub fn new(me: MemberId, group: String, directory: Arc<dyn Directory>) -> Self {
        Self { me, group, directory, view: None, trusted: None, offered: None, installed: None, place: 0 }
    }

    /// Installs the current view's key, which its members are trusted with.
    fn install(&mut self) -> Result<Vec<Output>, Error> {
        let Some((id, members)) = &self.view else { return Err(Error::BadView("no view yet")) };
        match &self.offered {
            Some((offered, key)) if offered == id => {
                let epoch = Epoch::new(*id, 0);
                let sv = SecureView {
                    view_id: *id,
                    epoch,
                    members: members.clone(),
                    protocol: ProtocolId::Tgdh,
                    key: GroupKey::derive(key.as_ref(), ProtocolId::Tgdh, &self.group, epoch),
                };
                self.installed = Some(sv.clone());
                Ok(vec![Output::Installed(sv)])
            }
            _ => Err(Error::BadView("the daemons gave no key for this view")),
        }
    }

    /// Installs the current view's key if every member is in `admitted`
    /// (certified groups); otherwise someone this member does not trust
    /// holds the key too, and nothing is installed.
    fn install_if_admitted(&mut self, admitted: &StaticDirectory) -> Result<Vec<Output>, Error> {
        let Some((_, members)) = &self.view else { return Err(Error::BadView("no view yet")) };
        if !members.iter().all(|m| admitted.contains(m)) {
            self.installed = None;
            return Ok(Vec::new());
        }
        self.install()
    }
}

impl Engine for KeyedEngine {
    /// The protocol the daemons agree their own key with.
    fn protocol(&self) -> ProtocolId {
        ProtocolId::Tgdh
    }

    fn member(&self) -> &MemberId {
        &self.me
    }

    fn on_view(&mut self, view: &View, _rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        self.observe(view)?;
        let checked = self.trusted.take();
        let trusted = view
            .members
            .iter()
            .filter(|m| checked.is_none_or(|c| m.prev != Some(c)))
            .all(|m| self.directory.verifier(&m.id).is_some());
        if !trusted {
            // Someone this member does not trust holds the key too.
            return Ok(Vec::new());
        }
        self.trusted = Some(view.id);
        self.install()
    }

    fn observe(&mut self, view: &View) -> Result<(), Error> {
        let at = |i: usize| view.members.get(i).is_some_and(|m| m.id == self.me);
        let place = [self.place, self.place.saturating_sub(1)].into_iter().find(|&i| at(i));
        let Some(place) = place.or_else(|| view.position(&self.me)) else {
            return Err(Error::BadView("this member is not in the view"));
        };
        self.place = place;
        self.view = Some((view.id, Members::of_view(view)));
        self.installed = None;
        Ok(())
    }

    fn start(&mut self, admitted: &StaticDirectory, _rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        self.install_if_admitted(admitted)
    }

    fn stand_aside(&mut self) {
        self.installed = None;
    }

    fn rekey(&mut self, _rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        Err(Error::BadView("the daemons key this group: a new key comes with a new view"))
    }

    /// Members were admitted or refused since the view's start: the key
    /// the daemons gave is still the view's, installed only if every member
    /// is admitted now.
    fn restart(
        &mut self,
        admitted: &StaticDirectory,
        _run: u32,
        _rng: &mut dyn CryptoRngCore,
    ) -> Result<Vec<Output>, Error> {
        self.install_if_admitted(admitted)
    }

    fn current_epoch(&self) -> Option<Epoch> {
        self.view.as_ref().map(|(id, _)| Epoch::new(*id, 0))
    }

    fn tick(&mut self, _rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        Err(Error::BadView("the daemons key this group; it has no interval"))
    }

    fn on_message(
        &mut self,
        _from: &MemberId,
        _bytes: &[u8],
        _rng: &mut dyn CryptoRngCore,
    ) -> Result<Vec<Output>, Error> {
        Err(Error::WrongContext)
    }

    fn daemon_key(&mut self, view: ViewId, key: &[u8; 32]) -> Result<(), Error> {
        self.offered = Some((view, zeroize::Zeroizing::new(*key)));
        Ok(())
    }

    fn secure_view(&self) -> Option<&SecureView> {
        self.installed.as_ref()
    }

    fn in_progress(&self) -> bool {
        self.view.is_some() && self.installed.is_none()
    }

    fn costs(&self) -> Costs {
        Costs::default()
    }

    #[cfg(feature = "test-hooks")]
    fn leak(&self) -> crate::engine::Leak {
        crate::engine::Leak::default()
    }

    #[cfg(feature = "test-hooks")]
    fn public_elements(&self, _bytes: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        Ok(Vec::new())
    }

    #[cfg(feature = "test-hooks")]
    fn attacker(&self) -> Box<dyn crate::testing::AttackerGroup> {
        Box::new(crate::testing::Attacker(crate::suite::ristretto::Ristretto255))
    }
}

#[cfg(test)]
mod tests {
    use conclave_gcs::{Cause, ViewMember};
    use rand_core::OsRng;

    use super::*;

    fn view(seq: u64, names: &[&str]) -> View {
        let members = names.iter().map(|n| ViewMember { id: MemberId::new(*n).unwrap(), prev: None }).collect();
        View { id: ViewId::new(7, seq), members, cause: Cause::Join }
    }

    /// A directory that trusts `names`.
    fn trusting(names: &[&str]) -> StaticDirectory {
        let mut d = StaticDirectory::new();
        for n in names {
            let signer = crate::suite::ed25519::Ed25519Signer::generate(&mut OsRng);
            d.insert(MemberId::new(*n).unwrap(), crate::suite::Signer::verifier(&signer));
        }
        d
    }

    fn engine(me: &str, trusted: &[&str]) -> KeyedEngine {
        KeyedEngine::new(MemberId::new(me).unwrap(), "g".into(), Arc::new(trusting(trusted)))
    }

    #[test]
    fn a_view_with_a_member_not_trusted_installs_nothing() {
        let mut a = engine("a", &["a", "b"]);
        let v = view(1, &["a", "b", "mallory"]);
        a.daemon_key(v.id, &[9; 32]).unwrap();
        assert!(a.on_view(&v, &mut OsRng).unwrap().is_empty(), "mallory holds the key too");
        assert!(a.secure_view().is_none());
        // Certified: installed once every member is admitted, not before.
        a.observe(&v).unwrap();
        assert!(a.start(&trusting(&["a", "b"]), &mut OsRng).unwrap().is_empty());
        assert_eq!(a.restart(&trusting(&["a", "b", "mallory"]), 1, &mut OsRng).unwrap().len(), 1);
    }

    /// `view(seq, names)` whose members in `stayed` come from view `from`.
    fn next_view(seq: u64, names: &[&str], stayed: &[&str], from: u64) -> View {
        let mut v = view(seq, names);
        for m in std::sync::Arc::get_mut(&mut v.members).expect("not shared yet") {
            if stayed.contains(&m.id.as_str()) {
                m.prev = Some(ViewId::new(7, from));
            }
        }
        v
    }

    /// A directory that counts its lookups.
    struct Counted(StaticDirectory, std::sync::atomic::AtomicUsize);

    impl Directory for Counted {
        fn verifier(&self, member: &MemberId) -> Option<Arc<dyn crate::suite::Verifier>> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.verifier(member)
        }
    }

    #[test]
    fn only_members_new_since_a_trusted_view_are_looked_up() {
        let directory = Arc::new(Counted(trusting(&["a", "b", "c"]), 0.into()));
        let lookups = || directory.1.load(std::sync::atomic::Ordering::Relaxed);
        let mut a = KeyedEngine::new(MemberId::new("a").unwrap(), "g".into(), directory.clone());
        let mut step = |v: &View| {
            a.daemon_key(v.id, &[v.id.seq as u8; 32]).unwrap();
            a.on_view(v, &mut OsRng).unwrap().len()
        };
        assert_eq!(step(&view(1, &["a", "b"])), 1);
        assert_eq!(lookups(), 2, "the first view: everyone");
        assert_eq!(step(&next_view(2, &["a", "b", "c"], &["a", "b"], 1)), 1);
        assert_eq!(lookups(), 3, "then the newcomer only");
        // Mallory comes with b, who stayed: no key; the view after is
        // checked whole, since the one before was not trusted.
        assert_eq!(step(&next_view(3, &["a", "b", "mallory"], &["a", "b"], 2)), 0, "mallory holds the key too");
        assert_eq!(lookups(), 4);
        assert_eq!(step(&next_view(4, &["a", "b"], &["a", "b"], 3)), 1);
        assert_eq!(lookups(), 6);
        // A member that claims a view it was not in as its last is one more
        // newcomer to look up, not one taken as trusted.
        assert_eq!(step(&next_view(5, &["a", "b", "mallory"], &["a", "b", "mallory"], 3)), 0);
    }

    #[test]
    fn a_view_installs_the_key_the_daemons_gave_for_it_and_no_other() {
        let mut a = engine("a", &["a", "b"]);
        let mut b = engine("b", &["a", "b"]);
        let v1 = view(1, &["a", "b"]);
        for e in [&mut a, &mut b] {
            e.daemon_key(v1.id, &[9; 32]).unwrap();
        }
        let ka = a.on_view(&v1, &mut OsRng).unwrap();
        let kb = b.on_view(&v1, &mut OsRng).unwrap();
        let key = |o: &[Output]| match &o[0] {
            Output::Installed(sv) => sv.key.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(key(&ka), key(&kb));
        // A key for another view installs nothing in this one.
        let v2 = view(2, &["a", "b"]);
        a.daemon_key(v1.id, &[9; 32]).unwrap();
        assert!(a.on_view(&v2, &mut OsRng).is_err());
        assert!(a.secure_view().is_none() && a.in_progress());
        // No key agreement traffic is taken.
        assert!(matches!(a.on_message(&MemberId::new("b").unwrap(), b"x", &mut OsRng), Err(Error::WrongContext)));
    }

    #[test]
    fn a_view_is_followed_wherever_this_member_moves_in_it_and_refused_without_it() {
        let names = ["a", "b", "c", "d", "e"];
        let mut c = engine("c", &names);
        for (seq, v) in [&names[..], &["b", "c", "d", "e"], &["c", "d", "e", "a"], &["a", "b", "d", "e", "c"]]
            .into_iter()
            .enumerate()
        {
            let v = view(seq as u64 + 1, v);
            c.daemon_key(v.id, &[9; 32]).unwrap();
            assert_eq!(c.on_view(&v, &mut OsRng).unwrap().len(), 1, "{:?}", v.members);
        }
        let without = view(9, &["a", "b", "d", "e"]);
        assert!(matches!(c.on_view(&without, &mut OsRng), Err(Error::BadView(_))));
        assert!(matches!(c.observe(&view(10, &["a"])), Err(Error::BadView(_))));
    }
}
