//! `Client::connect_env` as a σOS proc uses it. One test function: it sets process-wide
//! environment variables, so nothing else may run in this binary concurrently.

use std::os::fd::IntoRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

use spproxy::server::{LocalDirStore, Server, ServerConfig};
use spproxy::{Client, Error, ENV_SPPROXY_FD, ENV_SPPROXY_SOCKET};

#[test]
fn connect_env_by_socket_path_and_by_inherited_fd() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalDirStore::new(dir.path().join("objects")));
    let server = Server::new(ServerConfig::new("r", dir.path().join("scratch"), store)).unwrap();
    let sock = dir.path().join("spproxyd.sock");
    let _listener = server.bind(&sock).unwrap();
    let sigmaconfig = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/sigmaos-wire/vectors/sigmaconfig_example.json"),
    )
    .unwrap();

    // By path, with SIGMACONFIG forwarded: the server sees its pid.
    std::env::set_var("SIGMACONFIG", &sigmaconfig);
    std::env::set_var(ENV_SPPROXY_SOCKET, &sock);
    let c = Client::connect_env().unwrap();
    assert_eq!(server.proc_state().pid.as_deref(), Some("pyproc-1"));
    c.put_file("name/ux/~local/x", 0o644, 1, b"by path", 0, u64::MAX)
        .unwrap();

    // A bad SIGMACONFIG is one clear error.
    std::env::set_var("SIGMACONFIG", "{not json");
    let e = Client::connect_env().err().unwrap();
    assert!(
        matches!(e, Error::Protocol(ref m) if m.starts_with("SIGMACONFIG")),
        "{e}"
    );
    std::env::remove_var("SIGMACONFIG");

    // By inherited fd: the handed-over socket is adopted (once) and Init uses a minimal env.
    let (ours, theirs) = UnixStream::pair().unwrap();
    server.serve_stream(theirs);
    let fd = ours.into_raw_fd();
    std::env::set_var(ENV_SPPROXY_FD, fd.to_string());
    let c2 = Client::connect_env().unwrap();
    assert_eq!(c2.get_file("name/ux/~local/x").unwrap(), b"by path");
    // Proc state is per connection: the first proc keeps its identity, the second has its own.
    assert_eq!(server.proc_state().pid.as_deref(), Some("pyproc-1"));
    let pid = server.proc_states().last().unwrap().pid.clone().unwrap();
    assert!(pid.contains(&std::process::id().to_string()), "{pid}");
    let e = Client::connect_env().err().unwrap();
    assert!(e.to_string().contains("SIGMA_SPPROXY_FD"), "{e}");
    std::env::set_var(ENV_SPPROXY_FD, "0");
    assert!(
        Client::connect_env().is_err(),
        "stdio fds are never adopted"
    );
    std::env::remove_var(ENV_SPPROXY_FD);

    // No server at the path: an Io error naming the path.
    std::env::set_var(ENV_SPPROXY_SOCKET, dir.path().join("nobody.sock"));
    let e = Client::connect_env().err().unwrap();
    assert!(
        matches!(e, Error::Io(_)) && e.to_string().contains("nobody.sock"),
        "{e}"
    );
}
