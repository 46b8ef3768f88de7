//! The simulator's CPU scheduler: a discrete-event, work-conserving,
//! non-preemptive scheduler of the members' jobs on their machines' CPUs.
//!
//! * A member handles one input at a time, in arrival order (its inbox is a
//!   FIFO queue); a job is *ready* when it has arrived and its member is idle.
//! * Any ready job runs on any free CPU of its member's machine: a job never
//!   waits while a CPU of its machine is idle (work conservation). Among the
//!   ready jobs of a machine the one ready first runs first (ties: arrival order).
//! * A job's length is known only when it starts (the caller runs the engine
//!   then and charges what it did), so the caller drives the loop:
//!   [`Scheduler::next`] hands out the next job to start, and the caller
//!   reports its end with [`Scheduler::finish`] and what it sends with
//!   [`Scheduler::arrive`].
//!
//! Times are ms as `f64` at the interface and whole ns inside, so that equal
//! times compare equal.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};

/// A job handed out to start: member `member` starts `job` at `start` ms.
#[derive(Debug)]
pub(crate) struct Start<J> {
    pub member: usize,
    pub start: f64,
    pub job: J,
}

enum Ev<J> {
    Arrive(usize, J),
    Done(usize),
}

/// See the module documentation.
pub(crate) struct Scheduler<J> {
    machine_of: Vec<usize>,
    free: Vec<usize>,
    inbox: Vec<VecDeque<(u64, J)>>,
    running: Vec<bool>,
    /// Per machine: (ready since, arrival sequence, member) of every idle
    /// member with a job waiting.
    ready: Vec<BTreeSet<(u64, u64, usize)>>,
    events: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slots: Vec<Option<Ev<J>>>,
    seq: u64,
    now: u64,
}

fn ns(ms: f64) -> u64 {
    (ms * 1e6).round() as u64
}

impl<J> Scheduler<J> {
    /// Member i runs on machine `machine_of[i]`, which has `cpus[machine]` CPUs.
    pub fn new(machine_of: Vec<usize>, cpus: Vec<usize>) -> Self {
        let members = machine_of.len();
        assert!(machine_of.iter().all(|&m| m < cpus.len() && cpus[m] > 0), "every member on a machine with CPUs");
        Scheduler {
            machine_of,
            ready: vec![BTreeSet::new(); cpus.len()],
            free: cpus,
            inbox: (0..members).map(|_| VecDeque::new()).collect(),
            running: vec![false; members],
            events: BinaryHeap::new(),
            slots: Vec::new(),
            seq: 0,
            now: 0,
        }
    }

    fn push(&mut self, at: f64, ev: Ev<J>) {
        let at = ns(at);
        assert!(at >= self.now, "an event in the past: {at} ns < {} ns", self.now);
        self.events.push(Reverse((at, self.seq, self.slots.len())));
        self.slots.push(Some(ev));
        self.seq += 1;
    }

    /// `job` reaches `member`'s inbox at `at` ms (not before the current time).
    pub fn arrive(&mut self, member: usize, at: f64, job: J) {
        self.push(at, Ev::Arrive(member, job));
    }

    /// The job `member` started last ends at `end` ms (not before it started).
    pub fn finish(&mut self, member: usize, end: f64) {
        assert!(self.running[member], "member {member} finishes a job it does not run");
        self.push(end, Ev::Done(member));
    }

    /// The current time, ms.
    pub fn now(&self) -> f64 {
        self.now as f64 / 1e6
    }

    /// The next job to start, at the current time or later; `None` when
    /// every job has run. The caller must [`finish`](Self::finish) it before
    /// calling again.
    pub fn next(&mut self) -> Option<Start<J>> {
        loop {
            for machine in 0..self.free.len() {
                if self.free[machine] == 0 {
                    continue;
                }
                if let Some((_, _, member)) = self.ready[machine].pop_first() {
                    self.free[machine] -= 1;
                    self.running[member] = true;
                    let (_, job) = self.inbox[member].pop_front().expect("a ready member has a job");
                    return Some(Start { member, start: self.now(), job });
                }
            }
            // Nothing can start now: take every event of the next instant.
            let Reverse((t, _, _)) = *self.events.peek()?;
            self.now = t;
            while let Some(&Reverse((t2, _, slot))) = self.events.peek() {
                if t2 != t {
                    break;
                }
                self.events.pop();
                match self.slots[slot].take().expect("each event once") {
                    Ev::Arrive(member, job) => {
                        let seq = slot as u64;
                        self.inbox[member].push_back((seq, job));
                        if !self.running[member] && self.inbox[member].len() == 1 {
                            self.ready[self.machine_of[member]].insert((t, seq, member));
                        }
                    }
                    Ev::Done(member) => {
                        self.running[member] = false;
                        self.free[self.machine_of[member]] += 1;
                        if let Some(&(seq, _)) = self.inbox[member].front() {
                            self.ready[self.machine_of[member]].insert((t, seq, member));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::{RngCore, SeedableRng};

    /// A job of the tests: arrives at `at` for `member`, runs `ms`.
    #[derive(Clone, Copy, Debug)]
    struct Job {
        member: usize,
        at: f64,
        ms: f64,
    }

    /// Runs `jobs` (no job sends anything); returns each job's (start, end).
    fn schedule(machine_of: &[usize], cpus: &[usize], jobs: &[Job]) -> Vec<(f64, f64)> {
        let mut s = Scheduler::new(machine_of.to_vec(), cpus.to_vec());
        for (i, j) in jobs.iter().enumerate() {
            s.arrive(j.member, j.at, i);
        }
        let mut out = vec![(f64::NAN, f64::NAN); jobs.len()];
        while let Some(st) = s.next() {
            let end = st.start + jobs[st.job].ms;
            out[st.job] = (st.start, end);
            s.finish(st.member, end);
        }
        out
    }

    #[test]
    fn a_job_ready_beside_a_busy_member_takes_the_idle_cpu() {
        // Issue 16's example: member 0 is busy until 10 ms with a second job
        // queued; member 1's 0.4 ms job is ready at 1 ms on the same dual-CPU
        // machine, whose second CPU is idle. It runs at once, ending at 1.4 ms
        // (a scheduler that gives the second CPU to member 0's queued job
        // until member 0 is free ends it at 10.4 ms or later).
        let jobs = [
            Job { member: 0, at: 0.0, ms: 10.0 },
            Job { member: 0, at: 0.5, ms: 1.0 },
            Job { member: 1, at: 1.0, ms: 0.4 },
        ];
        let t = schedule(&[0, 0], &[2], &jobs);
        assert_eq!(t[0], (0.0, 10.0));
        assert!((t[2].0 - 1.0).abs() < 1e-9 && (t[2].1 - 1.4).abs() < 1e-9, "{t:?}");
        assert_eq!(t[1], (10.0, 11.0), "member 0 handles one input at a time");
    }

    /// Checks one schedule: every job after its arrival and its member's
    /// previous job, members one job at a time in arrival order, at most
    /// `cpus` jobs at once on a machine, and no job waiting while a CPU of its
    /// machine is idle.
    fn check(machine_of: &[usize], cpus: &[usize], jobs: &[Job], t: &[(f64, f64)]) {
        let eps = 1e-6;
        let running_at = |machine: usize, at: f64| {
            (0..jobs.len())
                .filter(|&k| machine_of[jobs[k].member] == machine && t[k].0 <= at + eps && at + eps < t[k].1)
                .count()
        };
        for (j, job) in jobs.iter().enumerate() {
            let (start, end) = t[j];
            assert!(start >= job.at - eps && (end - start - job.ms).abs() < eps, "job {j} {job:?}: {:?}", t[j]);
            let mine: Vec<usize> = (0..jobs.len()).filter(|&k| jobs[k].member == job.member).collect();
            for &k in &mine {
                if k != j {
                    assert!(
                        t[k].1 <= start + eps || t[k].0 >= end - eps,
                        "member {} runs jobs {j} and {k} at once",
                        job.member
                    );
                }
            }
            let ready = mine.iter().filter(|&&k| (jobs[k].at, k) < (job.at, j)).map(|&k| t[k].1).fold(job.at, f64::max);
            let machine = machine_of[job.member];
            let mut points: Vec<f64> = vec![ready];
            points.extend(t.iter().flat_map(|&(s, e)| [s, e]).filter(|&p| p > ready && p < start - eps));
            for p in points {
                let busy = running_at(machine, p);
                assert!(busy <= cpus[machine], "machine {machine} runs {busy} jobs at {p}");
                if start > ready + eps {
                    assert_eq!(
                        busy, cpus[machine],
                        "job {j} ({job:?}) ready at {ready} waits until {start} while machine {machine} has an idle CPU at {p}"
                    );
                }
            }
        }
    }

    #[test]
    fn random_job_sets_never_wait_beside_an_idle_cpu() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(16);
        let mut uniform = |k: u64| rng.next_u64() % k;
        for _ in 0..300 {
            let machines = 1 + uniform(3) as usize;
            let cpus: Vec<usize> = (0..machines).map(|_| 1 + uniform(2) as usize).collect();
            let members = 1 + uniform(7) as usize;
            let machine_of: Vec<usize> = (0..members).map(|_| uniform(machines as u64) as usize).collect();
            let jobs: Vec<Job> = (0..1 + uniform(25))
                .map(|_| Job {
                    member: uniform(members as u64) as usize,
                    // Whole 0.1 ms steps, so that equal times happen.
                    at: uniform(40) as f64 / 10.0,
                    ms: (1 + uniform(30)) as f64 / 10.0,
                })
                .collect();
            let t = schedule(&machine_of, &cpus, &jobs);
            check(&machine_of, &cpus, &jobs, &t);
        }
    }
}
