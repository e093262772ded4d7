//! Per-call latency of the Table 4.1 spproxy calls: the native client against the embedded
//! server, over a Unix socketpair, one call at a time.
//!
//! Run: `cargo bench -p sigma-spproxy --bench calls`; medians are in
//! `target/criterion/spproxy_calls/*/new/estimates.json`.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use spproxy::consts::*;
use spproxy::server::{LocalDirStore, Server, ServerConfig};
use spproxy::{frame, Client};

const DATA: &[u8] = &[b'x'; 64];

/// Times only `op`; `setup` and `teardown` run outside the clock.
fn timed<S>(
    iters: u64,
    mut setup: impl FnMut(u64) -> S,
    mut op: impl FnMut(&S),
    mut teardown: impl FnMut(S),
) -> Duration {
    let mut total = Duration::ZERO;
    for i in 0..iters {
        let s = setup(i);
        let t = Instant::now();
        op(&s);
        total += t.elapsed();
        teardown(s);
    }
    total
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalDirStore::new(dir.path().join("objects")));
    let server = Server::new(ServerConfig::new(
        "bench",
        dir.path().join("scratch"),
        store,
    ))
    .unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    server.serve_stream(b);
    let cl = Client::from_stream(a, None).unwrap();
    let f = "name/ux/~local/f";
    cl.put_file(f, 0o644, OWRITE, DATA, 0, NO_LEASE_ID).unwrap();

    let mut g = c.benchmark_group("spproxy_calls");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));

    // Floor: the same framing echoed by a thread over a socketpair, no protobuf, no handler.
    {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            let mut r = std::io::BufReader::new(b.try_clone().unwrap());
            while let Ok(Some(m)) = frame::read_message(&mut r, &frame::Limits::default()) {
                if frame::write_message(&mut b, m.seqno, &m.frames).is_err() {
                    break;
                }
            }
        });
        let mut r = std::io::BufReader::new(a.try_clone().unwrap());
        let mut seq = 0u64;
        g.bench_function("RawRoundTrip", |bn| {
            bn.iter(|| {
                seq += 1;
                frame::write_message(&mut a, seq, &[b"\x0a\x00".as_slice()]).unwrap();
                frame::read_message(&mut r, &frame::Limits::default())
                    .unwrap()
                    .unwrap()
            })
        });
    }

    g.bench_function("Started", |bn| bn.iter(|| cl.started().unwrap()));
    g.bench_function("Exited", |bn| {
        bn.iter(|| cl.exited(STATUS_OK, "bye").unwrap())
    });
    g.bench_function("Create", |bn| {
        bn.iter_custom(|n| {
            timed(
                n,
                |i| (format!("name/ux/~local/c{i}"), std::cell::Cell::new(0)),
                |(p, fd)| fd.set(cl.create(p, 0o644, OWRITE).unwrap()),
                |(p, fd)| {
                    cl.close_fd(fd.get()).unwrap();
                    cl.remove(&p).unwrap();
                },
            )
        })
    });
    g.bench_function("Open", |bn| {
        bn.iter_custom(|n| {
            let mut fds = Vec::new();
            let d = timed(
                n,
                |_| (),
                |_| fds.push(cl.open(f, OREAD, O_NOW).unwrap()),
                |_| {},
            );
            for fd in fds {
                cl.close_fd(fd).unwrap();
            }
            d
        })
    });
    let wfd = cl.open("name/ux/~local/w", OWRITE | OTRUNC, O_NOW);
    let wfd = match wfd {
        Ok(fd) => fd,
        Err(_) => cl.create("name/ux/~local/w", 0o644, OWRITE).unwrap(),
    };
    g.bench_function("Write", |bn| {
        bn.iter_custom(|n| {
            timed(
                n,
                |_| (),
                |_| {
                    cl.write(wfd, DATA).unwrap();
                },
                |_| {},
            ) + {
                cl.seek(wfd, 0).unwrap();
                Duration::ZERO
            }
        })
    });
    let rfd = cl.open(f, OREAD, O_NOW).unwrap();
    g.bench_function("Read", |bn| {
        bn.iter_custom(|n| {
            timed(
                n,
                |_| (),
                |_| {
                    std::hint::black_box(cl.read(rfd, 64).unwrap());
                },
                |_| cl.seek(rfd, 0).unwrap(),
            )
        })
    });
    g.bench_function("Seek", |bn| bn.iter(|| cl.seek(rfd, 0).unwrap()));
    g.bench_function("CloseFD", |bn| {
        bn.iter_custom(|n| {
            timed(
                n,
                |_| cl.open(f, OREAD, O_NOW).unwrap(),
                |fd| cl.close_fd(*fd).unwrap(),
                |_| {},
            )
        })
    });
    g.bench_function("PutFile", |bn| {
        bn.iter(|| {
            cl.put_file("name/ux/~local/p", 0o644, OWRITE, DATA, 0, NO_LEASE_ID)
                .unwrap()
        })
    });
    g.bench_function("GetFile", |bn| {
        bn.iter(|| std::hint::black_box(cl.get_file(f).unwrap()))
    });
    g.bench_function("Stat", |bn| {
        bn.iter(|| std::hint::black_box(cl.stat(f).unwrap()))
    });
    g.bench_function("Remove", |bn| {
        bn.iter_custom(|n| {
            timed(
                n,
                |i| {
                    let p = format!("name/ux/~local/r{i}");
                    cl.put_file(&p, 0o644, OWRITE, DATA, 0, NO_LEASE_ID)
                        .unwrap();
                    p
                },
                |p| cl.remove(p).unwrap(),
                |_| {},
            )
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
