//! `python3 -c 'import json'` bare and under `sigma-supervise`, side by side in one criterion
//! group (run both in one process run so they see the same machine state):
//! `cargo bench -p sigma-supervise --bench python_import`.
use criterion::{criterion_group, criterion_main, Criterion};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const SUP: &str = env!("CARGO_BIN_EXE_sigma-supervise");

fn python() -> PathBuf {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 must be installed");
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8").trim())
}

fn run(cmd: &mut Command) {
    let st = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    assert!(st.success(), "{cmd:?} failed: {st}");
}

fn bench(c: &mut Criterion) {
    let py = python();
    let mut g = c.benchmark_group("python3 -c 'import json'");
    g.sample_size(30).measurement_time(Duration::from_secs(10));
    g.bench_function("bare", |b| {
        b.iter(|| run(Command::new(&py).args(["-c", "import json"])))
    });
    let served = tempfile::tempdir().expect("tempdir");
    let serve = format!("/sigma/bench={}", served.path().display());
    let variants: [(&str, Vec<&str>); 4] = [
        ("supervised, no path rule (path calls elided)", vec![]),
        (
            "supervised, every path call notified",
            vec!["--always-notify"],
        ),
        (
            "supervised, a serve rule (paths read+decided)",
            vec!["--serve", &serve],
        ),
        (
            "supervised, every path call notified, --pin shared",
            vec!["--always-notify", "--pin", "shared"],
        ),
    ];
    for (name, opts) in variants {
        g.bench_function(name, |b| {
            b.iter(|| {
                run(Command::new(SUP)
                    .args(&opts)
                    .arg("--")
                    .arg(&py)
                    .args(["-c", "import json"]))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
