//! The continuation rule as a property: over texts that repeat across a break (indented code,
//! rules of one character, `"ha "` runs, long digit runs, multi-byte text) × every break point ×
//! both declared continuations, what subscribers are shown equals what a commit stores, and
//! both equal the model's text wherever only one reading of the continuation is possible.
//! `exact`: always the model's text. `restated` (the model restates the prefix's last N
//! characters, then goes on): whatever is removed is one of the restatements the continuation
//! can be read as, and where the only reading is N, nothing but it is removed.
//!
//! Bounded in CI; `HOLDFAST_CONTINUATION_CASES=2000` for a long run.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;

use super::accum::tests::plan_reset;
use super::accum::{Accumulator, Event, MIN_OVERLAP_CHARS};
use crate::recovery::{self, Continuation};

/// How much of the prefix's tail the trimmer compares with (accum.rs).
const WINDOW: usize = 256;

fn texts() -> impl Strategy<Value = String> {
    let code_lines = prop::collection::vec(
        prop::sample::select(vec![
            "def f(x):\n",
            "    if x:\n",
            "        return 3\n",
            "    return 0\n",
            "\n",
            "# ----------\n",
            "    x = [1, 1, 1]\n",
        ]),
        2..24,
    )
    .prop_map(|v| v.concat());
    let rule = (
        prop::sample::select(vec!["-", "=", " ", "0", "ab"]),
        4usize..320,
    )
        .prop_map(|(c, n)| c.repeat(n));
    let ha = (1usize..220).prop_map(|n| "ha ".repeat(n));
    let digits = prop_oneof![
        Just(format!("1{}", "0".repeat(100))),
        prop::collection::vec(prop::sample::select(vec!['0', '1']), 3..160)
            .prop_map(|v| v.into_iter().collect::<String>()),
    ];
    let multibyte = prop::collection::vec(
        prop::sample::select(vec!['é', '日', '🙂', 'a', ' ', '\u{301}', '\n']),
        3..120,
    )
    .prop_map(|v| v.into_iter().collect::<String>());
    let small = prop::collection::vec(prop::sample::select(vec!['a', 'b', ' ']), 3..160)
        .prop_map(|v| v.into_iter().collect::<String>());
    prop_oneof![code_lines, rule, ha, digits, multibyte, small]
}

/// `s` cut into chunks of 1-8 characters, the sizes drawn from `seed`.
fn chunks(s: &str, seed: &mut u64) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let n = 1 + ((*seed >> 33) % 8) as usize;
        let end = (i + n).min(chars.len());
        out.push(chars[i..end].iter().collect());
        i = end;
    }
    out
}

/// The text of the published events in `out`.
fn shown(out: Vec<(u64, super::EventJson)>, into: &mut String) -> Result<(), TestCaseError> {
    for (_, e) in out {
        let v: Value = serde_json::from_str(e.get())
            .map_err(|err| TestCaseError::fail(format!("published JSON: {err}")))?;
        if v["type"] == "text" {
            let t = v["text"].as_str();
            into.push_str(t.ok_or_else(|| TestCaseError::fail(format!("a text event: {v}")))?);
        }
    }
    Ok(())
}

/// Stream `prefix`, break (R1 with `mode`), stream `cont`; (shown, stored at commit).
fn run(
    prefix: &[String],
    mode: Continuation,
    cont: &[String],
) -> Result<(String, String), TestCaseError> {
    let mut acc = Accumulator::default();
    let mut seen = String::new();
    let mut seq = 1;
    let refused = |e| TestCaseError::fail(format!("a text refused: {e:?}"));
    for c in prefix {
        shown(
            acc.apply(seq, &Event::Text(c.clone())).map_err(refused)?,
            &mut seen,
        )?;
        seq += 1;
    }
    let plan = plan_reset(&acc, mode);
    prop_assert_eq!(plan.plan, recovery::PlanKind::R1);
    prop_assert_eq!(plan.continuation, Some(mode));
    acc.apply_plan(&plan);
    seq += 1;
    for c in cont {
        shown(
            acc.apply(seq, &Event::Text(c.clone())).map_err(refused)?,
            &mut seen,
        )?;
        seq += 1;
    }
    let stored = acc.text_when_flushed();
    shown(acc.flush_trim(), &mut seen)?;
    Ok((seen, stored))
}

/// The restatement lengths (≥ MIN_OVERLAP_CHARS) the continuation `cont` can be read as after
/// `prefix`: its first j characters end the prefix's compared tail.
fn readings(prefix: &[char], cont: &[char]) -> Vec<usize> {
    let tail = &prefix[prefix.len().saturating_sub(WINDOW)..];
    (MIN_OVERLAP_CHARS..=cont.len().min(tail.len()))
        .filter(|&j| tail.ends_with(&cont[..j]))
        .collect()
}

#[derive(Default, Debug)]
struct Totals {
    texts: u64,
    breaks: u64,
    exact: u64,
    restated_unique: u64,
    restated_ambiguous: u64,
}

fn check(text: &str, seed: u64, totals: &mut Totals) -> Result<(), TestCaseError> {
    let chars: Vec<char> = text.chars().collect();
    totals.texts += 1;
    let mut seed = seed;
    for k in 1..=chars.len() {
        totals.breaks += 1;
        let prefix: String = chars[..k].iter().collect();
        let rest: String = chars[k..].iter().collect();
        let pre_chunks = chunks(&prefix, &mut seed);

        // exact: the provider continues the prefix; the model's text, always.
        let (seen, stored) = run(&pre_chunks, Continuation::Exact, &chunks(&rest, &mut seed))?;
        prop_assert_eq!(&seen, &stored, "exact at {}: shown vs stored", k);
        prop_assert_eq!(&seen, text, "exact at {}: not the model's text", k);
        totals.exact += 1;

        // restated: the model restates the last n characters (none, three, to the start of
        // its line or word, or a long stretch), then continues.
        let line = chars[..k]
            .iter()
            .rev()
            .position(|c| *c == '\n')
            .unwrap_or(k);
        let word = chars[..k].iter().rev().position(|c| *c == ' ').unwrap_or(k);
        let mut ns = vec![0, 3, line, word, 20, 200];
        ns.retain(|&n| n == 0 || (n >= MIN_OVERLAP_CHARS && n <= k.min(WINDOW)));
        ns.sort_unstable();
        ns.dedup();
        for n in ns {
            let cont: Vec<char> = chars[k - n..].to_vec();
            let cont_s: String = cont.iter().collect();
            let (seen, stored) = run(
                &pre_chunks,
                Continuation::Restated,
                &chunks(&cont_s, &mut seed),
            )?;
            prop_assert_eq!(&seen, &stored, "restated {} at {}: shown vs stored", n, k);
            // Shown = prefix + cont[r..]: r characters removed, each a possible restatement.
            prop_assert!(
                seen.starts_with(&prefix),
                "restated {} at {}: prefix changed",
                n,
                k
            );
            let after: Vec<char> = seen[prefix.len()..].chars().collect();
            prop_assert!(after.len() <= cont.len() && cont.ends_with(&after));
            let r = cont.len() - after.len();
            let possible = readings(&chars[..k], &cont);
            prop_assert!(
                r == 0 || possible.contains(&r),
                "restated {} at {}: removed {} characters, not a restatement ({:?})",
                n,
                k,
                r,
                possible
            );
            let unique = if n == 0 {
                possible.is_empty()
            } else {
                possible == [n]
            };
            if unique {
                prop_assert_eq!(
                    &seen,
                    text,
                    "restated {} at {}: one reading, not exact",
                    n,
                    k
                );
                totals.restated_unique += 1;
            } else {
                totals.restated_ambiguous += 1;
            }
        }
    }
    Ok(())
}

#[test]
fn shown_equals_stored_equals_the_models_text_at_every_break_point() {
    let cases: u32 = std::env::var("HOLDFAST_CONTINUATION_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let totals = std::sync::Mutex::new(Totals::default());
    // Named texts of the field report, every break point, before the generated ones.
    let mut named = Totals::default();
    for t in [
        "-".repeat(300),
        "ha ".repeat(200),
        format!("1{}", "0".repeat(100)),
        "def f(x):\n    if x:\n        return 3\n    return 0\n".repeat(3),
    ] {
        if let Err(e) = check(&t, 7, &mut named) {
            panic!("a named text: {e}");
        }
    }
    let result = runner.run(&(texts(), any::<u64>()), |(text, seed)| {
        let mut t = totals.lock().unwrap_or_else(|e| e.into_inner());
        check(&text, seed, &mut t)
    });
    let t = totals.into_inner().unwrap_or_else(|e| e.into_inner());
    println!(
        "continuation property: {cases} generated texts + 4 named; named {named:?}; generated \
         {t:?}"
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        t.restated_unique > 0 && t.restated_ambiguous > 0,
        "both readings explored"
    );
}
