//! Secret values: never `Clone`, `Debug` prints `Secret(**)`, no `Display` or `Serialize`,
//! zeroized on drop. Reaching the value takes an explicit, greppable `expose()`.

use std::fmt;
use zeroize::Zeroizing;

/// A secret string (a credential value, a key in text form).
pub struct Secret(Zeroizing<String>);

impl Secret {
    /// Take ownership of `value`; its buffer is zeroized when the `Secret` is dropped.
    pub fn new(value: String) -> Self {
        Secret(Zeroizing::new(value))
    }

    /// The secret text. Call sites are where secrets leave the type; keep them few.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Length in bytes (safe to show).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(**)")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret::new(s)
    }
}

/// Secret bytes (decrypted plaintext), zeroized on drop.
pub struct SecretBytes(Zeroizing<Vec<u8>>);

impl SecretBytes {
    /// Take ownership of `bytes`.
    pub fn new(bytes: Vec<u8>) -> Self {
        SecretBytes(Zeroizing::new(bytes))
    }

    /// The bytes.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBytes({} bytes, **)", self.0.len())
    }
}

impl Secret {
    /// Move the text out (into a structure that zeroizes it itself, such as a credential).
    pub(crate) fn into_string(mut self) -> String {
        std::mem::take(&mut *self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_redacted() {
        let s = Secret::new("sk-live-very-secret".into());
        assert_eq!(format!("{s:?}"), "Secret(**)");
        let b = SecretBytes::new(b"sk-live-very-secret".to_vec());
        assert!(!format!("{b:?}").contains("secret"));
    }
}
