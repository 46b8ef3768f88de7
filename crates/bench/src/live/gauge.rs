//! `conclave gauge --engine daemon`: SEAL's Gauger on real sessions, in
//! wall-clock time.
//!
//! The members are `conclave-secure` sessions, each on its own connection
//! and in its own task, started and driven as the daemon engine of
//! `bench events` starts and drives them ([`Group::<Secure>::start`],
//! [`scripted`]), over the embedded daemon or, with `--cluster N`, the
//! Corosync cluster ([`Target::run`]). The churn is the simulator's
//! (`gauge::first_change`, `gauge::next_stay`: the same draws from the same
//! seed), in real seconds; the leader's ticks are the sessions' own (the
//! policy's period is `--interval`).
//!
//! What is read, per member and secure view ([`Report::meter`], read when
//! the view comes):
//! * **rekeying time**: the view's `rekey_time`, which under interval
//!   rekeying runs from the first rekey message the member received since
//!   its last install to the key's confirmation by every member — SEAL §6's
//!   definition, the session's key confirmation included (the simulator
//!   stops at the install, after the engine's own, SEAL §3.5's); per view,
//!   from the view to the confirmed key;
//! * **exponentiations, blinded keys, BKEY packets, restarts, rekeys led**:
//!   the differences of the member's [`Meter`] since its previous secure
//!   view, or since it joined (a join starts a fresh engine). So everything
//!   a member spent between two installs is charged to the second, which
//!   is the simulator's rekeying operation plus whatever it did outside one
//!   (nothing costly: views are followed, not rekeyed). The baseline's
//!   packets are its broadcasts.
//!
//! They are summed per epoch and averaged as the simulator averages them
//! (`gauge::summarize`). Queue-batch's split into Queue-subtree and
//! Queue-merge is the meter's (`IntervalStats::subtree_*`): the totals are
//! the differences, SEAL's terms the differences less Queue-subtree's. Not
//! measured here, and printed as `-`: the views the group went through (a
//! session shows only secure views) and the baseline's cascades. The
//! abandoned rekeys are rekey messages led minus rekeys, both as the
//! installing members' meters count them.
//!
//! All members share this machine's CPUs, so a rekey's time is close to the
//! sum of its members' cryptography divided by the cores, as in
//! `bench events --engine daemon`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use conclave_gka::{Epoch, SignatureId};
use conclave_secure::{Interval, MemberId, Meter, SecureEvent};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

use super::{Group, Secure, Target};
use crate::gauge::{first_change, next_stay, summarize, Counted, EndState, Policy, RekeyRecord, RunResult, Setup};
use conclave_testkit::scripted::Report;

/// How long the group may take, once the churn stops, to settle on one key
/// of its members, beyond two intervals (the next tick, and one more if a
/// view abandons that rekey).
const SETTLE: Duration = Duration::from_secs(30);

/// The secure policy the members run under `policy`.
fn secure_policy(policy: Policy, setup: &Setup) -> conclave_secure::Policy {
    let Some(a) = policy.algorithm() else {
        return conclave_secure::Policy::new(conclave_gka::ProtocolId::Tgdh, conclave_gka::GroupId::Ristretto255);
    };
    let mut p = conclave_secure::Policy::interval(a, Duration::from_secs_f64(setup.interval));
    let rekey_on_leave = matches!(policy, Policy::OnLeave(_));
    p.interval = Some(Interval { rekey_on_leave, ..p.interval.expect("an interval policy") });
    p
}

/// Where a member stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stand {
    Out,
    In,
    /// Asked to leave; its `Left` has not come yet.
    Leaving,
}

struct Member {
    stand: Stand,
    /// The churn wants it in (it may still be leaving).
    wants_in: bool,
    /// Its next churn change.
    next: Instant,
    /// Its meter at its last secure view (zero at a join).
    last: Meter,
    /// Its last secure view since it joined: key fingerprint and members.
    key: Option<(String, Vec<MemberId>)>,
}

/// Sums over the members that installed one epoch.
#[derive(Default)]
struct Acc {
    start_s: f64,
    members: usize,
    time_s: f64,
    exps: u64,
    bks: u64,
    packets: u64,
    restarts: u64,
    /// Of `exps`, `bks` and `packets`, Queue-subtree's.
    sub_exps: u64,
    sub_bks: u64,
    sub_packets: u64,
    /// Some member's engine keyed T' in the rekey's run.
    in_run: bool,
    /// SEAL's counts (`IntervalStats::path_bks_not_blinded`,
    /// `reactive_packets_sent`).
    path_bks: u64,
    reactive: u64,
    copath: u64,
    copath_reactive: u64,
}

/// Runs one policy over the churn of `setup` on `target`'s daemons;
/// `progress` is told the seconds of churn gone.
pub(crate) fn run_once(
    target: &Target,
    setup: &Setup,
    policy: Policy,
    progress: &mut dyn FnMut(f64),
) -> Result<RunResult> {
    let secure = secure_policy(policy, setup);
    target.run(|sockets, tag| async move {
        let group = Group::<Secure>::start(&sockets, secure, SignatureId::Ed25519, setup.members, tag, setup.seed)
            .await
            .context("starting the members")?;
        drive(group, tag, setup, policy, progress).await
    })
}

async fn drive(
    mut group: Group<Secure>,
    tag: usize,
    setup: &Setup,
    policy: Policy,
    progress: &mut dyn FnMut(f64),
) -> Result<RunResult> {
    let names: Vec<MemberId> =
        (0..setup.members).map(|i| MemberId::new(format!("b{tag}-{i}"))).collect::<Result<_, _>>()?;
    let mut churn = ChaCha20Rng::seed_from_u64(setup.seed);
    let t0 = Instant::now();
    let us = |v: u64| Duration::from_micros(v);
    let mut members: Vec<Member> = (0..setup.members)
        .map(|i| Member {
            stand: Stand::Out,
            wants_in: false,
            next: t0 + us(first_change(&mut churn, setup, i)),
            last: Meter::default(),
            key: None,
        })
        .collect();
    let end = t0 + Duration::from_secs_f64(setup.duration_s);
    let mut rekeys: BTreeMap<Epoch, Acc> = BTreeMap::new();
    let mut led = 0u64;
    let interval_like = policy.algorithm().is_some();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    // The churn, until the end of the run.
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        // Due changes.
        for i in 0..members.len() {
            if members[i].next > now {
                continue;
            }
            let m = &mut members[i];
            m.wants_in = !m.wants_in;
            m.next += us(next_stay(&mut churn, setup, m.wants_in));
            apply(&mut group, &mut members, i)?;
        }
        let next = members.iter().map(|m| m.next).min().unwrap_or(end).min(end);
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = tick.tick() => progress(t0.elapsed().as_secs_f64().min(setup.duration_s)),
            r = group.reports.recv() => {
                let r = r.ok_or_else(|| anyhow!("every member stopped"))?;
                on_report(r, &mut group, &mut members, &mut rekeys, &mut led, t0)?;
            }
        }
    }
    progress(setup.duration_s);
    // No more churn: wait until every member in holds one key, of the members in.
    let deadline = Instant::now() + Duration::from_secs_f64(2.0 * setup.interval) + SETTLE;
    while !settled(&members) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, group.reports.recv()).await {
            Ok(Some(r)) => on_report(r, &mut group, &mut members, &mut rekeys, &mut led, t0)?,
            Ok(None) => bail!("every member stopped"),
            Err(_) => break, // the end check below says what is wrong
        }
    }
    let inside: Vec<MemberId> =
        members.iter().zip(&names).filter(|(m, _)| m.stand != Stand::Out).map(|(_, n)| n.clone()).collect();
    let end: Vec<EndState> = members
        .iter()
        .zip(&names)
        .filter(|(m, _)| m.stand != Stand::Out)
        .map(|(m, n)| (n.clone(), inside.clone(), m.key.clone()))
        .collect();
    let records: Vec<RekeyRecord> = rekeys
        .into_values()
        .map(|a| {
            let n = a.members.max(1) as f64;
            let queued = policy.algorithm() == Some(conclave_gka::IntervalAlgorithm::QueueBatch) && a.sub_exps > 0;
            RekeyRecord {
                at_s: a.start_s,
                members: a.members,
                time_s: a.time_s / n,
                exps: (a.exps - a.sub_exps) as f64 / n,
                blinded_keys: interval_like.then_some(a.bks - a.sub_bks),
                packets: a.packets - a.sub_packets,
                restarts: interval_like.then_some(a.restarts),
                total_exps: a.exps as f64 / n,
                total_blinded_keys: interval_like.then_some(a.bks),
                total_packets: a.packets,
                subtree_in_run: queued.then_some(a.in_run),
                seal_exps: interval_like.then(|| (a.exps - a.sub_exps + a.path_bks) as f64 / n),
                reactive_packets: interval_like.then_some(a.reactive),
                copath_packets: interval_like.then_some(a.copath),
                copath_reactive_packets: interval_like.then_some(a.copath_reactive),
                // The sessions' meters do not count rekey messages received.
                rekey_packets: None,
            }
        })
        .collect();
    let restarts = interval_like.then(|| records.iter().filter_map(|r| r.restarts).sum());
    let abandoned = interval_like.then(|| led.saturating_sub(records.len() as u64));
    let counted = Counted { restarts, abandoned, views: None };
    Ok(summarize(setup, policy, records, counted, end))
}

/// Brings member `i`'s session to what the churn wants: joins it (once its
/// last leave is through) or asks it to leave.
fn apply(group: &mut Group<Secure>, members: &mut [Member], i: usize) -> Result<()> {
    let m = &mut members[i];
    match (m.wants_in, m.stand) {
        (true, Stand::Out) => {
            m.stand = Stand::In;
            m.last = Meter::default();
            m.key = None;
            group.join(i)
        }
        (false, Stand::In) => {
            m.stand = Stand::Leaving;
            group.leave(i)
        }
        // Still leaving (joins when its Left comes), or already as wanted.
        _ => Ok(()),
    }
}

/// Every member in (none leaving) shows one key, whose members are those in.
fn settled(members: &[Member]) -> bool {
    if members.iter().any(|m| m.stand == Stand::Leaving) {
        return false;
    }
    let inside: Vec<usize> = (0..members.len()).filter(|&i| members[i].stand == Stand::In).collect();
    let Some(first) = inside.first().and_then(|&i| members[i].key.as_ref()) else { return inside.is_empty() };
    inside.iter().all(|&i| members[i].key.as_ref().is_some_and(|(fp, ms)| fp == &first.0 && ms.len() == inside.len()))
}

fn on_report(
    r: Report<usize>,
    group: &mut Group<Secure>,
    members: &mut [Member],
    rekeys: &mut BTreeMap<Epoch, Acc>,
    led: &mut u64,
    t0: Instant,
) -> Result<()> {
    let who = r.who;
    let event = r.event.map_err(|e| anyhow!("member {who}: {e}"))?;
    match event {
        SecureEvent::View(v) => {
            let m = &mut members[who];
            let meter = r.meter.ok_or_else(|| anyhow!("member {who}: a secure view without its meter"))?;
            let (c0, c1) = (m.last.costs, meter.costs);
            let (s0, s1) = (m.last.interval.unwrap_or_default(), meter.interval.unwrap_or_default());
            m.last = meter;
            m.key = Some((v.fingerprint.clone(), v.members.to_vec()));
            let acc = rekeys.entry(v.epoch).or_insert_with(|| Acc { start_s: f64::MAX, ..Acc::default() });
            let start = r.at.checked_sub(v.rekey_time).unwrap_or(t0).saturating_duration_since(t0);
            acc.start_s = acc.start_s.min(start.as_secs_f64());
            acc.members += 1;
            acc.time_s += v.rekey_time.as_secs_f64();
            acc.exps += c1.exps - c0.exps;
            match meter.interval {
                Some(_) => {
                    acc.bks += s1.bks_sent - s0.bks_sent;
                    acc.packets += s1.packets_sent - s0.packets_sent;
                    acc.restarts += s1.restarts - s0.restarts;
                    acc.sub_exps += s1.subtree_exps - s0.subtree_exps;
                    acc.sub_bks += s1.subtree_bks_sent - s0.subtree_bks_sent;
                    acc.sub_packets += s1.subtree_packets_sent - s0.subtree_packets_sent;
                    acc.in_run |= s1.keyed_in_run > s0.keyed_in_run;
                    acc.path_bks += s1.path_bks_not_blinded - s0.path_bks_not_blinded;
                    acc.reactive += s1.reactive_packets_sent - s0.reactive_packets_sent;
                    acc.copath += s1.copath_packets_sent - s0.copath_packets_sent;
                    acc.copath_reactive += s1.copath_reactive_packets_sent - s0.copath_reactive_packets_sent;
                    *led += s1.rekeys_led - s0.rekeys_led;
                }
                None => acc.packets += c1.broadcasts - c0.broadcasts,
            }
        }
        SecureEvent::Left { .. } => {
            members[who].stand = Stand::Out;
            members[who].key = None;
            apply(group, members, who)?;
        }
        SecureEvent::DaemonError { code, text } => bail!("member {who}: the daemon says {code:?}: {text}"),
        SecureEvent::PolicyMismatch { .. } | SecureEvent::Excluded { .. } => {
            bail!("member {who}: {event:?}")
        }
        // Messages, refusals of single messages, the waiting list: not counted.
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_gka::IntervalAlgorithm;

    /// A few seconds of churn over the embedded daemon.
    fn setup() -> Setup {
        Setup {
            members: 5,
            machines: 1,
            t_in: 0.6,
            t_out: 0.6,
            constant: 0.4,
            interval: 0.5,
            duration_s: 4.0,
            seed: 3,
            costs: crate::gauge::GaugeCosts::Measured,
        }
    }

    #[test]
    fn real_sessions_churn_rekey_by_interval_and_end_with_one_key() {
        let target = Target::start(None, crate::scenario::Wan::Lan, &mut std::io::sink()).unwrap();
        for p in [Policy::Interval(IntervalAlgorithm::QueueBatch), Policy::PerView] {
            let mut seen = Vec::new();
            let r = run_once(&target, &setup(), p, &mut |s| seen.push(s)).unwrap();
            let inside = crate::gauge::agreed(&r).unwrap_or_else(|e| panic!("{p:?}: {e:#}"));
            assert_eq!(inside, r.end.len());
            let s = &r.summary;
            assert!(s.rekeys > 1 && s.exps > 0.0 && s.bkey_packets > 0.0 && s.rekey_time_s > 0.0, "{p:?}: {s:?}");
            assert_eq!(seen.last(), Some(&4.0), "{p:?}: progress reaches the end of the churn");
            assert_eq!(r.views, None, "a session shows no daemon views");
            match p {
                Policy::PerView => assert!(s.blinded_keys.is_none() && s.restarts.is_none()),
                _ => {
                    assert!(s.blinded_keys.is_some_and(|b| b > 0.0) && s.restarts.is_some(), "{s:?}");
                    // Every rekey is one interval's batch: members per rekey above one.
                    assert!(r.rekeys.iter().any(|k| k.members > 1), "{:?}", r.rekeys);
                }
            }
        }
    }
}
