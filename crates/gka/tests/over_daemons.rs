//! Key agreement over simulated daemons: every engine is a client of a real
//! daemon core (`conclave_gcs::daemon_sim`), with network loss and jitter,
//! crypto charged to its machine's virtual CPU, members coming and going,
//! and the daemons partitioning and merging. After every disturbance dies
//! down, each member of each group view holds that view's key, and all hold
//! the same one.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use conclave_gcs::core::{ConnId, Delivery, Op, Service};
use conclave_gcs::daemon_sim::{DaemonSim, Micros, NetConfig, Reaction};
use conclave_gcs::{GroupName, MemberId, View};
use conclave_gka::suite::{generate_signer, SignatureId};
use conclave_gka::{new_engine, Config, Engine, GroupId, Output, ProtocolId, StaticDirectory};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

/// Virtual CPU charged per exponentiation and per signature or verification
/// (the order of ristretto255 and Ed25519 on this machine).
const EXP: Micros = 60;
const SIG: Micros = 30;

struct Member {
    engine: Box<dyn Engine>,
    rng: ChaCha20Rng,
    view: Option<View>,
}

fn group() -> GroupName {
    GroupName::new("secure").unwrap()
}

/// Feeds one delivery to a member's engine and turns its outputs into
/// daemon operations, charging the crypto it did.
fn react(conn: ConnId, m: &mut Member, d: &Delivery) -> Reaction {
    let before = m.engine.costs();
    let outputs = match d {
        Delivery::View { view, .. } => {
            m.view = Some(view.clone());
            m.engine.on_view(view, &mut m.rng).expect("a view is always accepted")
        }
        Delivery::Message { sender, payload, .. } | Delivery::Unicast { sender, payload, .. } => {
            // Late messages of an abandoned run are refused; that is expected.
            m.engine.on_message(sender, payload, &mut m.rng).unwrap_or_default()
        }
        _ => Vec::new(),
    };
    let after = m.engine.costs();
    let cpu = (after.exps - before.exps) * EXP + (after.sigs + after.verifs - before.sigs - before.verifs) * SIG;
    let ops = outputs
        .into_iter()
        .filter_map(|o| match o {
            Output::Send { to: None, bytes } => {
                Some(Op::Multicast { conn, group: group(), service: Service::Agreed, payload: Bytes::from(bytes) })
            }
            Output::Send { to: Some(to), bytes } => {
                Some(Op::Unicast { conn, group: group(), to, payload: Bytes::from(bytes) })
            }
            Output::Installed(_) => None,
        })
        .collect();
    Reaction { ops, cpu }
}

fn run(protocol: ProtocolId, seed: u64) {
    let daemons = 3;
    let net = NetConfig { loss: 0.02, jitter: 100, detect: 200_000, ..NetConfig::default() };
    let mut sim = DaemonSim::new(daemons, net, seed).unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let names: Vec<MemberId> = (0..9).map(|i| MemberId::new(format!("m{i}")).unwrap()).collect();
    let mut directory = StaticDirectory::new();
    let mut signers = Vec::new();
    for n in &names {
        let s = generate_signer(SignatureId::Ed25519, &mut rng).unwrap();
        directory.insert(n.clone(), s.verifier());
        signers.push(s);
    }
    let directory = Arc::new(directory);
    let mut members: BTreeMap<ConnId, Member> = BTreeMap::new();
    let mut conns = Vec::new();
    for (i, (name, signer)) in names.iter().zip(signers).enumerate() {
        let conn = sim.open((i % daemons as usize) as u16).unwrap();
        let config = Config {
            protocol,
            group_id: GroupId::Ristretto255,
            group: group().as_str().to_string(),
            me: name.clone(),
            signer,
            directory: directory.clone(),
        };
        let engine = new_engine(config);
        members.insert(conn, Member { engine, rng: ChaCha20Rng::seed_from_u64(rng.next_u64()), view: None });
        conns.push(conn);
        sim.submit(Op::Connect { conn, name: name.clone() });
    }
    let step = |sim: &mut DaemonSim, members: &mut BTreeMap<ConnId, Member>, until: Micros| {
        sim.run_until(until, &mut |_, conn, d| react(conn, members.get_mut(&conn).expect("member"), d));
    };
    // Six members join one by one, then churn: joins, leaves, a partition
    // and its merge, some of them cascading into running rekeys.
    for &c in &conns[..6] {
        sim.submit(Op::Join { conn: c, group: group(), open: false, mode: conclave_gcs::core::GroupMode::Members });
        let t = sim.now() + rng.next_u64() % 30_000;
        step(&mut sim, &mut members, t);
    }
    let mut inside = [true, true, true, true, true, true, false, false, false];
    for round in 0..8 {
        match rng.next_u64() % 4 {
            0 => sim.reconfigure(&[&[0, 1], &[2]]).unwrap(),
            1 => sim.reconfigure(&[&[0, 1, 2]]).unwrap(),
            _ => {
                let i = (rng.next_u64() % conns.len() as u64) as usize;
                let op = if inside[i] {
                    Op::Leave { conn: conns[i], group: group() }
                } else {
                    Op::Join {
                        conn: conns[i],
                        group: group(),
                        open: false,
                        mode: conclave_gcs::core::GroupMode::Members,
                    }
                };
                inside[i] = !inside[i];
                sim.submit(op);
            }
        }
        // Sometimes wait for quiet, sometimes cascade into the running rekey.
        let t = if round % 2 == 0 { sim.now() + rng.next_u64() % 5_000 } else { Micros::MAX };
        step(&mut sim, &mut members, t);
    }
    sim.reconfigure(&[&[0, 1, 2]]).unwrap();
    step(&mut sim, &mut members, Micros::MAX);

    // Every member in the group holds its view's key, and one key per view.
    let mut keys: BTreeMap<_, (MemberId, String)> = BTreeMap::new();
    for (i, c) in conns.iter().enumerate() {
        let m = &members[c];
        if !inside[i] {
            continue;
        }
        let view = m.view.as_ref().unwrap_or_else(|| panic!("{} never saw a view", names[i]));
        let sv = m.engine.secure_view().unwrap_or_else(|| panic!("{protocol} seed {seed}: {} has no key", names[i]));
        assert_eq!(sv.view_id, view.id, "{protocol} seed {seed}: {} holds the key of another view", names[i]);
        let fp = sv.key.fingerprint();
        if let Some((other, k)) = keys.get(&view.id) {
            assert_eq!(*k, fp, "{protocol} seed {seed}: {} and {other} hold different keys", names[i]);
        }
        keys.insert(view.id, (names[i].clone(), fp));
    }
    assert_eq!(keys.len(), 1, "{protocol} seed {seed}: after the heal everyone should share one view");
}

macro_rules! over_daemons {
    ($($name:ident: $p:expr),*) => {$(
        #[test]
        fn $name() {
            for seed in 0..6 {
                run($p, seed);
            }
        }
    )*};
}

over_daemons!(gdh: ProtocolId::Gdh, ckd: ProtocolId::Ckd, tgdh: ProtocolId::Tgdh, str: ProtocolId::Str, bd: ProtocolId::Bd);
