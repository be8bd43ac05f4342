//! The spread of the installer's timers (token renewals, the datastore
//! watch's length), so that a cluster's nodes do not all act at once.

use std::time::SystemTime;

/// A number in [0, 1) that differs between processes and calls.
pub fn jitter() -> f64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let mixed =
        u64::from(nanos).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(std::process::id());
    (mixed >> 11) as f64 / (1u64 << 53) as f64
}
