//! Burmester-Desmedt (TISSEC §4.5, Fig. 9).
//!
//! Stateless: every view runs the whole protocol among all members, so a
//! membership event of any kind costs the same, and a cascaded view simply
//! starts a new run.
//!
//! * Round 1: member i picks r_i and broadcasts Z_i = g^{r_i}.
//! * Round 2: having Z_{i-1} and Z_{i+1} (indices cyclic in view order), it
//!   broadcasts X_i = (Z_{i+1}/Z_{i-1})^{r_i}.
//! * Step 3: having every X, member j computes
//!   K = Z_{j-1}^{n·r_j} · X_j^{n-1} · X_{j+1}^{n-2} ··· X_{j+n-2}
//!   = g^{r_1 r_2 + r_2 r_3 + ··· + r_n r_1}: three full exponentiations per
//!   member, plus the n−1 small-exponent ones the paper calls BD's hidden cost
//!   (metered as `small_exps`). The key is installed when the last X is
//!   delivered, the same message at every member.
//!
//! Only the Z of the two neighbours are raised to the secret r_j, so only
//! they are checked to lie in the prime-order subgroup as they come. The X
//! are raised to public exponents only: they are checked once, in their
//! product Π X_{j+k}^{n-1-k}, before it is multiplied into the key, and
//! the one X the key leaves out, X_{j-1}, alone (with MODP groups two
//! subgroup checks per member instead of n − 1: at n = 128 two thirds of a
//! join's CPU with RFC 5114's 2048-bit group). If either is outside the
//! subgroup, each X is checked to name who sent one outside it, and no key
//! is installed in this view.
//!
//! With two members X_i is the identity (Z_{i+1} = Z_{i-1}); the message then
//! carries a flag instead of an element, and the flag is refused for n > 2.
//! A member alone installs g^{r} from a fresh r.

use std::collections::BTreeMap;

use conclave_gcs::{MemberId, View};
use zeroize::Zeroize;

use super::{get_elem, get_elem_unchecked, put_elem};
use crate::codec::{DecodeError, Reader, Writer};
use crate::engine::{Change, Ctx, Error, Misbehaved, Protocol};
use crate::suite::{CryptoError, Group};
use crate::ProtocolId;

const ROUND_Z: u8 = 1;
const ROUND_X: u8 = 2;

/// One member's BD state for the current view.
pub struct Bd<G: Group> {
    r: Option<G::Scalar>,
    z: BTreeMap<MemberId, G::Element>,
    x: BTreeMap<MemberId, Option<G::Element>>,
    sent_x: bool,
    done: bool,
}

impl<G: Group> Drop for Bd<G> {
    fn drop(&mut self) {
        if let Some(r) = self.r.as_mut() {
            r.zeroize();
        }
    }
}

impl<G: Group> Bd<G> {
    fn neighbours(cx: &Ctx<'_, G>, m: &MemberId) -> (MemberId, MemberId) {
        let n = cx.view.members.len();
        let i = cx.position(m).expect("member of the view");
        (cx.view.members[(i + n - 1) % n].id.clone(), cx.view.members[(i + 1) % n].id.clone())
    }

    fn progress(&mut self, cx: &mut Ctx<'_, G>) -> Result<(), Error> {
        let n = cx.view.members.len();
        let Some(r) = self.r.clone() else { return Ok(()) };
        let (prev, next) = Self::neighbours(cx, cx.me);
        if !self.sent_x {
            if let (Some(zp), Some(zn)) = (self.z.get(&prev), self.z.get(&next)) {
                let (zp, zn) = (zp.clone(), zn.clone());
                let mut w = Writer::new();
                if n == 2 {
                    w.u8(0);
                } else {
                    let x = cx.exp(&cx.g.div(&zn, &zp), &r);
                    w.u8(1);
                    put_elem(&mut w, cx.g, &x);
                }
                self.sent_x = true;
                cx.broadcast(ROUND_X, w.buf);
            }
        }
        if self.done || self.x.len() < n {
            return Ok(());
        }
        let Some(zp) = self.z.get(&prev).cloned() else { return Ok(()) };
        self.done = true;
        // K = Z_{j-1}^{n r_j} · Π_{k=0}^{n-2} X_{j+k}^{n-1-k}
        let j = cx.position(cx.me).expect("member of the view");
        let mut product = cx.g.identity();
        for step in 0..n - 1 {
            let m = &cx.view.members[(j + step) % n].id;
            if let Some(Some(x)) = self.x.get(m) {
                let x = x.clone();
                let t = cx.exp_small(&x, (n - 1 - step) as u64);
                product = cx.g.mul(&product, &t);
            }
        }
        // The one X the key leaves out, X_{j-1}, is checked too, so that
        // every member refuses a run with any X outside the subgroup.
        let left_out = &cx.view.members[(j + n - 1) % n].id;
        let left_out_outside = matches!(self.x.get(left_out), Some(Some(x)) if !cx.g.in_subgroup(x));
        if left_out_outside || !cx.g.in_subgroup(&product) {
            let culprit = cx
                .view
                .members
                .iter()
                .map(|m| &m.id)
                .find(|m| matches!(self.x.get(*m), Some(Some(x)) if !cx.g.in_subgroup(x)));
            // Elements inside the subgroup multiply to one inside it, so
            // there is a culprit; the error stands without one all the same.
            return Err(match culprit {
                Some(m) => Misbehaved::OutsideTheGroup { round: ROUND_X }.by(m),
                None => Error::Crypto(CryptoError::InvalidElement),
            });
        }
        let mut nr = cx.g.scalar_mul(&cx.g.scalar_from_u64(n as u64), &r);
        let mut k = cx.exp(&zp, &nr);
        nr.zeroize();
        k = cx.g.mul(&k, &product);
        cx.install(&k);
        k.zeroize();
        Ok(())
    }
}

impl<G: Group> Protocol<G> for Bd<G> {
    const ID: ProtocolId = ProtocolId::Bd;

    fn new() -> Self {
        Self { r: None, z: BTreeMap::new(), x: BTreeMap::new(), sent_x: false, done: false }
    }

    fn reset(&mut self) {
        *self = Self::new();
    }

    fn on_view(&mut self, cx: &mut Ctx<'_, G>, _change: &Change) -> Result<(), Error> {
        *self = Self::new();
        let r = cx.random();
        let z = cx.exp_g(&r);
        if cx.view.members.len() == 1 {
            self.done = true;
            cx.install(&z);
            return Ok(());
        }
        self.r = Some(r);
        let mut w = Writer::new();
        put_elem(&mut w, cx.g, &z);
        cx.broadcast(ROUND_Z, w.buf);
        Ok(())
    }

    fn on_message(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, round: u8, body: &[u8]) -> Result<(), Error> {
        let n = cx.view.members.len();
        let mut r = Reader::new(body);
        match round {
            ROUND_Z => {
                let z = get_elem(&mut r, cx.g)?;
                r.finish()?;
                if self.z.contains_key(from) {
                    return Err(Misbehaved::Duplicate { round }.by(from));
                }
                self.z.insert(from.clone(), z);
            }
            ROUND_X => {
                let x = match r.u8("flag")? {
                    0 if n == 2 => None,
                    1 if n > 2 => Some(get_elem_unchecked(&mut r, cx.g)?),
                    _ => return Err(Error::Decode(DecodeError::Bad("BD round-2 flag"))),
                };
                r.finish()?;
                if self.x.contains_key(from) {
                    return Err(Misbehaved::Duplicate { round }.by(from));
                }
                self.x.insert(from.clone(), x);
            }
            _ => return Err(Misbehaved::UnknownRound { round }.by(from)),
        }
        self.progress(cx)
    }

    fn wants(&self, view: &View, me: usize, from: &MemberId, round: u8) -> bool {
        // Round-1 values matter only from the two neighbours; every X matters.
        if round != ROUND_Z {
            return true;
        }
        let (n, i) = (view.members.len(), me);
        view.members[(i + n - 1) % n].id == *from || view.members[(i + 1) % n].id == *from
    }

    fn secrets(&self) -> (Vec<G::Scalar>, Vec<G::Element>) {
        (self.r.iter().cloned().collect(), Vec::new())
    }

    fn public_elements(g: &G, round: u8, body: &[u8]) -> Result<Vec<G::Element>, Error> {
        let mut r = Reader::new(body);
        match round {
            ROUND_Z => Ok(vec![get_elem(&mut r, g)?]),
            ROUND_X if r.u8("flag")? == 1 => Ok(vec![get_elem(&mut r, g)?]),
            _ => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ROUND_X, ROUND_Z};
    use crate::codec::Writer;
    use crate::engine::Misbehaved;
    use crate::protocols::testnet::{id, Net};
    use crate::suite::modp::Modp;
    use crate::suite::ristretto::Ristretto255;
    use crate::suite::{Group, GroupId};
    use crate::ProtocolId;

    fn elem() -> Vec<u8> {
        let g = Ristretto255;
        g.encode(&g.exp_generator(&g.scalar_from_u64(7)))
    }

    #[test]
    fn second_values_and_unknown_rounds_prove_misbehaviour() {
        let mut net = Net::new(ProtocolId::Bd, &["a", "b", "c"], 4);
        net.view(1, &["a", "b", "c"], &["a", "b", "c"]);
        // a's round-1 value reaches its neighbours b and c; a second one is a proof.
        let z = net.step().expect("a's round-1 value");
        assert_eq!(z.from, id("a"));
        let dup = Misbehaved::Duplicate { round: ROUND_Z };
        assert_eq!(net.reject("b", "a", None, ROUND_Z, elem()), dup.by(&id("a")));
        assert_eq!(net.reject("c", "b", None, 9, elem()), Misbehaved::UnknownRound { round: 9 }.by(&id("b")));
        net.run();
        net.agreed();
        let mut x = Writer::new();
        x.u8(1).raw(&elem());
        let dup = Misbehaved::Duplicate { round: ROUND_X };
        assert_eq!(net.reject("a", "c", None, ROUND_X, x.buf), dup.by(&id("c")));
    }

    /// An insider's round-2 value outside the prime-order subgroup is taken
    /// unchecked, found in the product, and its sender named; nobody installs
    /// a key, and nobody raised it to a secret exponent (the only exponents
    /// applied to round-2 values are public).
    #[test]
    fn a_round_two_value_outside_the_group_is_found_in_the_product_and_its_sender_named() {
        let g = Modp::new(GroupId::Modp512);
        let len = g.element_len();
        let outside = (2u8..)
            .map(|h| [vec![0; len - 1], vec![h]].concat())
            .find(|b| g.decode(b).is_err())
            .expect("a small element outside the subgroup");
        assert!(g.decode_unchecked(&outside).is_ok());
        let mut net = Net::in_group(ProtocolId::Bd, GroupId::Modp512, &["a", "b", "c"], 5);
        net.view(1, &["a", "b", "c"], &["a", "b", "c"]);
        // Every round-1 value; the round-2 values wait.
        while let Some(i) = net.queue.iter().position(|p| p.round == ROUND_Z) {
            let p = net.take(i);
            net.deliver(&p);
        }
        // a's and b's honest round-2 values; c's is one outside the subgroup.
        let honest: Vec<_> = net.queue.drain(..).filter(|p| p.round == ROUND_X && p.from != id("c")).collect();
        assert_eq!(honest.len(), 2);
        let mut w = Writer::new();
        w.u8(1).raw(&outside);
        let bad = net.forge("c", None, ROUND_X, w.buf);
        for p in &honest {
            net.deliver(p);
        }
        for m in ["a", "b", "c"].map(id).into_iter().filter(|m| *m != bad.from) {
            let err = net.offer(m.as_str(), &bad).expect_err("the last round-2 value ends the run");
            assert_eq!(err, Misbehaved::OutsideTheGroup { round: ROUND_X }.by(&bad.from), "{m}");
            assert!(net.key(m.as_str()).is_none(), "{m} installed a key");
        }
    }
}
