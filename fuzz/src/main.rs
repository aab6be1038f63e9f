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
    // A broken invariant is a crash to AFL++ (it keeps the input); a target that cannot set
    // itself up says so and stops the run instead of reporting the machine as a finding.
    afl::fuzz!(|data: &[u8]| {
        match target(data) {
            Ok(_) => {}
            Err(holdfast::fuzz::Fault::Broken(why)) => panic!("invariant broken: {why}"),
            Err(holdfast::fuzz::Fault::Setup(why)) => {
                eprintln!("holdfast-fuzz: {name}: could not set up: {why}");
                std::process::exit(2);
            }
        }
    });
}
