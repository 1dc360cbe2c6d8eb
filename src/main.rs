/// mimalloc: a request allocates and frees a few dozen small blocks (Pingora's header maps,
/// buffers, futures); its per-thread free lists make each of them several times cheaper than
/// glibc's malloc (see README "Benchmarks"). Version 3 (the crate's default); it sometimes
/// retires and re-takes a page of pingora's per-request channel (2.7K instructions per request
/// more in some runs); version 2 runs agree better but made fleet tests flaky (left off).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(tollgate::cli::main());
}
