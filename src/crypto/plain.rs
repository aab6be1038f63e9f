//! [`PlainBuf`]: a byte buffer for plaintext that never leaves a copy of it behind, and a
//! per-thread pair of them ([`with_scratch`]) so that the hot paths that serialize a secret
//! and seal it (a journal record per stream append) allocate nothing for it.

use std::cell::RefCell;
use std::io;

use zeroize::{Zeroize, Zeroizing};

/// A buffer that outgrows this is not kept for the next use: one large record does not keep a
/// thread's (or a connection's) memory large.
pub const KEEP_BYTES: usize = 64 * 1024;

/// A growable byte buffer for plaintext (a request line, a record before it is sealed, a token
/// being made). It grows by moving into a larger buffer and zeroizing the old one, never by a
/// `realloc` that would free an unzeroized copy; [`PlainBuf::wipe`] zeroizes what it held and
/// keeps the allocation for reuse; dropped, it is zeroized.
#[derive(Default)]
pub struct PlainBuf(Zeroizing<Vec<u8>>);

impl PlainBuf {
    /// An empty buffer (no allocation until the first byte).
    pub fn new() -> Self {
        Self::default()
    }

    /// What it holds.
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Its allocation's size.
    pub fn capacity(&self) -> usize {
        self.0.capacity()
    }

    /// Make room for `more` bytes: a larger buffer (at least double) takes the content and the
    /// old one is zeroized as it is dropped.
    pub fn reserve(&mut self, more: usize) {
        let need = self.0.len() + more;
        if need > self.0.capacity() {
            self.grow_to(need.max((2 * self.0.capacity()).max(256)));
        }
    }

    fn grow_to(&mut self, size: usize) {
        let mut grown = Vec::with_capacity(size);
        grown.extend_from_slice(&self.0);
        self.0 = Zeroizing::new(grown);
    }

    /// [`PlainBuf::reserve`] for a buffer that never holds more than `limit` bytes (a request
    /// line's cap): it doubles up to [`KEEP_BYTES`], and past that goes straight to `limit`.
    /// Growing through every size in between would free ever larger buffers, and glibc raises
    /// its mmap threshold to each large buffer freed, until buffers of those sizes come from the
    /// heap and stay resident after they are freed (the oversized-line test saw 4 MiB kept);
    /// one allocation of one size is served by mmap each time and returned whole when dropped.
    /// (Pages of it never written are never resident.)
    pub fn reserve_within(&mut self, more: usize, limit: usize) {
        let need = self.0.len() + more;
        if need > self.0.capacity() {
            let doubled = (2 * self.0.capacity()).max(256);
            let size = need.max(if doubled > KEEP_BYTES {
                limit
            } else {
                doubled.min(limit)
            });
            self.grow_to(size);
        }
    }

    /// Append `bytes`.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        self.0.extend_from_slice(bytes);
    }

    /// Append `bytes`, growing within `limit` ([`PlainBuf::reserve_within`]).
    pub fn extend_within(&mut self, bytes: &[u8], limit: usize) {
        self.reserve_within(bytes.len(), limit);
        self.0.extend_from_slice(bytes);
    }

    /// Append `n` zero bytes.
    pub fn extend_zeros(&mut self, n: usize) {
        self.reserve(n);
        let len = self.0.len();
        self.0.resize(len + n, 0);
    }

    /// The bytes from `from` on, to change in place (encrypting them).
    pub fn tail_mut(&mut self, from: usize) -> &mut [u8] {
        &mut self.0[from..]
    }

    /// Drop the last `n` bytes (zeroized first).
    pub fn shorten(&mut self, n: usize) {
        let keep = self.0.len().saturating_sub(n);
        self.0[keep..].zeroize();
        self.0.truncate(keep);
    }

    /// Zeroize what it holds and empty it, keeping the allocation for the next use unless it
    /// outgrew [`KEEP_BYTES`]. Bytes beyond the length were zeroized by an earlier wipe (or
    /// never written), so only the length is wiped.
    pub fn wipe(&mut self) {
        if self.0.capacity() > KEEP_BYTES {
            self.0 = Zeroizing::new(Vec::new());
        } else {
            self.0.as_mut_slice().zeroize();
            self.0.clear();
        }
    }
}

impl io::Write for PlainBuf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.extend(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

thread_local! {
    /// The thread's idle scratch buffers (at most [`SCRATCH_KEPT`]).
    static SCRATCH: RefCell<Vec<PlainBuf>> = const { RefCell::new(Vec::new()) };
}

/// Scratch buffers a thread keeps: a record is serialized into one while its token is made in
/// the other.
const SCRATCH_KEPT: usize = 2;

/// Run `f` with an empty [`PlainBuf`] of this thread's, wiped when `f` returns and kept for
/// the thread's next use. Uses may nest (each gets its own buffer); one made while the
/// thread's are in use is dropped (zeroized) afterwards unless fewer than two are kept.
pub fn with_scratch<R>(f: impl FnOnce(&mut PlainBuf) -> R) -> R {
    let mut buf = SCRATCH
        .try_with(|pool| pool.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default();
    let out = f(&mut buf);
    buf.wipe();
    let _ = SCRATCH.try_with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.len() < SCRATCH_KEPT {
            pool.push(buf);
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn grows_keeps_order_and_wipes() {
        let mut b = PlainBuf::new();
        let mut want = Vec::new();
        for i in 0..2000u32 {
            let piece = i.to_le_bytes();
            b.extend(&piece);
            want.extend_from_slice(&piece);
        }
        write!(b, "tail").unwrap();
        want.extend_from_slice(b"tail");
        b.extend_zeros(3);
        want.extend_from_slice(&[0, 0, 0]);
        assert_eq!(b.as_slice(), &want[..]);
        b.shorten(7);
        assert_eq!(b.as_slice(), &want[..want.len() - 7]);
        let cap = b.capacity();
        b.wipe();
        assert!(b.is_empty());
        assert_eq!(b.capacity(), cap, "a small buffer is kept for reuse");
        let mut c = PlainBuf::new();
        for _ in 0..10 {
            c.extend_within(&[7; 100], 700);
        }
        assert_eq!(c.as_slice(), &[7; 1000][..]);
        assert!(c.capacity() < 1400, "grew past its limit: {}", c.capacity());
        // Past KEEP_BYTES, a limited buffer takes its limit in one step.
        let limit = 4 * KEEP_BYTES;
        let mut d = PlainBuf::new();
        let mut sizes = Vec::new();
        for _ in 0..(3 * KEEP_BYTES / 1000) {
            d.extend_within(&[1; 1000], limit);
            if sizes.last() != Some(&d.capacity()) {
                sizes.push(d.capacity());
            }
        }
        assert!(
            sizes.iter().all(|&c| c <= KEEP_BYTES || c == limit),
            "{sizes:?}"
        );
        assert_eq!(sizes.last(), Some(&limit), "{sizes:?}");
        b.extend(&vec![1; KEEP_BYTES + 1]);
        b.wipe();
        assert_eq!(b.capacity(), 0, "a buffer over KEEP_BYTES is not kept");
    }

    /// Uses nest, each starts empty (the last use's bytes are gone), and once warm a nested
    /// pair of uses allocates nothing: the same two buffers serve every pair.
    #[test]
    fn scratch_nests_starts_empty_and_is_reused() {
        let pair = || {
            with_scratch(|a| {
                assert!(a.is_empty(), "the last use's bytes were left");
                a.extend(b"a record");
                with_scratch(|b| {
                    assert!(b.is_empty(), "the last use's bytes were left");
                    b.extend(b"its token");
                    (a.as_slice().as_ptr(), b.as_slice().as_ptr())
                })
            })
        };
        std::thread::spawn(move || {
            with_scratch(|a| {
                a.extend(b"1");
                with_scratch(|b| {
                    b.extend(b"2");
                    with_scratch(|c| {
                        assert!(c.is_empty());
                        c.extend(b"a third, nested");
                        assert_eq!((a.as_slice(), b.as_slice()), (&b"1"[..], &b"2"[..]));
                    });
                })
            });
            pair();
            let warm = pair();
            assert_eq!(pair(), warm, "the thread's buffers were not reused");
            assert_ne!(warm.0, warm.1);
        })
        .join()
        .unwrap();
    }
}
