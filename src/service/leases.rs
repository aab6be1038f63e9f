//! Refresh leases: one client at a time refreshes a credential (an OAuth token, say) while the
//! others wait for its write or for the lease to end, instead of all refreshing at once.

use super::*;

/// A refresh lease: one client may refresh a credential; others wait for its write.
#[derive(Debug, Clone)]
pub(super) struct Lease {
    pub(super) id: u64,
    pub(super) conn: u64,
    pub(super) expires: Instant,
}

/// What `cred.refresh_lease` answers.
#[derive(Debug, Clone, Serialize)]
pub struct LeaseAnswer {
    /// Whether this client holds the lease now.
    pub granted: bool,
    /// The lease (when granted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<u64>,
    /// Milliseconds until the lease expires (granted), or until the holder's does (not).
    pub expires_in_ms: u64,
}

impl Daemon {
    /// Ask for the refresh lease on `(store, id)` for connection `conn`. `None`: the connection
    /// already holds [`MAX_LEASES_PER_CONNECTION`] leases.
    pub fn refresh_lease(
        &self,
        store: &str,
        id: &str,
        conn: u64,
        ttl: Duration,
    ) -> Option<LeaseAnswer> {
        let now = Instant::now();
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        leases.retain(|_, l| l.expires > now);
        let key = (store.to_owned(), id.to_owned());
        if let Some(l) = leases.get(&key) {
            if l.conn != conn {
                return Some(LeaseAnswer {
                    granted: false,
                    lease_id: None,
                    expires_in_ms: millis(l.expires - now),
                });
            }
        } else if leases.values().filter(|l| l.conn == conn).count() >= MAX_LEASES_PER_CONNECTION {
            return None;
        }
        let lease = Lease {
            id: self.next_lease.fetch_add(1, Ordering::Relaxed),
            conn,
            expires: now + ttl,
        };
        let answer = LeaseAnswer {
            granted: true,
            lease_id: Some(lease.id),
            expires_in_ms: millis(ttl),
        };
        leases.insert(key, lease);
        Some(answer)
    }

    /// Release the lease on `(store, id)` if `conn` holds it. `wrote`: the holder wrote the
    /// credential (watchers hear `cred.changed` instead); otherwise waiters hear
    /// `lease.released`. Returns whether a lease was released.
    pub fn release_lease(&self, store: &str, id: &str, conn: u64, wrote: bool) -> bool {
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (store.to_owned(), id.to_owned());
        if leases.get(&key).is_none_or(|l| l.conn != conn) {
            return false;
        }
        leases.remove(&key);
        drop(leases);
        if !wrote {
            self.lease_event(store, id, "released");
        }
        true
    }

    /// Drop every lease a closing connection holds, telling waiters.
    pub fn release_connection(&self, conn: u64) {
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        let mine: Vec<(String, String)> = leases
            .iter()
            .filter(|(_, l)| l.conn == conn)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &mine {
            leases.remove(k);
        }
        drop(leases);
        for (store, id) in mine {
            self.lease_event(&store, &id, "holder_disconnected");
        }
    }

    pub(super) fn lease_event(&self, store: &str, id: &str, source: &'static str) {
        let _ = self.events.send(CredEvent {
            kind: "lease.released",
            store: store.to_owned(),
            id: id.to_owned(),
            generation: None,
            source,
        });
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
