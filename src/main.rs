fn main() -> std::process::ExitCode {
    sessionfs::cli::main()
}
