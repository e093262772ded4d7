//! Compiles `proto/*.proto` with protox (no protoc) and generates Rust types with prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/rpc.proto",
        "proto/sigmap.proto",
        "proto/proc.proto",
        "proto/spproxy.proto",
        "proto/watch.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    prost_build::Config::new()
        // Deterministic map order (sorted by key), as Go's deterministic marshal produces.
        .btree_map(["."])
        .compile_fds(fds)?;
    Ok(())
}
