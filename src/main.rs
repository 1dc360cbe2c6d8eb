fn main() {
    std::process::exit(tollgate::cli::main());
}
