//! The `holdfast` binary: all logic lives in the library (`holdfast::cli`).
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    holdfast::cli::main()
}
