//! The member harness shared by the session tests: each member's session runs
//! in a task of its own (so every member makes progress), does what the test
//! hands it, and logs everything it delivers for the test to wait on.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conclave_secure::{Epoch, MemberId, Policy, SecureEvent, Session};
use tokio::sync::{mpsc, oneshot};

/// The group every test uses.
pub const GROUP: &str = "room";
/// Longest wait for anything a test expects.
pub const WAIT: Duration = Duration::from_secs(30);

type Job = Box<dyn FnOnce(&mut Session) + Send>;

/// A session in its own task, with its delivered events logged.
pub struct Member {
    pub name: String,
    jobs: mpsc::UnboundedSender<Job>,
    log: Arc<Mutex<Vec<SecureEvent>>>,
}

impl Member {
    /// Runs `session` in a task; the test fails if the session ends.
    pub fn spawn(name: &str, mut session: Session) -> Member {
        let (jobs, mut rx) = mpsc::unbounded_channel::<Job>();
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = log.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    job = rx.recv() => match job {
                        None => return,
                        Some(job) => job(&mut session),
                    },
                    ev = session.recv() => match ev {
                        Ok(ev) => l.lock().unwrap().push(ev),
                        Err(e) => panic!("session ended: {e}"),
                    },
                }
            }
        });
        Member { name: name.into(), jobs, log }
    }

    /// Has the member's task do `job` with its session.
    pub fn run(&self, job: impl FnOnce(&mut Session) + Send + 'static) {
        self.jobs.send(Box::new(job)).expect("the member's task runs");
    }

    /// Has the member's task do `job` with its session, and returns its answer.
    pub async fn ask<T: Send + 'static>(&self, job: impl FnOnce(&mut Session) -> T + Send + 'static) -> T {
        let (tx, rx) = oneshot::channel();
        self.run(move |s| {
            let _ = tx.send(job(s));
        });
        rx.await.expect("the member's task answers")
    }

    pub fn join(&self, policy: Policy) {
        self.run(move |s| s.join(GROUP, policy).unwrap());
    }
    pub fn send(&self, text: &str) {
        let data = text.as_bytes().to_vec();
        self.run(move |s| s.send(GROUP, &data).unwrap());
    }
    pub fn leave(&self) {
        self.run(|s| s.leave(GROUP).unwrap());
    }

    pub fn id(&self) -> MemberId {
        MemberId::new(self.name.clone()).unwrap()
    }

    pub fn events(&self) -> Vec<SecureEvent> {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the log satisfies `f`, and returns what `f` found.
    pub async fn until<T>(&self, what: &str, f: impl Fn(&[SecureEvent]) -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(t) = f(&self.log.lock().unwrap()) {
                return t;
            }
            assert!(start.elapsed() < WAIT, "{}: timed out waiting for {what}; log: {:#?}", self.name, self.events());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The latest secure view with exactly these members: (epoch, fingerprint).
    pub async fn until_view(&self, names: &[&str]) -> (Epoch, String) {
        self.until(&format!("view {names:?}"), |log| {
            log.iter().rev().find_map(|e| match e {
                SecureEvent::View(v) if v.members.iter().map(|m| m.as_str()).eq(names.iter().copied()) => {
                    Some((v.epoch, v.fingerprint.clone()))
                }
                _ => None,
            })
        })
        .await
    }

    /// The first secure view with exactly these members after epoch `after`.
    pub async fn until_view_after(&self, names: &[&str], after: Epoch) -> (Epoch, String) {
        self.until_view_where(names, &format!("after epoch {after}"), |e| e > after).await
    }

    /// The first secure view with exactly these members at epoch `from` or later.
    pub async fn until_view_from(&self, names: &[&str], from: Epoch) -> (Epoch, String) {
        self.until_view_where(names, &format!("from epoch {from}"), |e| e >= from).await
    }

    async fn until_view_where(&self, names: &[&str], what: &str, f: impl Fn(Epoch) -> bool) -> (Epoch, String) {
        self.until(&format!("view {names:?} {what}"), |log| {
            log.iter().find_map(|e| match e {
                SecureEvent::View(v)
                    if f(v.epoch) && v.members.iter().map(|m| m.as_str()).eq(names.iter().copied()) =>
                {
                    Some((v.epoch, v.fingerprint.clone()))
                }
                _ => None,
            })
        })
        .await
    }

    /// The epoch in which this member received `text`, once it has.
    pub async fn until_msg(&self, text: &str) -> Epoch {
        self.until(&format!("message {text:?}"), |log| {
            log.iter().find_map(|e| match e {
                SecureEvent::Message { epoch, data, .. } if data == text.as_bytes() => Some(*epoch),
                _ => None,
            })
        })
        .await
    }

    /// Epoch → members, of every secure view this member saw.
    pub fn views(&self) -> BTreeMap<Epoch, Vec<MemberId>> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                SecureEvent::View(v) => Some((v.epoch, v.members.to_vec())),
                _ => None,
            })
            .collect()
    }
}

/// Waits until every one of `ms` has a secure view of exactly `ms`, in order.
pub async fn all_see_each_other(ms: &[Member]) {
    let names: Vec<&str> = ms.iter().map(|m| m.name.as_str()).collect();
    for m in ms {
        m.until_view(&names).await;
    }
}
