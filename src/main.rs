/// mimalloc: a request allocates and frees a few dozen small blocks (Pingora's header maps,
/// buffers, futures); its per-thread free lists make each of them several times cheaper than
/// glibc's malloc (see BENCHMARKS.md, "Cost per request: notes and history"). Version 2 (the
/// crate's `v2` feature): version 3 fell, one run in two, into retiring and re-taking a page of
/// pingora's per-request channel (2.8K instructions per request more).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(tollgate::cli::main());
}
