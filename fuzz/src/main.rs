//! One AFL++ harness for every target of `holdfast::fuzz`: `holdfast-fuzz TARGET` reads inputs
//! as afl-fuzz hands them over and runs that target on each; a broken invariant is a panic,
//! which AFL++ records as a crash. Built and run by `scripts/fuzz.sh`.

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let Some((_, target)) = holdfast::fuzz::TARGETS.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = holdfast::fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
        eprintln!("usage: holdfast-fuzz TARGET (one of: {})", names.join(", "));
        std::process::exit(2);
    };
    afl::fuzz!(|data: &[u8]| {
        let _ = target(data);
    });
}
