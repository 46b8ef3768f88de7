//! What the keyed-daemon tests share: simulated daemons, each a
//! `KeyedDaemon` that trusts the others' fixed identities.

use std::sync::Arc;

use conclave_gcs::core::{Core, DaemonId, Limits, Machine};
use conclave_gcs::daemon_sim::{DaemonSim, NetConfig};
use conclave_gka::suite::ed25519::Ed25519Signer;
use conclave_gka::suite::Signer;
use conclave_integrated::{DaemonIdentities, KeyedDaemon};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

/// `n` simulated keyed daemons on `net`, daemon `d` signing with a key
/// from seed `d + 1` and trusting every other's; each set up by `tweak`.
pub fn keyed_sim(n: u16, net: NetConfig, seed: u64, tweak: impl Fn(KeyedDaemon) -> KeyedDaemon + 'static) -> DaemonSim {
    keyed_sim_machines(n, net, seed, move |_, daemon| Box::new(tweak(daemon)))
}

/// Daemon `d`'s signing key in [`keyed_sim`].
pub fn daemon_signer(d: u16) -> Arc<dyn Signer> {
    Arc::new(Ed25519Signer::from_seed(&[d as u8 + 1; 32]))
}

/// As [`keyed_sim`], each daemon made into a machine by `wrap`.
pub fn keyed_sim_machines(
    n: u16,
    net: NetConfig,
    seed: u64,
    wrap: impl Fn(DaemonId, KeyedDaemon) -> Box<dyn Machine> + 'static,
) -> DaemonSim {
    let keys: Vec<_> = (0..n).map(|d| (DaemonId(d), daemon_signer(d).verifier())).collect();
    let make = move |id: DaemonId, incarnation: u64| -> Box<dyn Machine> {
        let identities = DaemonIdentities::new(daemon_signer(id.0), keys.clone());
        let rng = Box::new(ChaCha20Rng::seed_from_u64(incarnation));
        wrap(id, KeyedDaemon::new(Core::new(id, Limits::default(), incarnation), identities, rng))
    };
    DaemonSim::with_machines(n, net, seed, Box::new(make)).unwrap()
}
