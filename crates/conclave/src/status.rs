//! `conclave status`: what a running daemon holds — its groups and their
//! members, its client connections and their queues, its limits, uptime,
//! daemon group and access rules — in the manner of Spread's spmonitor.
//!
//! The daemon answers only its own Unix user and root (on its Unix socket)
//! and the operators its configuration lists (`[status] operators`); anyone
//! else is refused, and learns nothing of the groups.

use std::fmt::Write;

use anyhow::Result;
use clap::Args;
use conclave_gcs::core::GroupMode;
use conclave_gcs::wire::Status;
use serde_json::json;

use crate::client::{safe, Endpoint};

/// Options of `conclave status`.
#[derive(Args, Debug)]
#[command(after_help = "The daemon answers its own Unix user and root over its Unix socket, and the operators \
its configuration lists ([status] operators = [\"uid:1001\", \"ops-*\"]: Unix users, or names certified by a \
client certificate over TLS); it refuses anyone else (AccessDenied). The status is read on a connection of its \
own, which takes no member name.")]
pub struct StatusArgs {
    #[command(flatten)]
    endpoint: Endpoint,
    /// Print the status as one JSON object (for scripts and monitoring) instead of text.
    #[arg(long)]
    json: bool,
}

/// Asks the daemon and prints what it says.
pub fn run(args: StatusArgs) -> Result<()> {
    let status = crate::block_on(async { args.endpoint.status().await })?;
    if args.json {
        println!("{}", to_json(&status));
    } else {
        print!("{}", to_text(&status));
    }
    Ok(())
}

fn to_json(s: &Status) -> serde_json::Value {
    let pairs = |l: &[(String, u64)]| l.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>();
    json!({
        "uptime_ms": s.uptime_ms,
        "daemon": s.daemon,
        "backbone": s.backbone,
        "configuration": s.configuration.as_ref().map(|(id, daemons)| json!({
            "id": id.to_string(),
            "daemons": daemons,
        })),
        "limits": pairs(&s.limits),
        "counters": pairs(&s.counters),
        "groups": s.groups.iter().map(|g| json!({
            "name": g.name.as_str(),
            "open": g.open,
            "keyed": g.mode.daemon_keyed(),
            "mode": match g.mode {
                GroupMode::Members => "members",
                GroupMode::Keyed => "integrated-vs",
                GroupMode::ThreeStep => "three-step",
                GroupMode::OptimizedEvs => "optimized-evs",
            },
            "view": g.view.to_string(),
            "members": g.members.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "connections": s.connections.iter().map(|c| json!({
            "id": c.id,
            "name": c.name.as_ref().map(|n| n.as_str()),
            "peer": c.peer,
            "age_ms": c.age_ms,
            "queued_frames": c.queued_frames,
            "queued_bytes": c.queued_bytes,
            "groups": c.groups,
        })).collect::<Vec<_>>(),
        "policy": s.policy,
        "truncated": s.truncated,
    })
}

/// A duration in words: 3d 04h 05m 06s, down to what matters.
fn age(ms: u64) -> String {
    let s = ms / 1000;
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s:02}s"),
        (0, _, _) => format!("{h}h {m:02}m {s:02}s"),
        _ => format!("{d}d {h:02}h {m:02}m {s:02}s"),
    }
}

fn to_text(s: &Status) -> String {
    let mut out = String::new();
    let count = |name: &str| s.counters.iter().find(|(k, _)| k == name).map_or(0, |(_, v)| *v);
    let _ = writeln!(out, "daemon {} ({}), up {}", s.daemon, safe(&s.backbone), age(s.uptime_ms));
    match &s.configuration {
        Some((id, daemons)) => {
            let list: Vec<String> = daemons.iter().map(u16::to_string).collect();
            let _ = writeln!(out, "daemon group: configuration {id}, daemons {}", list.join(" "));
        }
        None => out.push_str("daemon group: changing (the daemons are exchanging their state)\n"),
    }
    let n = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let _ = writeln!(
        out,
        "{} ({}), {}, {}, {} queued",
        n(count("connections"), "connection", "connections"),
        n(count("clients"), "client", "clients"),
        n(count("groups"), "group", "groups"),
        n(count("memberships"), "membership", "memberships"),
        n(count("queued_bytes"), "byte", "bytes"),
    );
    out.push_str("limits:");
    for (k, v) in &s.limits {
        let _ = write!(out, " {}={v}", safe(k));
    }
    out.push('\n');
    let _ = writeln!(out, "groups ({}):", s.groups.len());
    for g in &s.groups {
        let mut tags = Vec::new();
        if g.open {
            tags.push("open");
        }
        match g.mode {
            GroupMode::Members => {}
            GroupMode::Keyed => tags.push("keyed"),
            GroupMode::ThreeStep => tags.push("three-step"),
            GroupMode::OptimizedEvs => tags.push("keyed, optimized-evs"),
        }
        let tags = if tags.is_empty() { String::new() } else { format!(" [{}]", tags.join(", ")) };
        let members: Vec<String> = g.members.iter().map(|m| safe(m.as_str())).collect();
        let _ = writeln!(out, "  {}{tags} {}: {}", safe(g.name.as_str()), g.view, members.join(" "));
    }
    let _ = writeln!(out, "connections ({}):", s.connections.len());
    for c in &s.connections {
        let name = c.name.as_ref().map_or("(no Hello yet)".to_owned(), |n| safe(n.as_str()));
        let _ = writeln!(
            out,
            "  #{} {name} ({}), up {}, {} group{}, queued {} frames / {} bytes",
            c.id,
            safe(&c.peer),
            age(c.age_ms),
            c.groups,
            if c.groups == 1 { "" } else { "s" },
            c.queued_frames,
            c.queued_bytes
        );
    }
    out.push_str("access:\n");
    for rule in &s.policy {
        let _ = writeln!(out, "  {}", safe(rule));
    }
    if s.truncated {
        out.push_str("(the daemon cut the lists above to keep its answer small; the counts are whole)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::age;

    #[test]
    fn ages_read_like_clocks() {
        assert_eq!(age(999), "0s");
        assert_eq!(age(61_000), "1m 01s");
        assert_eq!(age(3_723_000), "1h 02m 03s");
        assert_eq!(age(90_061_000), "1d 01h 01m 01s");
    }
}
