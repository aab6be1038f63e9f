//! Keys, where they come from, and Fernet encryption with MultiFernet semantics.
//!
//! A store's [`Keyring`] holds one primary key (every new token is made with it) and zero or
//! more previous keys (tokens made with them still decrypt). Key rotation puts the new key
//! first, re-encrypts every file, proves by a full scan that nothing needs the old keys, and
//! only then forgets them (see `store::rotate`).

pub mod keys;
pub mod plain;
mod secret;

pub use keys::{KeyError, KeySource, LoadedKeys};
pub use plain::{with_scratch, PlainBuf};
pub use secret::{Secret, SecretBytes};

use base64::Engine;
use fernet::Fernet;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};
use zeroize::Zeroize;

use crate::limits::FERNET_MAX_CLOCK_SKEW_SECS;

/// Why a token did not decrypt. Deliberately coarse (like rage and Fernet itself): which byte
/// was wrong is not something to tell anyone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecryptError {
    /// Not shaped like a Fernet token at all (empty, not base64, wrong version byte, wrong
    /// length): damage, and no evidence about the key.
    #[error("not a Fernet token (empty, truncated or not base64)")]
    Malformed,
    /// Shaped like a token, but it authenticates under none of the keys: the wrong key, or
    /// tampering. The only outcome that counts as evidence of a wrong key.
    #[error("cannot decrypt: wrong key, or the file is damaged or tampered with")]
    Invalid,
    /// Valid under one of our keys, but stamped in the future beyond the allowed skew.
    #[error("token is stamped {ahead_secs} s in the future: the system clock is behind (or was set back); it will read again once the clock catches up")]
    ClockSkew {
        /// How far ahead of our clock the token's timestamp is.
        ahead_secs: u64,
        /// Which key authenticated it (0 = primary).
        key_index: usize,
    },
}

/// A set of Fernet keys: primary first, then previous keys still accepted for decryption.
pub struct Keyring {
    keys: Vec<Fernet>,
    fingerprints: Vec<String>,
    /// The primary key's two halves, for making tokens.
    primary: Sealing,
}

/// A Fernet key split as the spec splits it: the first 16 bytes sign, the last 16 encrypt.
/// Zeroized on drop.
struct Sealing {
    signing: zeroize::Zeroizing<[u8; 16]>,
    encryption: zeroize::Zeroizing<[u8; 16]>,
}

impl Sealing {
    fn from_key(text: &str) -> Option<Sealing> {
        let raw = zeroize::Zeroizing::new(
            base64::engine::general_purpose::URL_SAFE
                .decode(text.trim())
                .ok()?,
        );
        let (signing, encryption) = (raw.get(..16)?, raw.get(16..32)?);
        let mut s = Sealing {
            signing: zeroize::Zeroizing::new([0; 16]),
            encryption: zeroize::Zeroizing::new([0; 16]),
        };
        s.signing.copy_from_slice(signing);
        s.encryption.copy_from_slice(encryption);
        Some(s)
    }

    /// The token of `plaintext` at `unix_secs` with `iv`: url-safe base64 (padded, as Python's
    /// `cryptography` writes it) of `0x80 · timestamp · IV · AES-128-CBC(PKCS#7) · HMAC-SHA256`
    /// over all before it. `None` only if the primitives refuse their fixed-size inputs.
    fn token(&self, plaintext: &[u8], unix_secs: u64, iv: &[u8; 16]) -> Option<String> {
        use aes::cipher::{block_padding::Pkcs7, BlockEncryptMut, KeyIvInit};
        use hmac::Mac;
        const HEAD: usize = 1 + 8 + 16;
        let padded = (plaintext.len() / 16 + 1) * 16;
        with_scratch(|raw| {
            raw.reserve(HEAD + padded + 32);
            raw.extend(&[0x80]);
            raw.extend(&unix_secs.to_be_bytes());
            raw.extend(iv);
            raw.extend(plaintext);
            raw.extend_zeros(padded - plaintext.len());
            let cipher =
                cbc::Encryptor::<aes::Aes128>::new_from_slices(&self.encryption[..], iv).ok()?;
            let sealed = cipher
                .encrypt_padded_mut::<Pkcs7>(raw.tail_mut(HEAD), plaintext.len())
                .ok()?
                .len();
            if sealed != padded {
                return None;
            }
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.signing[..]).ok()?;
            mac.update(raw.as_slice());
            raw.extend(&mac.finalize().into_bytes());
            Some(base64::engine::general_purpose::URL_SAFE.encode(raw.as_slice()))
        })
    }
}

/// A fresh IV: 16 bytes of this thread's pool of OS randomness, refilled 64 IVs at a time.
/// Fernet's IVs must be unpredictable and never repeat under a key; each comes from the OS's
/// CSPRNG and is handed out once (the pool is per thread, nothing is shared or copied). A pool
/// the OS cannot fill is not used: `None`, and the caller falls back to `fernet`'s own.
fn fresh_iv() -> Option<[u8; 16]> {
    use std::cell::RefCell;
    const POOL: usize = 64 * 16;
    thread_local! {
        static IVS: RefCell<([u8; POOL], usize)> = const { RefCell::new(([0; POOL], POOL)) };
    }
    IVS.with(|cell| {
        let mut guard = cell.try_borrow_mut().ok()?;
        let (pool, used) = &mut *guard;
        if *used == POOL {
            getrandom::fill(pool).ok()?;
            *used = 0;
        }
        let mut iv = [0; 16];
        iv.copy_from_slice(&pool[*used..*used + 16]);
        pool[*used..*used + 16].fill(0);
        *used += 16;
        Some(iv)
    })
}

impl Drop for Keyring {
    fn drop(&mut self) {
        // `Fernet` derives `Zeroize` but does not zeroize itself on drop.
        for k in &mut self.keys {
            k.zeroize();
        }
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("keys", &self.fingerprints)
            .finish()
    }
}

/// A short, non-secret fingerprint of a key: hex of the first 4 bytes of SHA-256(key text).
pub fn fingerprint(key: &Secret) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(key.expose().as_bytes());
    d[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// Check that `text` is a Fernet key: 32 bytes in url-safe base64 (44 characters).
pub fn parse_key(text: &str) -> Option<Fernet> {
    let t = text.trim();
    if t.len() != 44 {
        return None;
    }
    Fernet::new(t)
}

/// A fresh random Fernet key.
pub fn generate_key() -> Secret {
    Secret::new(Fernet::generate_key())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The length of the Fernet token (url-safe base64, padded) that seals `plaintext_len` bytes:
/// `0x80 · timestamp · IV · AES-CBC blocks (PKCS#7 always adds one) · HMAC`, base64'd.
pub fn token_len(plaintext_len: usize) -> usize {
    let raw = 1 + 8 + 16 + (plaintext_len / 16 + 1) * 16 + 32;
    raw.div_ceil(3) * 4
}

/// The largest plaintext whose token is at most `token_limit` bytes.
pub fn max_plaintext_for(token_limit: usize) -> usize {
    let raw = token_limit / 4 * 3;
    (raw.saturating_sub(1 + 8 + 16 + 32) / 16 * 16).saturating_sub(1)
}

/// Whether `token` is shaped like a Fernet token: url-safe base64 of `0x80 · 8-byte timestamp ·
/// 16-byte IV · a whole number of 16-byte AES blocks · 32-byte HMAC`.
pub fn is_token_shaped(token: &str) -> bool {
    let t = token.trim();
    let Ok(raw) = base64::engine::general_purpose::URL_SAFE
        .decode(t)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(t))
    else {
        return false;
    };
    raw.first() == Some(&0x80) && raw.len() >= 1 + 8 + 16 + 16 + 32 && (raw.len() - 57) % 16 == 0
}

/// The timestamp field of a Fernet token, if it is shaped like one.
pub fn token_timestamp(token: &str) -> Option<u64> {
    // Only the first 9 bytes matter: 12 base64 chars decode to 9 bytes.
    let head = token.trim().get(..12)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .ok()?;
    if bytes.first() != Some(&0x80) {
        return None;
    }
    Some(u64::from_be_bytes(bytes.get(1..9)?.try_into().ok()?))
}

impl Keyring {
    /// A keyring of `primary` followed by `previous`. Keys must already be validated.
    pub fn new(primary: &Secret, previous: &[Secret]) -> Option<Self> {
        let mut keys = Vec::with_capacity(1 + previous.len());
        let mut fingerprints = Vec::with_capacity(1 + previous.len());
        for k in std::iter::once(primary).chain(previous) {
            keys.push(parse_key(k.expose())?);
            fingerprints.push(fingerprint(k));
        }
        let primary = Sealing::from_key(primary.expose())?;
        Some(Keyring {
            keys,
            fingerprints,
            primary,
        })
    }

    /// Fingerprints, primary first (safe to log and show).
    pub fn fingerprints(&self) -> &[String] {
        &self.fingerprints
    }

    /// Encrypt with the primary key.
    pub fn encrypt(&self, plaintext: &[u8]) -> String {
        self.encrypt_at_time(plaintext, now_secs())
    }

    /// Decrypt with any key (no TTL, as hive). Returns the plaintext and the index of the key
    /// that worked (0 = primary; more means the file still needs re-encryption after a
    /// rotation).
    pub fn decrypt(&self, token: &str) -> Result<(SecretBytes, usize), DecryptError> {
        let token = token.trim();
        for (i, k) in self.keys.iter().enumerate() {
            if let Ok(p) = k.decrypt(token) {
                return Ok((SecretBytes::new(p), i));
            }
        }
        if !is_token_shaped(token) {
            return Err(DecryptError::Malformed);
        }
        // Tell clock skew apart from damage: if the token is stamped beyond the allowed skew
        // and authenticates when checked "at" its own timestamp, it is intact.
        let now = now_secs();
        if let Some(ts) = token_timestamp(token) {
            if ts > now + FERNET_MAX_CLOCK_SKEW_SECS {
                for (key_index, k) in self.keys.iter().enumerate() {
                    if let Ok(mut p) = k.decrypt_at_time(token, None, ts) {
                        p.zeroize();
                        return Err(DecryptError::ClockSkew {
                            ahead_secs: ts - now,
                            key_index,
                        });
                    }
                }
            }
        }
        Err(DecryptError::Invalid)
    }

    /// Encrypt at a chosen time ([`Keyring::encrypt`] at the clock's; tests of clock skew).
    #[doc(hidden)]
    pub fn encrypt_at_time(&self, plaintext: &[u8], unix_secs: u64) -> String {
        fresh_iv()
            .and_then(|iv| self.primary.token(plaintext, unix_secs, &iv))
            .unwrap_or_else(|| self.keys[0].encrypt_at_time(plaintext, unix_secs))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn token_len_predicts_every_token_and_the_largest_plaintext_fits() {
        let ring = Keyring::new(&generate_key(), &[]).unwrap();
        for n in (0..100).chain([4095, 4096, 4097, 65_535, 786_367, 786_368, 786_400]) {
            let token = ring.encrypt(&vec![b'x'; n]);
            assert_eq!(token.len(), token_len(n), "plaintext of {n} bytes");
        }
        for limit in [1 << 20, 4096, 1000, 200] {
            let max = max_plaintext_for(limit);
            assert!(token_len(max) <= limit, "{limit}: {max}");
            assert!(token_len(max + 1) > limit, "{limit}: {max}");
        }
    }
    use super::*;

    /// The Fernet spec's own test vector (github.com/fernet/spec, generate.json), which
    /// Python's `cryptography` reproduces byte for byte (`Fernet._encrypt_from_parts`).
    #[test]
    fn tokens_match_the_spec_vector() {
        let key = Secret::new("cw_0x689RpI-jtRR7oE8h_eQsKImvJapLeSbXpwF4e4=".into());
        let ring = Keyring::new(&key, &[]).unwrap();
        let iv: [u8; 16] = std::array::from_fn(|i| i as u8);
        let token = ring.primary.token(b"hello", 499_162_800, &iv).unwrap();
        assert_eq!(
            token,
            "gAAAAAAdwJ6wAAECAwQFBgcICQoLDA0ODy021cpGVWKZ_eEwCGM4BLLF_5CV9dOPmrhuVUPgJobwOz7JcbmrR64jVmpU4IwqDA=="
        );
    }

    /// Every length around the AES block boundaries opens with `fernet` itself, with the time
    /// it was made at; no two tokens share an IV, across several refills of the pool and
    /// several threads.
    #[test]
    fn tokens_open_with_fernet_and_never_repeat_an_iv() {
        let key = generate_key();
        let ring = std::sync::Arc::new(Keyring::new(&key, &[]).unwrap());
        let theirs = parse_key(key.expose()).unwrap();
        for len in 0..=100usize {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let before = now_secs();
            let token = ring.encrypt(&plain);
            assert_eq!(theirs.decrypt(&token).unwrap(), plain, "length {len}");
            let ts = token_timestamp(&token).unwrap();
            assert!(
                ts >= before && ts <= now_secs(),
                "length {len}: stamped {ts}"
            );
            assert!(is_token_shaped(&token), "length {len}");
        }
        let ivs = |ring: &Keyring| -> Vec<[u8; 16]> {
            (0..500)
                .map(|_| {
                    let raw = base64::engine::general_purpose::URL_SAFE
                        .decode(ring.encrypt(b"same"))
                        .unwrap();
                    raw[9..25].try_into().unwrap()
                })
                .collect()
        };
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let ring = std::sync::Arc::clone(&ring);
                std::thread::spawn(move || ivs(&ring))
            })
            .collect();
        let mut all = ivs(&ring);
        for t in threads {
            all.extend(t.join().unwrap());
        }
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "an IV was used twice");
        assert!(all.iter().all(|iv| iv != &[0; 16]));
        println!("{n} tokens from 5 threads (~8 pool refills each): {n} distinct IVs");
    }

    #[test]
    fn roundtrip_and_rotation_order() {
        let a = generate_key();
        let b = generate_key();
        let old = Keyring::new(&a, &[]).unwrap();
        let tok = old.encrypt(b"hello");
        let both = Keyring::new(&b, &[Secret::new(a.expose().to_owned())]).unwrap();
        let (p, idx) = both.decrypt(&tok).unwrap();
        assert_eq!(p.expose(), b"hello");
        assert_eq!(idx, 1);
        let (_, idx) = both.decrypt(&both.encrypt(b"x")).unwrap();
        assert_eq!(idx, 0);
        let only_b = Keyring::new(&b, &[]).unwrap();
        assert_eq!(only_b.decrypt(&tok).unwrap_err(), DecryptError::Invalid);
    }

    #[test]
    fn future_token_is_clock_skew_not_damage() {
        let k = Keyring::new(&generate_key(), &[]).unwrap();
        let tok = k.encrypt_at_time(b"x", now_secs() + 3600);
        assert!(matches!(
            k.decrypt(&tok),
            Err(DecryptError::ClockSkew { ahead_secs, key_index: 0 }) if ahead_secs > 3500
        ));
        // Same token under another key is plain invalid: the skew check authenticates first.
        let other = Keyring::new(&generate_key(), &[]).unwrap();
        assert_eq!(other.decrypt(&tok).unwrap_err(), DecryptError::Invalid);
        // Within the skew window it reads.
        let near = k.encrypt_at_time(b"x", now_secs() + 30);
        assert!(k.decrypt(&near).is_ok());
    }

    #[test]
    fn malformed_is_not_evidence_of_a_wrong_key() {
        let k = Keyring::new(&generate_key(), &[]).unwrap();
        for bad in ["", "   ", "not base64!", "gAAAAA", &"A".repeat(200)] {
            assert_eq!(
                k.decrypt(bad).unwrap_err(),
                DecryptError::Malformed,
                "{bad:?}"
            );
        }
        let mut tok = k.encrypt(b"hello").into_bytes();
        let mid = tok.len() / 2;
        tok[mid] = if tok[mid] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tok).unwrap();
        assert_eq!(k.decrypt(&tampered).unwrap_err(), DecryptError::Invalid);
        let other = Keyring::new(&generate_key(), &[]).unwrap();
        assert_eq!(
            other.decrypt(&k.encrypt(b"x")).unwrap_err(),
            DecryptError::Invalid
        );
        assert_eq!(
            k.decrypt(&k.encrypt(b"x")[..60]).unwrap_err(),
            DecryptError::Malformed
        );
    }

    #[test]
    fn parse_key_rules() {
        assert!(parse_key(generate_key().expose()).is_some());
        assert!(parse_key("short").is_none());
        assert!(parse_key(&format!("{}=", "A".repeat(43))).is_some());
        assert!(parse_key(&"A".repeat(44)).is_none()); // 33 bytes, not 32
        assert!(parse_key(&"!".repeat(44)).is_none());
    }

    #[test]
    fn keyring_debug_shows_fingerprints_only() {
        let key = generate_key();
        let k = Keyring::new(&key, &[]).unwrap();
        let dbg = format!("{k:?}");
        assert!(!dbg.contains(key.expose()));
        assert!(dbg.contains(&fingerprint(&key)));
    }
}
