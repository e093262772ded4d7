//! Link the `sigma-supervise` binary as a position-dependent executable. Every run starts the
//! binary afresh, and as a PIE its ~49,000 relative relocations (760 KB of `.data.rel.ro`, mostly
//! the vtables of the S3 and HTTP stacks) are written by the dynamic loader on each start:
//! ~0.75 ms of a jailed `/bin/true`'s ~8 ms. Linked at a fixed address those pointers are final
//! in the file and the pages are shared from the page cache. Shared libraries, heap, stacks and
//! mmaps stay randomised; the supervisor runs no code of the proc's, and the proc cannot see or
//! signal it (its own namespaces, the supervisor non-dumpable).
//!
//! The static musl build (`scripts/build`) links the distribution's `libseccomp.a`, built
//! against glibc: the one glibc-only symbol it needs is compiled here (`musl/fortify.c`).
fn main() {
    println!("cargo:rerun-if-changed=musl/fortify.c");
    // musl's start-up object for a static PIE relocates itself, and crashes in an executable
    // linked at a fixed address: there the build asks for `-C relocation-model=static` instead
    // (scripts/build), and rustc picks the matching start-up object.
    if std::env::var("CARGO_CFG_TARGET_ENV").as_deref() != Ok("musl") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    } else {
        // An object, not an archive: the linker takes it whatever the order of the archives.
        for obj in cc::Build::new()
            .file("musl/fortify.c")
            .compile_intermediates()
        {
            println!("cargo:rustc-link-arg-bins={}", obj.display());
        }
    }
}
