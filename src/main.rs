/// mimalloc: a request allocates and frees a few dozen small blocks (Pingora's header maps,
/// buffers, futures); its per-thread free lists make each of them several times cheaper than
/// glibc's malloc (see README "Benchmarks").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(tollgate::cli::main());
}
