//! Link the `sigma-supervise` binary as a position-dependent executable. Every run starts the
//! binary afresh, and as a PIE its ~49,000 relative relocations (760 KB of `.data.rel.ro`, mostly
//! the vtables of the S3 and HTTP stacks) are written by the dynamic loader on each start:
//! ~0.75 ms of a jailed `/bin/true`'s ~8 ms. Linked at a fixed address those pointers are final
//! in the file and the pages are shared from the page cache. Shared libraries, heap, stacks and
//! mmaps stay randomised; the supervisor runs no code of the proc's, and the proc cannot see or
//! signal it (its own namespaces, the supervisor non-dumpable).
fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
}
