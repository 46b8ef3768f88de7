//! Building and running the C example (`examples/chat_pair.c`): shared by
//! the tests that run it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// The directory of the library this test links: the test binary's own
/// (`target/<profile>/deps`, where cargo writes the cdylib next to it).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(
        dir.join("libconclave.so").exists(),
        "no libconclave.so in {} (cargo builds it with the tests)",
        dir.display()
    );
    dir
}

/// The C compiler's command, with the header and the example.
pub fn cc() -> Command {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_owned()));
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(manifest.join("include"))
        .arg(manifest.join("examples/chat_pair.c"));
    cc
}

/// Runs a C compiler command; panics with its messages if it fails.
pub fn compile(mut cmd: Command) {
    let result =
        cmd.output().unwrap_or_else(|e| panic!("cannot run the C compiler {cmd:?} (install gcc, or set CC): {e}"));
    assert!(result.status.success(), "building the C example failed:\n{}", String::from_utf8_lossy(&result.stderr));
}

/// Builds the example into `out`, linked with the cdylib.
pub fn build_example(out: &Path) -> PathBuf {
    let lib = lib_dir();
    let exe = out.join("chat_pair");
    let mut cmd = cc();
    cmd.arg("-L").arg(&lib).arg(format!("-Wl,-rpath,{}", lib.display())).arg("-lconclave").arg("-o").arg(&exe);
    compile(cmd);
    exe
}

/// Waits for `child` up to `limit`, killing it if it takes longer.
pub fn finish(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
