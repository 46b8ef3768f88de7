//! `conclave demo` (the README's main job) runs the whole stack end to end:
//! every protocol's members install the same keys and read each other, and
//! the member that left reads nothing sent after it left.

use std::process::Command;

#[test]
fn demo_runs_every_protocol_end_to_end() {
    let out = Command::new(env!("CARGO_BIN_EXE_conclave")).args(["demo"]).output().expect("run conclave demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    for proto in ["GDH", "CKD", "TGDH", "STR", "BD"] {
        let section: String = stdout
            .split("=== ")
            .find(|s| s.starts_with(proto))
            .unwrap_or_else(|| panic!("no {proto} section in:\n{stdout}"))
            .to_string();
        // Four members end up with one four-member view and one key.
        let fours: Vec<&str> = section.lines().filter(|l| l.contains("alice bob carol dave")).collect();
        assert_eq!(fours.len(), 4, "{proto}: {section}");
        let key = |l: &str| l.split(" key ").nth(1).map(|k| k.split_whitespace().next().unwrap_or("").to_string());
        assert!(fours.iter().all(|l| key(l) == key(fours[0])), "{proto}: members disagree on the key\n{section}");
        // After carol left, the others read bob's message and carol does not.
        let readers: Vec<&str> = section
            .lines()
            .filter(|l| l.ends_with("bob: carol cannot read this"))
            .map(|l| l.split('|').next().unwrap_or("").trim())
            .collect();
        assert_eq!(readers.len(), 3, "{proto}: {section}");
        assert!(!readers.contains(&"carol"), "{proto}: carol read a message sent after she left");
        // Revoked mallory is refused by the three members, told why, and gets no key.
        for who in ["alice", "bob", "dave"] {
            let line = format!("{who:>6} | refused mallory: its certificate (serial ");
            assert!(
                section.lines().any(|l| l.starts_with(&line) && l.ends_with("was revoked (key compromise)")),
                "{proto}: {who} did not refuse mallory\n{section}"
            );
        }
        assert!(
            section.lines().any(|l| l.starts_with("mallory | refused by alice: its certificate")),
            "{proto}: mallory was not told\n{section}"
        );
        assert!(!section.lines().any(|l| l.starts_with("mallory | secure view")), "{proto}: mallory got a key");
    }
}
