//! The stream journal's readers: the segment scan, and records replayed into runs.

use super::{OrFault, Outcome};
use crate::durable::journal::format::{frame_crc, header, FRAME_HEADER, HEADER_BYTES, TORN_WINDOW};
use crate::durable::journal::{scan_segment, ScannedTail, MAX_PAYLOAD};
use crate::streams::record::Record;
use crate::streams::Streams;

/// The segment number the target's bytes are read as.
const SEGMENT: u64 = 7;

/// Whether a valid frame of segment [`SEGMENT`] starts at `off`.
fn frame_at(bytes: &[u8], off: usize) -> Option<usize> {
    let head = bytes.get(off..off + FRAME_HEADER)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let payload = bytes.get(off + FRAME_HEADER..(off + FRAME_HEADER).checked_add(len)?)?;
    (len > 0 && len <= MAX_PAYLOAD && frame_crc(SEGMENT, payload) == crc).then_some(len)
}

/// The segment scan replay runs at open. The first byte chooses the shape: even, the rest
/// follows a valid header (the scan reads frames); odd, the rest is the whole segment (the
/// header is checked). Checked: a wrong header is refused; otherwise the frames found are
/// exactly the valid frames laid back to back from the header on, rebuilt they are the bytes
/// up to the tail, and the tail is what the bytes past it say — zeros (clean), a bad frame
/// with only zeros past one write's reach (torn: cutting it as replay does leaves a clean
/// segment with the same frames), or a bad frame with data further on (corrupt).
pub fn journal_segment(data: &[u8]) -> Outcome {
    let Some((&shape, rest)) = data.split_first() else {
        return Ok(false);
    };
    let bytes: Vec<u8> = if shape % 2 == 0 {
        header(SEGMENT).iter().chain(rest).copied().collect()
    } else {
        rest.to_vec()
    };
    let hb = HEADER_BYTES as usize;
    let scanned = scan_segment(SEGMENT, &bytes);
    let good_header = bytes.len() >= hb && bytes[..hb] == header(SEGMENT);
    let Some((frames, tail)) = scanned else {
        check!(!good_header, "a valid header was refused");
        return Ok(false);
    };
    check!(good_header, "a segment without its header was read");
    let mut off = hb;
    let mut rebuilt = header(SEGMENT).to_vec();
    for f in &frames {
        check_eq!(f.pos.segment, SEGMENT);
        check_eq!(f.pos.offset, off as u64, "frames not back to back");
        let len = frame_at(&bytes, off).broken("a frame returned that does not validate")?;
        check_eq!(len, f.payload.len());
        rebuilt.extend_from_slice(&(len as u32).to_le_bytes());
        rebuilt.extend_from_slice(&frame_crc(SEGMENT, &f.payload).to_le_bytes());
        rebuilt.extend_from_slice(&f.payload);
        off += FRAME_HEADER + len;
    }
    check_eq!(
        rebuilt[..],
        bytes[..off],
        "the frames rebuilt are not the bytes read"
    );
    let zero_from = |from: usize| bytes.get(from..).is_none_or(|r| r.iter().all(|&b| b == 0));
    match tail {
        ScannedTail::Clean(at) => {
            check_eq!(at, off as u64, "clean tail not after the last frame");
            check!(
                off + FRAME_HEADER > bytes.len() || zero_from(off),
                "data after a clean tail"
            );
        }
        ScannedTail::Torn(at) | ScannedTail::Corrupt(at) => {
            check_eq!(at, off as u64, "bad frame not after the last good one");
            check!(frame_at(&bytes, off).is_none(), "a valid frame called bad");
            check!(
                off + FRAME_HEADER <= bytes.len() && !zero_from(off),
                "a bad tail made of zeros"
            );
            let past = off.saturating_add(TORN_WINDOW);
            if matches!(tail, ScannedTail::Torn(_)) {
                check!(zero_from(past), "torn, yet data past one write's reach");
                // Replay cuts it: zeros up to its last non-zero byte. Then it reads clean.
                let mut cut = bytes.clone();
                for b in &mut cut[off..] {
                    *b = 0;
                }
                let (again, t) = scan_segment(SEGMENT, &cut).broken("header")?;
                check_eq!(
                    again.len(),
                    frames.len(),
                    "cutting the torn tail lost frames"
                );
                check_eq!(t, ScannedTail::Clean(off as u64));
            } else {
                check!(
                    !zero_from(past),
                    "corrupt, yet only zeros past one write's reach"
                );
            }
        }
    }
    Ok(!frames.is_empty())
}

/// Records as replay reads them, one JSON per line, replayed into runs from nothing. Checked:
/// a record that decodes encodes to JSON that decodes to the same encoding (what is written
/// is what replay reads); replay never panics; every run no snapshot record touched holds
/// its events in seq order, each seq once, all below its `next_seq`.
pub fn journal_replay(data: &[u8]) -> Outcome {
    let mut records = Vec::new();
    let mut snapshotted = std::collections::HashSet::new();
    for line in data.split(|&b| b == b'\n') {
        let Ok(rec) = Record::decode(line) else {
            continue;
        };
        let json = rec.encode();
        let again = Record::decode(&json).broken("an encoded record does not decode")?;
        check_eq!(
            again.encode(),
            json,
            "decode(encode(r)) encodes differently"
        );
        if let Record::Snapshot(s) = &rec {
            // A snapshot is trusted as written (sealed by the daemon): its events are whatever
            // it says, so its run's order is not the replay's to keep.
            snapshotted.insert(s.run.clone());
        }
        records.push(rec);
    }
    let decoded = !records.is_empty();
    for run in Streams::replay_alone(records) {
        if snapshotted.contains(&run.run_id) {
            continue;
        }
        let mut last = 0;
        for (seq, json) in &run.events {
            check!(*seq > last, "run {:?}: seq {seq} after {last}", run.run_id);
            check!(
                *seq < run.next_seq,
                "run {:?}: event seq {seq} at or past next_seq {}",
                run.run_id,
                run.next_seq
            );
            check!(
                serde_json::from_str::<serde_json::Value>(json).is_ok(),
                "an event that is not JSON"
            );
            last = *seq;
        }
    }
    Ok(decoded)
}
