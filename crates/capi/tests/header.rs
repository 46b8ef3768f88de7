//! The committed header, `include/conclave.h`, is what cbindgen generates
//! from the crate now (with `cbindgen.toml`). Needs the cbindgen command
//! (Debian: `apt-get install cbindgen`); without it the test says so and
//! passes, unless CONCLAVE_REQUIRE_CBINDGEN is set (as `.ci/run` does).

use std::path::Path;
use std::process::Command;

#[test]
fn header_is_up_to_date() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    let generated = out.path().join("conclave.h");
    let run = Command::new("cbindgen")
        .current_dir(manifest)
        .args(["--quiet", "--config", "cbindgen.toml", "--output"])
        .arg(&generated)
        .output();
    let run = match run {
        Ok(run) => run,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("CONCLAVE_REQUIRE_CBINDGEN").is_none(),
                "cbindgen is not installed, and CONCLAVE_REQUIRE_CBINDGEN is set"
            );
            eprintln!("SKIPPED: cbindgen is not installed (apt-get install cbindgen); include/conclave.h not checked");
            return;
        }
        Err(e) => panic!("cannot run cbindgen: {e}"),
    };
    assert!(run.status.success(), "cbindgen failed:\n{}", String::from_utf8_lossy(&run.stderr));
    let committed = std::fs::read_to_string(manifest.join("include/conclave.h")).unwrap();
    let fresh = std::fs::read_to_string(&generated).unwrap();
    assert!(
        committed == fresh,
        "include/conclave.h is out of date: regenerate it with `cd crates/capi && cbindgen --config cbindgen.toml \
         --output include/conclave.h` and commit it (the committed one was made with Debian's cbindgen 0.24.3)"
    );
}
